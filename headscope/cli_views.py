"""``headscope show``, ``plot``, ``report`` and ``compare``: wiring only (the work and every check
are in views.py, rundir.py, html_report.py and compare.py).

Standalone click commands, registered on the main group with ``main.add_command(...)``; the group
turns :class:`~headscope.errors.HeadscopeError` into one line on stderr and exit code 2. Paths
written go to stdout, one a line; progress goes to stderr.
"""

from __future__ import annotations

import click

from headscope.sources import DTYPE_NAMES
from headscope.views import DEFAULT_TEXT


@click.command()
@click.argument("model_name", metavar="MODEL")
@click.option("--head", "head_spec", default=None, metavar="L.H",
              help="Layer and head, 0-based, e.g. 3.2 (L3H2 also works).")
@click.option("--layer", type=int, default=None, metavar="L",
              help="Every head of layer L (0-based) side by side, instead of one --head.")
@click.option("--text", default=DEFAULT_TEXT, show_default=True, help="The text to run the model on.")
@click.option("--out", type=click.Path(), default=None,
              help="Figure to write (.png, .svg or .pdf). [default: ./<model>-L<L>H<H>.png, or ./<model>-L<L>.png]")
@click.option("--html", "html_view", is_flag=True,
              help="Also write an interactive, self-contained HTML view next to the figure.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N or mps.")
@click.option("--dtype", default=None, help=f"Model weights dtype: {', '.join(DTYPE_NAMES)}. [default: float32]")
def show(model_name, head_spec, layer, text, out, html_view, device, dtype) -> None:
    """Draw one head's attention pattern on a text (query rows, key columns), or every head of a layer.

    \b
    headscope show smollm2-135m --head 17.4 --text "A B C D A B C D" --html
    headscope show smollm2-135m --layer 17 --text "A B C D A B C D" --html
    """
    from headscope.errors import HeadscopeError
    from headscope.views import show_head, show_layer

    if (head_spec is None) == (layer is None):
        raise HeadscopeError("Give exactly one of --head L.H (one head) or --layer L (every head of a layer), "
                             "e.g. --head 17.4 or --layer 17.")
    say = lambda msg: click.echo(f"headscope: {msg}", err=True)  # noqa: E731
    if layer is not None:
        paths = show_layer(model_name, layer, text, out, html_view=html_view, device=device, dtype=dtype, progress=say)
    else:
        paths = show_head(model_name, head_spec, text, out, html_view=html_view, device=device, dtype=dtype,
                          progress=say)
    for path in paths:
        click.echo(str(path))


@click.command()
@click.argument("run_dir", type=click.Path())
@click.option("--out", type=click.Path(), default=None,
              help="Directory for the figures. [default: RUN_DIR]")
def plot(run_dir, out) -> None:
    """Redraw every figure of a saved run from its scores.csv (no model is loaded)."""
    from headscope.rundir import redraw

    for path in redraw(run_dir, out):
        click.echo(str(path))


@click.command()
@click.argument("run_dir", type=click.Path())
@click.option("--out", type=click.Path(), default=None, help="The page to write. [default: RUN_DIR/report.html]")
@click.option("--figures/--no-figures", default=None,
              help="Draw the heatmaps into the page. [default: as the run has them]")
def report(run_dir, out, figures) -> None:
    """Rebuild a saved run's report.html, one self-contained page (no model is loaded)."""
    from headscope.rundir import rebuild_report

    click.echo(str(rebuild_report(run_dir, out, figures)))


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_A RUN_B [RUN ...]")
@click.option("--out", type=click.Path(), default=None,
              help="Directory for compare.csv and the figures. [default: ./compare-<A>-vs-<B>]")
@click.option("--top", type=int, default=None,
              help="Heads per metric to print from the per-head differences. [default: 3]")
def compare(run_dirs, out, top) -> None:
    """Put saved runs (different models, or seeds) side by side.

    Prints, per metric and run, the top head and its own score, the max and mean head score, the
    labelled heads and chance, and, when every run has the same layers x heads, the heads that
    differ most (* marks a difference beyond the runs' bootstrap intervals). Writes compare.csv,
    distributions.png and, for runs of one shape, head_diffs.csv (+ difference.png for two runs).
    """
    from headscope.compare import compare_dirs

    text, paths = compare_dirs(run_dirs, out, **({} if top is None else {"top": top}))
    click.echo(text)
    for path in paths:
        click.echo(str(path))
