"""``headscope show``: one head's (or one layer's) pattern on a text (wiring only:
:mod:`headscope.apps.show`)."""

from __future__ import annotations

import click

from headscope.cli.options import figure_format_option

#: The default text (apps.show.DEFAULT_TEXT, repeated so that --help loads nothing heavy; a test
# checks).
DEFAULT_TEXT = "The river bank flooded after the storm, and the path was closed."


@click.command()
@click.argument("model_name", metavar="MODEL")
@click.option(
    "--head",
    "head_spec",
    default=None,
    metavar="L.H",
    help="Layer and head, 0-based, e.g. 3.2 (L3H2 also works).",
)
@click.option(
    "--layer",
    type=int,
    default=None,
    metavar="L",
    help="Every head of layer L (0-based) side by side, instead of one --head.",
)
@click.option(
    "--text", default=None, help=f"The text to run the model on. [default: {DEFAULT_TEXT!r}]"
)
@click.option(
    "--out",
    type=click.Path(),
    default=None,
    help="Figure to write (.png, .svg or .pdf; with --figure-format, its name in each "
    "format). [default: ./<model>-L<L>H<H>.png, or ./<model>-L<L>.png]",
)
@figure_format_option
@click.option(
    "--html",
    "html_view",
    is_flag=True,
    help="Also write an interactive, self-contained HTML view next to the figure.",
)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N or mps.")
@click.option(
    "--dtype",
    default=None,
    help="Model weights dtype: float32, bfloat16 or float16. [default: float32]",
)
def show(model_name, head_spec, layer, text, out, figure_format, html_view, device, dtype) -> None:
    """Draw one head's attention pattern on a text (query rows, key columns), or every head of a
    layer.

    \b
    headscope show smollm2-135m --head 17.4 --text "A B C D A B C D" --html
    headscope show smollm2-135m --layer 17 --text "A B C D A B C D" --html
    """
    from headscope.apps.show import show_head, show_layer
    from headscope.errors import HeadscopeError

    text = DEFAULT_TEXT if text is None else text
    if (head_spec is None) == (layer is None):
        raise HeadscopeError(
            "Give exactly one of --head L.H (one head) or --layer L (every head of a layer), "
            "e.g. --head 17.4 or --layer 17."
        )
    say = lambda msg: click.echo(f"headscope: {msg}", err=True)  # noqa: E731
    which = (show_layer, layer) if layer is not None else (show_head, head_spec)
    paths = which[0](
        model_name, which[1], text, out, html_view=html_view, device=device, dtype=dtype,
        progress=say, figure_formats=figure_format,
    )  # fmt: skip
    for path in paths:
        click.echo(str(path))
