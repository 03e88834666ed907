"""``headscope circuit``: its options are the fields of
:class:`~headscope.apps.settings.CircuitSettings` (:mod:`headscope.cli.options`), plus the
task, the scan read beside it, where the run goes and how loud it is. Wiring only: the work and
every check are :func:`headscope.apps.circuit_run.circuit_to_dir`'s."""

from __future__ import annotations

import click

from headscope.apps.settings import CircuitSettings
from headscope.cli.options import config_from, config_options, figure_format_option


@click.command(
    epilog="Example: headscope circuit smollm2-135m --task ioi --out runs/ioi-circuit (IOI: the "
    "name movers, S-inhibition, induction and previous-token heads, each by its rule). "
    "headscope circuit smollm2-135m --task pairs.jsonl --receivers logits,L20H1.k@S1+1 "
    "--out runs/mine. Measured on 2 shared CPU cores: all 270 SmolLM2 heads into the logits over "
    "32 pairs about 150 s; the whole IOI run about 40 min."
)
@click.argument("model_name", metavar="MODEL")
@click.option(
    "--task",
    "task",
    required=True,
    metavar="KIT|FILE",
    help="A built-in kit (ioi, capital, pronoun, copy_name) or a .jsonl / .tsv file of prompt "
    "pairs.",
)
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=True, dir_okay=True),
    help="Run directory to write.",
)
@config_options(CircuitSettings)
@click.option(
    "--scan",
    "scan",
    type=click.Path(),
    default=None,
    metavar="RUN_DIR",
    help="A `headscope scan` run of the same model: the classes read its induction, "
    "duplicate-token, previous-token and (with --effects) copying scores instead of measuring "
    "them.",
)
@click.option(
    "--force", is_flag=True, help="Replace an existing circuit run (never any other folder)."
)
@click.option("--no-figures", is_flag=True, help="Skip the diagram and agreement figures.")
@figure_format_option
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def circuit(model_name, task, out, scan, force, no_figures, figure_format, quiet, **settings):
    """Which attention head of MODEL feeds which on a task: path patching, composition, classes.

    Each sender head's output, taken from the corrupt prompt of a pair, reaches only one receiver
    (the logits, or one head's query, key or value input) with every other head frozen; the
    effect is the share of the metric's clean-corrupt gap it destroys, with a bootstrap interval
    over pairs. Beside it: Q-, K- and V-composition of every head pair from the weights (z against
    random senders) and how well the two rankings agree.
    """
    from headscope.apps.circuit_run import circuit_to_dir

    config = config_from(CircuitSettings, settings)

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"headscope: {msg}", err=True)

    result = circuit_to_dir(
        model_name,
        task,
        out,
        config,
        scan=scan,
        force=force,
        figures=not no_figures,
        say=say,
        figure_formats=figure_format,
    )
    click.echo(summary(result, out))


def summary(result, out) -> str:
    """What ``headscope circuit`` prints: the baseline, each receiver's top senders, the classes."""
    b = result.baseline.set_index("prompt")
    lines = [
        f"{result.model} on {result.task}: {int(b['n_pairs'].iloc[0])} pairs, "
        f"metric {result.metric}"
    ]
    for p in b.index:
        lines.append(
            f"  {p:<16} {b.loc[p, 'mean']:+.3f} "
            f"[{b.loc[p, 'ci_low']:+.3f}, {b.loc[p, 'ci_high']:+.3f}]"
        )
    t = result.path[result.path["estimator"] == "exact"]
    for receiver, sub in t.groupby("receiver", sort=False):
        top = sub.reindex(sub["effect"].abs().sort_values(ascending=False).index).head(3)
        heads = ", ".join(
            f"{r.sender} {r.effect:+.2f} [{r.ci_low:+.2f}, {r.ci_high:+.2f}]"
            for r in top.itertuples()
        )
        lines.append(f"  into {receiver}: {heads}")
    if result.classes is not None:
        for cls, sub in result.classes[result.classes["class"] != ""].groupby("class", sort=False):
            lines.append(f"  {cls}: {', '.join(sub['head_name'])}")
    lines.append(f"wrote {out}/ (path.csv, composition.csv, report.html)")
    return "\n".join(lines)
