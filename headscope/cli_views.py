"""``headscope show``, ``plot`` and ``compare``: wiring only (the work is in views.py, plots.py, compare.py).

Standalone click commands, registered on the main group with ``main.add_command(...)``; the group
turns :class:`~headscope.errors.HeadscopeError` into one line on stderr and exit code 2. Paths
written go to stdout, one a line; progress goes to stderr.
"""

from __future__ import annotations

from pathlib import Path

import click

DEFAULT_TEXT = "The river bank flooded after the storm, and the path was closed."


@click.command()
@click.argument("model_name", metavar="MODEL")
@click.option("--head", "head_spec", required=True, metavar="L.H",
              help="Layer and head, 0-based, e.g. 3.2 (L3H2 also works).")
@click.option("--text", default=DEFAULT_TEXT, show_default=True, help="The text to run the model on.")
@click.option("--out", type=click.Path(), default=None,
              help="Figure to write (.png, .svg or .pdf). [default: ./<model>-L<L>H<H>.png]")
@click.option("--html", "html_view", is_flag=True,
              help="Also write an interactive, self-contained HTML view next to the figure.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N or mps.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Model weights dtype.")
def show(model_name, head_spec, text, out, html_view, device, dtype) -> None:
    """Draw one head's attention pattern on a text (query rows, key columns).

    \b
    headscope show smollm2-135m --head 17.4 --text "A B C D A B C D" --html
    """
    from headscope.views import check_figure_path, parse_head

    # Mistakes that need no model fail before it loads (seconds); the head's range is checked after.
    parse_head(head_spec)
    if out is not None:
        check_figure_path(out)
    if not text.strip():
        from headscope.errors import HeadscopeError

        raise HeadscopeError("--text is empty; give a sentence, e.g. --text 'The river bank flooded'.")

    from headscope.models import load_model
    from headscope.views import default_out_path, head_pattern, write_views

    model = load_model(model_name, device=device, dtype=dtype,
                       progress=lambda msg: click.echo(f"headscope: {msg}", err=True))
    layer, head = parse_head(head_spec, model.n_layers, model.n_heads)
    hp = head_pattern(model, text, layer, head)
    for path in write_views(hp, out or default_out_path(model_name, layer, head), html_view=html_view):
        click.echo(str(path))


@click.command()
@click.argument("run_dir", type=click.Path())
@click.option("--out", type=click.Path(), default=None,
              help="Directory for the figures. [default: RUN_DIR]")
def plot(run_dir, out) -> None:
    """Redraw every figure of a saved run from its scores.csv (no model is loaded)."""
    from headscope.compare import check_out_dir, read_run
    from headscope.plots import save_figures

    run = read_run(run_dir)
    target = check_out_dir(out or run_dir)
    target.mkdir(parents=True, exist_ok=True)
    # n per probe, for the titles: tokens.jsonl when the run has it, else metadata.json.
    n_sequences = {p.name: len(p) for p in run.probes} or {
        name: s.get("n_sequences") for name, s in run.metadata.get("probes", {}).items()}
    for path in save_figures(run.scores, target, n_sequences=n_sequences):
        click.echo(str(path))


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_A RUN_B [RUN ...]")
@click.option("--out", type=click.Path(), default=None,
              help="Directory for compare.csv and the figures. [default: ./compare-<A>-vs-<B>]")
@click.option("--top", type=int, default=3, show_default=True,
              help="Heads per metric to print from the per-head differences.")
def compare(run_dirs, out, top) -> None:
    """Put saved runs (different models, or seeds) side by side.

    Prints, per metric and run, the max and mean head score, the labelled heads and chance, and,
    when every run has the same layers x heads, the heads that differ most. Writes compare.csv,
    distributions.png and, for runs of one shape, head_diffs.csv (+ difference.png for two runs).
    """
    from headscope.compare import (
        check_out_dir,
        format_differences,
        format_summary,
        head_differences,
        load_runs,
        same_shape,
        summary,
        write_comparison,
    )
    from headscope.errors import HeadscopeError
    from headscope.result import model_slug

    if top < 0:
        raise HeadscopeError(f"--top must be 0 or more, got {top}.")
    runs = load_runs(run_dirs)
    labels = list(runs)
    if out is None:
        name = "-vs-".join(model_slug(la) for la in labels) if len(labels) <= 3 else f"{len(labels)}-runs"
        out = Path(f"compare-{name}")
    check_out_dir(out)  # before anything is printed
    click.echo(format_summary(summary(runs)))
    if same_shape(runs):
        if top:
            click.echo(format_differences(head_differences(runs, k=top), labels, k=top))
    else:
        click.echo("runs differ in layers x heads: no per-head differences.")
    for path in write_comparison(runs, out):
        click.echo(str(path))
