"""``headscope engines``: the engines in the order ``--engine auto`` tries them."""

from __future__ import annotations

import click


@click.command()
def engines() -> None:
    """List the engines, in the order --engine auto tries them."""
    from headscope.engines.registry import engine_names, get_engine

    for name in engine_names():
        click.echo(f"{name:<8} {get_engine(name).summary}")
