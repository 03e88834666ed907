"""``headscope icl``: its options are the fields of :class:`~headscope.apps.settings.IclSettings`
(:mod:`headscope.cli.options`), plus where the run goes and how loud it is. Wiring only: the work
and every check are :func:`headscope.apps.icl.icl_to_dir`'s."""

from __future__ import annotations

import click

from headscope.apps.settings import IclSettings
from headscope.cli.options import (
    config_from,
    config_options,
    out_option,
    run_options,
    say_to_stderr,
)


@click.command(
    epilog="Examples: headscope icl smollm2-135m --out runs/icl. headscope icl gemma3-270m "
    "--tasks antonym,country-capital,present-past --prompts 10 --out runs/icl-small."
)
@click.argument("model_name", metavar="MODEL")
@out_option("ICL run directory to write [default: runs/<model>-icl].")
@config_options(IclSettings)
@run_options("ICL run", "the scatter and the ablation curves")
def icl(model_name, out, force, no_figures, figure_format, quiet, **settings) -> None:
    """Which heads carry in-context learning: every head's function-vector score (Todd et al.
    2024: its mean output over clean few-shot prompts set into prompts with shuffled labels, the
    rise in the answer's probability, averaged over prompts and tasks) beside its induction
    score; their rank correlation and overlap; few-shot accuracy with the top FV, induction or
    random heads mean-ablated (Yin and Steinhardt 2025), on test queries the ranking never saw.
    """
    from headscope.apps.icl import icl_to_dir

    config = config_from(IclSettings, settings)
    out = out or f"runs/{model_name.rstrip('/').split('/')[-1]}-icl"
    path = icl_to_dir(
        model_name,
        out,
        config,
        force=force,
        figures=not no_figures,
        figure_formats=figure_format or ("png",),
        say=say_to_stderr(quiet),
    )
    click.echo(f"wrote {path}/")
