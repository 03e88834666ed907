"""``headscope qk``: its options are the fields of :class:`~headscope.apps.settings.QKSettings`
(:mod:`headscope.cli.options`), plus where the run goes and how loud it is. Wiring only: the work
and every check are :func:`headscope.apps.qk.qk_to_dir`'s."""

from __future__ import annotations

import click

from headscope.apps.settings import QKSettings
from headscope.cli.options import (
    config_from,
    config_options,
    out_option,
    run_options,
    say_to_stderr,
)


@click.command(
    epilog="Examples: headscope qk smollm2-135m --heads L18H6 --key induction --query all --out "
    "runs/qk-induction. headscope qk smollm2-135m --task ioi --heads L23H3 --query END --key IO "
    "--out runs/qk-ioi. headscope qk gpt2-small --text 'When Mary and John went' --heads L5H1."
)
@click.argument("model_name", metavar="MODEL")
@out_option("QK run directory to write [default: runs/<model>-qk].")
@config_options(QKSettings)
@run_options("QK run", "the component maps")
def qk(model_name, out, force, no_figures, figure_format, quiet, **settings) -> None:
    """Why each head attends where it does: its attention logit at chosen query and key
    positions split over pairs of components (the embedding, every earlier head's output, every
    earlier MLP's output, biases), one on the query side and one on the key side, with the
    norms frozen at the run's values; averaged over prompts with intervals, beside the same pairs
    at keys the head does not pick (the null), the top pairs' components knocked out exactly.
    """
    from headscope.apps.qk import qk_to_dir

    config = config_from(QKSettings, settings)
    out = out or f"runs/{model_name.rstrip('/').split('/')[-1]}-qk"
    path = qk_to_dir(
        model_name,
        out,
        config,
        force=force,
        figures=not no_figures,
        figure_formats=figure_format or ("png",),
        say=say_to_stderr(quiet),
    )
    click.echo(f"wrote {path}/")
