"""``headscope plot``: a saved run's figures drawn again (wiring only: :mod:`headscope.apps.redraw`)."""

from __future__ import annotations

import click


@click.command()
@click.argument("run_dir", type=click.Path())
@click.option("--out", type=click.Path(), default=None,
              help="Directory for the figures. [default: RUN_DIR]")
def plot(run_dir, out) -> None:
    """Redraw every figure of a saved run from its scores.csv (no model is loaded)."""
    from headscope.apps.redraw import redraw

    for path in redraw(run_dir, out):
        click.echo(str(path))
