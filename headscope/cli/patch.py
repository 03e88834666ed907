"""``headscope patch``: its options are the fields of
:class:`~headscope.apps.settings.PatchSettings` (:mod:`headscope.cli.options`), plus the task, the
scan read beside it, where the run goes and how loud it is. Wiring only: the work and every check
are :func:`headscope.apps.patch.patch_to_dir`'s."""

from __future__ import annotations

import click

from headscope.apps.settings import PatchSettings
from headscope.cli.options import (
    config_from,
    config_options,
    out_option,
    run_options,
    say_to_stderr,
    task_options,
)


@click.command(
    epilog="Example: headscope patch smollm2-135m --task ioi --activations z,v --positions "
    'all,S2,END --out runs/ioi. A task file is JSONL ({"clean", "corrupt", "answer", '
    '"wrong"[, "positions"]} a line) or TSV with a header clean, corrupt, answer, wrong.'
)
@click.argument("model_name", metavar="MODEL")
@task_options(
    "A `headscope scan` run of the same model: its pattern scores go beside each head's effect."
)
@out_option(required=True)
@config_options(PatchSettings)
@run_options("patching run", figures="the heatmap files")
def patch(model_name, task, out, scan, force, no_figures, figure_format, quiet, **settings) -> None:
    """Patch every attention head of MODEL between clean and corrupt prompts; write a run directory.

    MODEL is any model `headscope scan` takes (a decoder with an LM head). Each head's output (and,
    with --activations, its query, key, value or pattern) is patched from one prompt of a pair into
    the other; the effect is the share of the metric's clean-corrupt gap restored (denoising) or
    destroyed (noising), with a bootstrap interval over pairs.
    """
    from headscope.apps.patch import patch_to_dir
    from headscope.report.tables import task_summary

    config = config_from(PatchSettings, settings)
    result = patch_to_dir(
        model_name, task, out, config, scan=scan, force=force, figures=not no_figures,
        say=say_to_stderr(quiet), figure_formats=figure_format,
    )  # fmt: skip
    click.echo(task_summary(result, out))
