"""``headscope plot``: a saved run's figures drawn again (wiring only:
:mod:`headscope.apps.redraw`)."""

from __future__ import annotations

import click

from headscope.cli.options import figure_format_option


@click.command()
@click.argument("run_dir", type=click.Path())
@click.option(
    "--out", type=click.Path(), default=None, help="Directory for the figures. [default: RUN_DIR]"
)
@figure_format_option
def plot(run_dir, out, figure_format) -> None:
    """Redraw every figure of a saved run from its scores.csv (no model is loaded), in the formats
    the run has (png unless it was scanned with --figure-format) or those given."""
    from headscope.apps.redraw import redraw

    for path in redraw(run_dir, out, figure_format):
        click.echo(str(path))
