"""``headscope plot`` and ``headscope report``: a saved run's figures and page drawn again from its
files, without the model (:mod:`headscope.report` draws; this decides where the files go)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from headscope.errors import HeadscopeError
from headscope.files import FIGURE_FORMATS, check_replaceable, figure_formats, write_atomic
from headscope.report.figures import figure_names, save_figures
from headscope.report.html import report_html
from headscope.rundir.store import REPORT, is_run_dir, load_run


def run_figure_formats(run) -> tuple[str, ...]:
    """The formats a saved run's figures were written in (its ``metadata.json`` files; else png)."""
    files = set(run.metadata.get("files") or [])
    stems = {n.rsplit(".", 1)[0] for n in figure_names(run.scores)}
    found = [f for f in FIGURE_FORMATS if any(f"{stem}.{f}" in files for stem in stems)]
    return tuple(found) or ("png",)


def redraw(
    run_dir: str | Path, out: str | Path | None = None, formats: Sequence[str] | None = None
) -> list[Path]:
    """``headscope plot``: redraw every figure of a saved run from its ``scores.csv``, without the
    model.

    ``out`` defaults to the run directory itself (its figures are replaced); elsewhere, a file of
    the same name is replaced only if headscope wrote it (:mod:`headscope.files`). ``formats``
    (png, svg, pdf) defaults to the formats the run's figures were written in."""
    run = load_run(run_dir)
    formats = figure_formats(formats) if formats else run_figure_formats(run)
    target = Path(out) if out is not None else Path(run_dir)
    if target.exists() and not target.is_dir():
        raise HeadscopeError(
            f"--out '{target}' exists and is not a directory; choose another --out."
        )
    if target.resolve() != Path(run_dir).resolve():
        check_replaceable([target / name for name in figure_names(run.scores, formats)])
    # n per probe, for the titles: tokens.jsonl when the run has it, else metadata.json.
    n_sequences = {p.name: len(p) for p in run.probes} or {
        name: s.get("n_sequences") for name, s in run.metadata.get("probes", {}).items()
    }
    return save_figures(
        run.scores, target, n_sequences=n_sequences, thresholds=run.thresholds, formats=formats
    )


def rebuild_report(
    run_dir: str | Path, out: str | Path | None = None, figures: bool | None = None
) -> Path:
    """``headscope report``: write a saved run's ``report.html`` again from its files, without the
    model.

    ``out`` defaults to ``RUN_DIR/report.html``; elsewhere, a file of that name is replaced only if
    headscope wrote it (:mod:`headscope.files`). ``figures`` defaults to what the run has (its
    PNGs), so the page is the one the scan wrote."""
    run = load_run(run_dir)  # one line when run_dir is not a run
    target = Path(out) if out is not None else Path(run_dir) / REPORT
    if target.suffix.lower() not in (".html", ".htm"):
        raise HeadscopeError(
            f"--out '{target}' must name an .html file, e.g. {target.with_suffix('.html')}."
        )
    if target.is_dir():
        raise HeadscopeError(
            f"--out '{target}' is a directory; name the page to write, e.g. {target / REPORT}."
        )
    if not target.parent.is_dir():
        raise HeadscopeError(
            f"--out '{target}': folder '{target.parent}' does not exist; create "
            "it or choose another --out."
        )
    if target.parent.resolve() != Path(run_dir).resolve() and is_run_dir(target.parent):
        raise HeadscopeError(
            f"--out '{target}' is inside another run directory ('{target.parent}'); its page is "
            f"that run's. Rebuild it with `headscope report {target.parent}`, or "
            "choose another --out."
        )
    check_replaceable([target])  # in place too: a page of the user's own is never replaced
    if figures is None:
        drawn = tuple(f".{f}" for f in FIGURE_FORMATS)
        figures = any(name.endswith(drawn) for name in run.metadata.get("files", []))
    page = report_html(run, figures=figures)
    try:
        return write_atomic(target, lambda tmp: tmp.write_text(page, encoding="utf-8"))
    except OSError as exc:
        raise HeadscopeError(
            f"Cannot write '{target}' ({exc.strerror or exc}); choose another --out."
        ) from None
