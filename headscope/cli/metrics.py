"""``headscope metrics``: every score a run can hold and what it means (from the catalog: no
torch)."""

from __future__ import annotations

import click


@click.command()
def metrics() -> None:
    """List the scores a run can hold (pattern metrics, then --effects' circuit scores and
    effects)."""
    from headscope.catalog import describe, names

    w = max(len(n) for n in names())
    click.echo(f"{'metric':<{w}} {'probe':<7} {'label (threshold)':<42} definition")
    for name in names():
        m = describe(name)
        rule = (
            f"{m.label} ({'<=' if m.below else '>='} {m.threshold:g})"
            if m.label
            else "(not labelled)"
        )
        click.echo(f"{name:<{w}} {m.probe:<7} {rule:<42} {m.definition}")
