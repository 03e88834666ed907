"""``headscope metrics``: every score a run can hold and what it means (from the catalog: no
torch)."""

from __future__ import annotations

import click


@click.command()
def metrics() -> None:
    """List every score a run can hold: a scan's pattern metrics, then --effects' circuit scores
    and effects, then the head census's scores (headscope census)."""
    from headscope.catalog import CENSUS, describe, names

    every = names() + [n for n in CENSUS if n not in names()]
    w = max(len(n) for n in every)
    click.echo(f"{'metric':<{w}} {'probe':<7} {'label (threshold)':<42} definition")
    for name in every:
        m = describe(name)
        rule = (
            f"{m.label} ({'<=' if m.below else '>='} {m.threshold:g})"
            if m.label
            else "(not labelled)"
        )
        click.echo(f"{name:<{w}} {m.probe:<7} {rule:<42} {m.definition}")
