"""``headscope compare``: saved runs side by side (wiring only: :mod:`headscope.apps.compare`)."""

from __future__ import annotations

import click

from headscope.cli.options import figure_format_option


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_A RUN_B [RUN ...]")
@click.option(
    "--out",
    type=click.Path(),
    default=None,
    help="Directory for compare.csv and the figures. [default: ./compare-<A>-vs-<B>]",
)
@click.option(
    "--top",
    type=int,
    default=None,
    help="Heads per metric to print from the per-head differences. [default: 3]",
)
@figure_format_option
def compare(run_dirs, out, top, figure_format) -> None:
    """Put saved runs (different models, or seeds) side by side.

    Prints, per metric and run, the top head and its own score, the max and mean head score, the
    labelled heads and chance, and, when every run has the same layers x heads, the heads that
    differ most (* marks a difference beyond the runs' bootstrap intervals). Writes compare.csv,
    distributions.png and, for runs of one shape, head_diffs.csv (+ difference.png for two runs).
    """
    from headscope.apps.compare import compare_dirs

    text, paths = compare_dirs(
        run_dirs,
        out,
        **({} if top is None else {"top": top}),
        figure_formats=figure_format or ("png",),
    )
    click.echo(text)
    for path in paths:
        click.echo(str(path))
