"""A head census of one model, written as a run directory (published whole: all of it, or nothing).

``census_to_dir(MODEL, OUT, settings)`` checks everything it can before the model loads (the
settings, ``OUT``, spaCy for the syntax part), loads the model, checks what needs it (a tokenizer
that maps words to tokens, a readout), runs the parts (:mod:`headscope.census`) and writes::

    OUT/
      scores.csv              one row per (score, layer, head): model, metric, probe, layer, head,
                              head_name, score, chance, n, label, null, ci_low, ci_high (+ null_q95,
                              chance_ties where they exist); every name in headscope.catalog.CENSUS
      syntax_table.csv        Clark's table: relation, direction, count, best head, accuracy and its
                              interval, best offset, its accuracy, the difference and its interval
      syntax_heads.csv        every head's accuracy per (relation, direction), with its interval
      syntax_sentences.jsonl  sentences scored: token ids, words, word token spans, silver parses
      noop_sequences.csv      per metric (no-op effect, its weight, the mean ablation), text
                              sequence and head: the total and count each row of scores.csv is
                              pooled from (score = sum total / sum count), to resample any
                              statistic of the heads by sequence (joint_interval in
                              analyses/lib/controls.py)
      tokens.jsonl            the text and repeat probes' token ids
      summary.md              the tables a reader sees first (the SILVER note by the syntax table)
      *.png, report.html      heatmaps and the page (a figure or page that fails costs only itself)
      metadata.json           model, source, sha256, parser (version, sha256, licence, UAS/LAS),
                              corpus, settings, seed, versions, timings, files (written last)

``--force`` follows a scan's rules (:func:`headscope.rundir.store.check_out_dir`): it replaces
only a headscope run directory (a scan's or a census's) holding nothing headscope did not write.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from headscope.apps.settings import CensusSettings
from headscope.models.placement import threads
from headscope.result import COLUMNS, model_slug, timed
from headscope.rundir.kinds import CENSUS
from headscope.rundir.record import run_record
from headscope.rundir.store import REPORT, check_out_dir, write_csv, write_run


def default_out(model) -> Path:
    """Where ``headscope census MODEL`` writes without ``--out``: ``runs/<model slug>-census``."""
    name = model if isinstance(model, str) else getattr(model, "name", "model")
    return Path("runs") / f"{model_slug(name)}-census"


def check_before_loading(settings: CensusSettings, out: str | Path, force: bool) -> Path:
    """What needs no model: ``OUT`` may be written, and spaCy is there when the syntax part runs."""
    out = check_out_dir(out, force, CENSUS)
    if "syntax" in settings.parts:
        from headscope.probes.parser import require_spacy

        require_spacy()
    return out


def check_model(model, settings: CensusSettings) -> None:
    """What needs the model, before any work: word maps need character offsets; a readout that
    the model has (an encoder has no trained unembedding)."""
    if "syntax" in settings.parts:
        from headscope.probes.words import check_offsets

        check_offsets(model)
    if settings.readout == "unembedding" and {"successor", "copy_suppression"} & set(
        settings.parts
    ):
        from headscope.circuits.ov import readout

        readout(model, "unembedding")  # one line for an encoder
    if "successor" in settings.parts and (settings.readout != "auto" or model.causal):
        from headscope.circuits.successor import ordinal_sets

        ordinal_sets(
            model
        )  # one line when no ordinal set has a (t, successor) pair of single tokens


def census_to_dir(
    model_name, out: str | Path | None = None, settings: CensusSettings | None = None, **options
) -> Path:
    """Load ``model_name`` (a name, a folder, or a :class:`~headscope.models.model.Model`) and run
    :func:`census` into ``out`` (default :func:`default_out`; ``options``: :func:`census`'s
    keywords); every check comes before the work."""
    settings = settings or CensusSettings()
    out = Path(out) if out is not None else default_out(model_name)
    check_before_loading(settings, out, options.get("force", False))
    with threads(settings.threads):
        model = model_name
        if isinstance(model_name, str):
            from headscope.models.loading import load_model

            model = load_model(
                model_name,
                device=settings.device,
                dtype=settings.dtype,
                progress=options.get("say"),
            )
        return census(model, out, settings, **options)


def census(
    model,
    out: str | Path,
    settings: CensusSettings | None = None,
    *,
    force: bool = False,
    figures: bool = True,
    figure_formats: Sequence[str] = ("png",),
    say: Callable[[str], None] | None = None,
) -> Path:
    """Run the census parts of ``settings`` on ``model`` and publish ``out`` whole (see the module
    docstring). Bad input (an ``out`` that may not be written, spaCy or its pipeline missing, a
    tokenizer without offsets, no ordinal set of single tokens) is one line, and nothing is left."""
    from headscope.census import PARTS, SEQUENCES_FILE, Context, per_sequence_table
    from headscope.probes.pairs import repeat_probe, text_probe

    settings = settings or CensusSettings()
    say = say or (lambda _m: None)
    started = time.perf_counter()
    out = check_before_loading(settings, out, force)
    check_model(model, settings)
    st = settings
    text = text_probe(model, n_prompts=st.n_prompts)
    rep = repeat_probe(
        model, repeat_len=st.repeat_len, n_sequences=st.repeat_sequences, seed=st.seed
    )
    ctx = Context(model, st, text, rep, say, summary=[f"# Head census of {model.name}", ""])
    timings: dict[str, float] = {}
    scored: list[dict] = []
    for part in st.parts:  # every part runs before anything is written
        with timed(timings, f"{part}_s"):
            say(f"census: {part}")
            scored += PARTS[part](ctx)
    frame = pd.DataFrame(scored)
    frame = frame[COLUMNS + [c for c in frame.columns if c not in COLUMNS]]

    def tables(tmp: Path) -> None:
        write_csv(frame, tmp / "scores.csv")
        tables = dict(ctx.tables)
        if ctx.sequences:
            tables[SEQUENCES_FILE] = per_sequence_table(ctx.sequences)
        for name, table in tables.items():
            write_csv(table, tmp / name)
        for name, write in ctx.files.items():
            write(tmp / name)
        with open(tmp / "tokens.jsonl", "w") as f:
            for p in (text, rep):
                for i, ids in enumerate(p.sequences):
                    rec = {"probe": p.name, "index": i, "token_ids": [int(t) for t in ids]}
                    if p.repeat_len is not None:
                        rec["repeat_len"] = p.repeat_len
                    f.write(json.dumps(rec) + "\n")
        (tmp / "summary.md").write_text("\n".join(ctx.summary) + "\n")

    record = run_record(
        model,
        st,
        command="census",
        probes={p.name: {**p.settings, "n_sequences": len(p)} for p in (text, rep)},
        **ctx.meta,
        timings=timings,
    )
    write_run(
        out,
        CENSUS,
        tables,
        record,
        force=force,
        figures=(lambda tmp: save_census_figures(frame, tmp, figure_formats)) if figures else None,
        page=lambda tmp: write_page(tmp, figures),
        say=say,
        started=started,
    )
    return out


def save_census_figures(
    scores: pd.DataFrame, out: Path, formats: Sequence[str] = ("png",)
) -> list[Path]:
    """One heatmap per census score that has rows (the page's list,
    :data:`headscope.report.census_page.HEATMAPS`), and the no-op scatter, each as every file of
    ``formats`` (png, svg, pdf; the page's figures are inline PNGs whatever they are)."""
    from headscope.files import save_figure
    from headscope.report.census_page import census_figures

    written = []
    for name, fig in census_figures(scores):
        written.append(save_figure(fig, out / f"{name}.png", formats=formats))
    return written


def write_page(run_dir: Path, figures: bool) -> None:
    from headscope.report.census_page import census_html

    (run_dir / REPORT).write_text(census_html(run_dir, figures=figures), encoding="utf-8")


def load_census(run_dir: str | Path) -> dict:
    """A census run directory read back: ``{"scores", "metadata", "syntax_table",
    "noop_sequences"}`` (the last two None when the run has none)."""
    from headscope.report.census_page import read_census

    return read_census(Path(run_dir))
