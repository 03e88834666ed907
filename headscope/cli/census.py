"""``headscope census``: the literature's head types on one model. Its options are the fields of
:class:`~headscope.apps.settings.CensusSettings`; the work is
:func:`headscope.apps.census.census_to_dir`."""

from __future__ import annotations

import click

from headscope.apps.settings import CensusSettings
from headscope.cli.options import (
    config_from,
    config_options,
    out_option,
    run_options,
    say_to_stderr,
)


@click.command(
    epilog="Quick look (all-minilm-l6-v2 on 2 CPU cores, about 10 minutes): headscope census "
    "all-minilm-l6-v2 --out runs/minilm-census. The syntax part needs spaCy: "
    "pip install 'headscope[syntax]'."
)
@click.argument("model_name", metavar="MODEL")
@out_option("Run directory to write. [default: runs/<model>-census]")
@config_options(CensusSettings)
@run_options("run directory")
def census(model_name, out, force, no_figures, figure_format, quiet, **settings) -> None:
    """Score MODEL's heads for the literature's head types: syntax heads (Clark et al. 2019, on
    silver parses), the [SEP] / BOS no-op test, successor heads (Gould et al. 2023), copy
    suppression (McDougall et al. 2023) and rare-word heads (Voita et al. 2019).

    Writes scores.csv, syntax_table.csv, syntax_heads.csv, syntax_sentences.jsonl, tokens.jsonl,
    summary.md, heatmaps, report.html and metadata.json to --out, and prints summary.md.
    """
    from headscope.apps.census import census_to_dir, default_out

    config = config_from(CensusSettings, settings)
    target = census_to_dir(
        model_name,
        out or default_out(model_name),
        config,
        force=force,
        figures=not no_figures,
        figure_formats=figure_format or ("png",),
        say=say_to_stderr(quiet),
    )
    click.echo((target / "summary.md").read_text())
    click.echo(f"wrote {target}/")
