"""``headscope report``: a saved run's page built again (wiring only:
:mod:`headscope.apps.redraw`)."""

from __future__ import annotations

import click


@click.command()
@click.argument("run_dir", type=click.Path())
@click.option(
    "--out",
    type=click.Path(),
    default=None,
    help="The page to write. [default: RUN_DIR/report.html]",
)
@click.option(
    "--figures/--no-figures",
    default=None,
    help="Draw the heatmaps into the page. [default: as the run has them]",
)
def report(run_dir, out, figures) -> None:
    """Rebuild a saved run's report.html, one self-contained page (no model is loaded)."""
    from headscope.apps.redraw import rebuild_report

    click.echo(str(rebuild_report(run_dir, out, figures)))
