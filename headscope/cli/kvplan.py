"""``headscope kvplan``: a KV-cache plan from a scan, verified by running the model. Its options are
the fields of :class:`~headscope.apps.settings.PlanSettings`; the work is
:func:`headscope.apps.kvplan.plan_to_dir`."""

from __future__ import annotations

import click

from headscope.apps.settings import PlanSettings
from headscope.cli.options import config_from, config_options, figure_format_option, say_to_stderr


@click.command(
    epilog="Quick look: headscope kvplan smollm2-135m --seq-len 100 --out runs/kv100 "
    "(15 verified conditions; measured at about 13 minutes on 2 CPU cores). At the default "
    "2,048 tokens each condition took 95-131 s on the same machine, about 30 minutes in all "
    "(notebook 06). --seeds 1 runs 9 conditions instead of 15; each prints its time as it finishes."
)
@click.argument("source")
@click.option(
    "--out",
    default=None,
    type=click.Path(),
    help="With a MODEL: the run directory to "
    "scan into [default: runs/<model>-long]. The plan goes to <run>/kvplan/.",
)
@config_options(PlanSettings)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an earlier plan (and, with a MODEL, an earlier run at --out).",
)
@figure_format_option
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def kvplan(source, out, force, figure_format, quiet, **settings) -> None:
    """Choose heads to restrict to a sink + window KV cache, and check each plan by running the
    model.

    SOURCE is a run directory scanned with --long-context (its streaming and retrieval scores choose
    the heads), or a model: a name or a checkpoint folder (scanned first, with --long-context at
    --seq-len, into --out, once the plan's own inputs are known to fit).
    Writes kvplan.csv, kvplan.md, kvplan.json and kvplan.png to <run>/kvplan/.
    """
    from headscope.apps import kvplan as kv

    say = say_to_stderr(quiet)
    config = config_from(PlanSettings, settings)
    df, target = kv.plan_to_dir(
        source, out, config, force=force, say=say, figure_formats=figure_format or ("png",)
    )
    click.echo(kv.summary(df).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    click.echo(f"wrote {target}/ ({', '.join(sorted(p.name for p in target.iterdir()))})")
