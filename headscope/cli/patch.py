"""``headscope patch``: its options are the fields of
:class:`~headscope.apps.settings.PatchSettings` (:mod:`headscope.cli.options`), plus the task, the
scan read beside it, where the run goes and how loud it is. Wiring only: the work and every check
are :func:`headscope.apps.patch.patch_to_dir`'s."""

from __future__ import annotations

import click

from headscope.apps.settings import PatchSettings
from headscope.cli.options import config_from, config_options, figure_format_option


@click.command(
    epilog="Example: headscope patch smollm2-135m --task ioi --activations z,v --positions "
    'all,S2,END --out runs/ioi. A task file is JSONL ({"clean", "corrupt", "answer", '
    '"wrong"[, "positions"]} a line) or TSV with a header clean, corrupt, answer, wrong.'
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
@config_options(PatchSettings)
@click.option(
    "--scan",
    "scan",
    type=click.Path(),
    default=None,
    metavar="RUN_DIR",
    help="A `headscope scan` run of the same model: its pattern scores go beside each head's "
    "effect.",
)
@click.option(
    "--force", is_flag=True, help="Replace an existing patching run (never any other folder)."
)
@click.option("--no-figures", is_flag=True, help="Skip the heatmap files.")
@figure_format_option
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def patch(model_name, task, out, scan, force, no_figures, figure_format, quiet, **settings) -> None:
    """Patch every attention head of MODEL between clean and corrupt prompts; write a run directory.

    MODEL is any model `headscope scan` takes (a decoder with an LM head). Each head's output (and,
    with --activations, its query, key, value or pattern) is patched from one prompt of a pair into
    the other; the effect is the share of the metric's clean-corrupt gap restored (denoising) or
    destroyed (noising), with a bootstrap interval over pairs.
    """
    from headscope.apps.patch import patch_to_dir

    config = config_from(PatchSettings, settings)

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"headscope: {msg}", err=True)

    result = patch_to_dir(
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
    """What ``headscope patch`` prints: the baseline and the top heads of each slice."""
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
    t = result.table
    named = t[~t["position"].astype(str).str.isdigit()]
    for (act, mode, direction, position), sub in named.groupby(
        ["activation", "kv_mode", "direction", "position"], sort=False
    ):
        est = "exact" if (sub["estimator"] == "exact").any() else "attribution"
        sub = sub[sub["estimator"] == est]
        top = sub.reindex(sub["effect"].abs().sort_values(ascending=False).index).head(3)
        kv = f" ({mode})" if act in ("k", "v") else ""
        heads = ", ".join(
            f"{r.head_name} {r.effect:+.2f} [{r.ci_low:+.2f}, {r.ci_high:+.2f}]"
            for r in top.itertuples()
        )
        lines.append(f"  {act}{kv} {direction} at {position} ({est}): {heads}")
    lines.append(f"wrote {out}/ (patching.csv, report.html)")
    return "\n".join(lines)
