"""Run directories: written atomically, read back, and never a folder headscope did not write.

Every command that writes a run directory (scan, patch, circuit, census, kvplan; a sweep's jobs
are scans) writes it through :func:`write_run`, the one writer, and reads it back through
:func:`read_record` and :func:`read_table`. What each kind is named, holds and may replace is one
table (:mod:`headscope.rundir.kinds`); what its record says about the model is one builder
(:mod:`headscope.rundir.record`). The writer:

* fills a hidden temporary folder beside ``OUT`` (same file system): the tables first, then the
  figures, then the record (``metadata.json``, complete: every file, the time taken), then the
  page drawn from the files as saved; a figure or the page may fail and cost only itself (one
  line, ``figures_skipped`` / ``report_skipped`` in the record); then it renames the folder into
  place whole;
* ``OUT`` does not exist: the rename creates it. If another process published ``OUT`` in the
  meantime (two runs to one ``--out``), exactly one wins; the other fails with one line and
  leaves nothing;
* ``OUT`` exists: refused without ``force``. With ``force`` it is replaced only if it is an empty
  folder or a run of a kind this one may replace, holding nothing that headscope did not write;
  anything else (a thesis folder, a home directory) is refused with one line and left untouched;
* Ctrl-C, ``SIGTERM`` (what Slurm, Kubernetes and Ray send) or any error while writing removes
  the temporary folder and any parent folder made for ``OUT``: nothing is left behind. While a
  run is written, ``SIGTERM`` is handled like Ctrl-C, and both are held back during the final
  rename and the clean-up, so neither is ever half done (:func:`interruptible`); one that
  arrives during the rename is reported with the run complete (``exc.written``).
"""

from __future__ import annotations

import json
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from headscope.errors import HeadscopeError
from headscope.files import Claimed, optional, publish_dir
from headscope.result import COLUMNS, FLOAT_FORMAT, METRIC_NAME, RUN_FORMAT, Probe, ScanResult
from headscope.rundir.kinds import FORMATS, KVPLAN, SCAN, RunKind
from headscope.rundir.signals import Interrupted, held, interruptible, released

#: What every run directory holds besides one ``<metric>.png`` per metric.
RUN_FILES = (
    "scores.csv",
    "scores.parquet",
    "metadata.json",
    "tokens.jsonl",
    "summary.md",
    "summary.png",
    "per_sequence.npz",
    "thresholds.png",
    "controls.jsonl",
    "report.html",
    "views.npz",
)
# the strongest heads' patterns on one example per probe (headscope.scanner.examples)
VIEWS = "views.npz"
REPORT = "report.html"
#: ``metadata.json`` keys noting a figure or page that could not be made (the rest is kept).
SKIPPED = ("figures_skipped", "report_skipped")


# ------------------------------------------------------------------------------ what a run is


def read_metadata(path: Path, record: str = "metadata.json") -> dict | None:
    """A folder's record (``metadata.json``) as a dict, or None when it is missing or not JSON."""
    try:
        meta = json.loads((Path(path) / record).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def _formats(kind: RunKind | str | tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(kind, RunKind):
        return kind.replaces
    return (kind,) if isinstance(kind, str) else tuple(kind)


def is_run_dir(path: str | Path, formats: RunKind | str | tuple[str, ...] = RUN_FORMAT) -> bool:
    """Whether ``path`` is a headscope run directory of one of ``formats`` (``run_format`` values,
    or a :class:`~headscope.rundir.kinds.RunKind`: it or a kind it may replace; a scan's by
    default): its main table (:mod:`headscope.rundir.kinds`) plus a headscope record. Scans
    written before the ``run_format`` key are known by their recorded headscope version."""
    formats = _formats(formats)
    path = Path(path)
    if KVPLAN.run_format in formats and is_kvplan_dir(path):
        return True
    meta = read_metadata(path)
    if meta is None:
        return False
    if "run_format" in meta:
        kind = FORMATS.get(meta["run_format"])
        return kind is not None and kind.run_format in formats and (path / kind.table).is_file()
    if not (path / "scores.csv").is_file():
        return False
    versions = meta.get("versions")
    return RUN_FORMAT in formats and isinstance(versions, dict) and "headscope" in versions


def foreign_entries(path: str | Path, run_format: str = RUN_FORMAT) -> list[str]:
    """Entries of a run directory that headscope did not write (sorted; [] for a clean run)."""
    from headscope.files import FIGURE_FORMATS, is_ours
    from headscope.report.figures import figure_names

    path = Path(path)
    if run_format == KVPLAN.run_format:
        return sorted(e.name for e in path.iterdir() if e.name not in KVPLAN.files)
    meta = read_metadata(path) or {}
    ours = (set(RUN_FILES) if run_format == RUN_FORMAT else set()) | set(meta.get("files") or [])
    try:
        scores = pd.read_csv(
            path / "scores.csv",
            usecols=["metric", "probe", "score", "label"],
            keep_default_na=False,
            na_values={"score": ["NaN", "nan", ""]},
        )
        scores = scores[scores["metric"].astype(str).map(lambda m: bool(METRIC_NAME.match(m)))]
        drawn = figure_names(scores.assign(model="", layer=0, head=0, head_name=""), FIGURE_FORMATS)
        # a redrawn figure (`headscope plot --figure-format`): PNGs by name, vector files by creator
        ours |= {n for n in drawn if n.endswith(".png") or is_ours(path / n)}
    except (OSError, ValueError, KeyError, pd.errors.ParserError):
        pass

    if (path / REPORT).is_file() and not is_ours(path / REPORT):
        ours.discard(REPORT)  # a page of the user's own, in a run directory: not ours to delete
    return sorted(
        e.name
        for e in path.iterdir()
        if not (e.name == KVPLAN_DIR and is_kvplan_dir(e))
        and (e.name not in ours or not e.is_file() or e.is_symlink())
    )


KVPLAN_DIR = "kvplan"  # `headscope kvplan RUN_DIR` writes its table, curve and summary here


def is_kvplan_dir(path: str | Path) -> bool:
    """A folder holding only what ``headscope kvplan`` writes (and its record)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir() or not (path / KVPLAN.record).is_file():
        return False
    return all(
        e.name in KVPLAN.files and e.is_file() and not e.is_symlink() for e in path.iterdir()
    )


def check_out_dir(out: str | Path, force: bool, kind: RunKind | str = SCAN) -> Path:
    """Refuse an ``out`` that may not be written, before any work is done (one line, nothing
    touched).

    Without ``force`` ``out`` must not exist; with it, it may also be an empty folder or a headscope
    run directory of a kind ``kind`` may replace (:func:`is_run_dir`) holding only what headscope
    wrote.
    """
    kind = FORMATS[kind] if isinstance(kind, str) else kind
    out = Path(out)
    if not (out.exists() or out.is_symlink()):
        if out.parent.exists() and not out.parent.is_dir():
            raise HeadscopeError(f"'{out.parent}' is not a directory; choose another --out.")
        return out
    if not force:
        raise HeadscopeError(
            f"Output directory '{out}' already exists; pass --force to replace it (a headscope "
            "run only) or choose another --out."
        )
    if out.is_symlink() or not out.is_dir():
        what = "a symbolic link" if out.is_symlink() else "not a directory"
        raise HeadscopeError(
            f"'{out}' exists and is {what}; --force replaces only a headscope {kind.what}, "
            "choose another --out."
        )
    entries = sorted(e.name for e in out.iterdir())
    if not entries:
        return out
    if not is_run_dir(out, kind):
        more = f" and {len(entries) - 1} more" if len(entries) > 1 else ""
        raise HeadscopeError(
            f"'{out}' is not a headscope {kind.what} (it holds {entries[0]}{more}); --force "
            f"replaces only a {kind.what} or an empty folder, so choose another --out."
        )
    record = read_metadata(out, kind.record) or {}
    foreign = foreign_entries(out, record.get("run_format", kind.run_format))
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise HeadscopeError(
            f"'{out}' is a headscope run but also holds {foreign[0]}{more}, which headscope did "
            "not write; move it out first or choose another --out."
        )
    return out


# ------------------------------------------------------------------------------ the one writer


def write_run(
    out: str | Path,
    kind: RunKind,
    tables: Callable[[Path], None],
    record: dict,
    *,
    force: bool = False,
    figures: Callable[[Path], None] | None = None,
    page: Callable[[Path], None] | None = None,
    say: Callable[[str], None] | None = None,
    started: float | None = None,
) -> dict:
    """Write the run directory ``out`` of ``kind`` whole (see the module docstring for every rule)
    and return its record as saved.

    ``tables(tmp)`` writes the tables (and tokens); ``record`` is the record's content (the
    writer adds ``run_format``, ``files`` and the time spent writing, and the total time since
    ``started``, a ``time.perf_counter()`` value); ``figures(tmp)`` runs after the tables and
    ``page(tmp)`` after the record (it may read the run back); each is optional, and a failure of
    either costs only itself (one line to ``say``, noted in the record).
    """
    out = check_out_dir(out, force, kind)
    t0 = time.perf_counter()
    saved: dict = {}
    published = False
    try:
        # Everything is held by default: a signal can only interrupt the writing itself (released),
        # never the making of the folders, the rename or the clean-up, which run whole.
        with interruptible(), held():
            try:
                publish_dir(
                    out,
                    lambda tmp: _fill(tmp, kind, tables, record, figures, page, say, t0, started,
                                      saved),
                    replace=force and (out.exists() or out.is_symlink()),
                    before_replace=lambda: check_out_dir(out, True, kind),  # it may have changed
                )  # fmt: skip
            except Claimed:
                raise HeadscopeError(
                    f"Output directory '{out}' appeared while this {kind.command} ran (another "
                    f"{kind.command} to the same --out?); nothing was written. Choose another "
                    "--out, or pass --force."
                ) from None
            published = True
    except Interrupted as exc:
        if published:  # it came during the rename, which finished: the run is complete
            exc.written = out
        raise
    return saved


def _fill(tmp, kind, tables, record, figures, page, say, t0, started, saved: dict) -> None:
    """Everything of the run into the temporary folder ``tmp`` (signals released: this is the only
    part an interrupt may stop): the tables, the figures, the record as it will stay (listing the
    page), then the page from the files as saved (so a rebuilt page is the same page), and the
    record once more only if the page could not be made."""
    with released():
        meta = {k: v for k, v in record.items() if k not in (*SKIPPED, "files")}
        meta["run_format"] = kind.run_format
        tables(tmp)
        if figures is not None:
            optional("the figures", lambda: figures(tmp), meta, "figures_skipped", say)
        meta["timings"] = dict(meta.get("timings", {}))
        meta["timings"]["write_s"] = round(time.perf_counter() - t0, 3)
        if started is not None:
            meta["timings"]["total_s"] = round(time.perf_counter() - started, 3)
        names = {p.name for p in tmp.iterdir() if not p.name.startswith(".")} | {kind.record}
        meta["files"] = sorted(names | ({REPORT} if page is not None else set()))
        _write_record(tmp / kind.record, meta)
        if page is not None:
            optional(REPORT, lambda: page(tmp), meta, "report_skipped", say)
            if "report_skipped" in meta:
                meta["files"] = [f for f in meta["files"] if f != REPORT]
                _write_record(tmp / kind.record, meta)
    saved.clear()
    saved.update(meta)


def _write_record(path: Path, meta: dict) -> None:
    path.write_text(json.dumps(meta, indent=2, default=str) + "\n")


def write_csv(table: pd.DataFrame, path: Path) -> None:
    """A run's table as every run writes it (8 significant digits, NaN spelled out)."""
    table.to_csv(path, index=False, float_format=FLOAT_FORMAT, na_rep="NaN")


# ------------------------------------------------------------------------------ the one reader


def read_record(path: str | Path, kind: RunKind) -> dict:
    """The record of a run directory of ``kind``, or one line saying it is not one."""
    path = Path(path)
    meta = read_metadata(path, kind.record)
    if (
        meta is None
        or meta.get("run_format") != kind.run_format
        or not (path / kind.table).is_file()
    ):
        raise HeadscopeError(
            f"'{path}' is not a headscope {kind.what} (no {kind.table} with its {kind.record}); "
            f"give a folder written by `headscope {kind.command}`."
        )
    return meta


def read_table(path: str | Path, name: str, str_cols=()) -> pd.DataFrame | None:
    """A table of a run directory as written by :func:`write_csv` (None when the run has none):
    ``NaN`` read as missing, ``str_cols`` kept as text."""
    path = Path(path) / name
    if not path.is_file():
        return None
    return pd.read_csv(
        path, keep_default_na=False, na_values=["NaN", "nan", ""], dtype={c: str for c in str_cols}
    )


# ------------------------------------------------------------------------------ a scan's run


def save_run(
    result: ScanResult,
    out: str | Path,
    force: bool = False,
    figures: bool = True,
    started: float | None = None,
    say=None,
    figure_formats: Sequence[str] = ("png",),
) -> Path:
    """Write a scan's run directory ``out`` atomically (:func:`write_run`; the module docstring
    has every rule): scores.csv (and .parquet), tokens.jsonl, controls.jsonl, per_sequence.npz,
    views.npz, summary.md, metadata.json, then a heatmap per metric and report.html.
    ``figure_formats``: the figures' files (png, svg, pdf; the page's figures are inline PNGs
    whatever they are). ``result.metadata`` is updated to what was saved."""
    record = dict(result.metadata, thresholds=result.thresholds)

    def draw(tmp: Path) -> None:
        from headscope.report.figures import save_figures

        save_figures(
            result.scores,
            tmp,
            n_sequences={p.name: len(p) for p in result.probes},
            thresholds=result.thresholds,
            formats=figure_formats,
        )

    result.metadata = write_run(
        out,
        SCAN,
        lambda tmp: _write(result, tmp),
        record,
        force=force,
        figures=draw if figures else None,
        page=lambda tmp: _write_report(tmp, tmp / REPORT, figures),
        say=say,
        started=started,
    )
    return Path(out)


def _write(result: ScanResult, tmp: Path) -> None:
    """Every table and record of a scan's run but ``metadata.json``: scores, tokens, controls,
    per-sequence sums, the page's views, the summary."""
    from headscope.report.tables import summary_markdown

    write_csv(result.scores, tmp / "scores.csv")
    try:
        import pyarrow  # noqa: F401

        result.scores.to_parquet(tmp / "scores.parquet", index=False)
    except ImportError:
        pass
    # tokens.jsonl: the probes' sequences; controls.jsonl: the controls' (the positional null),
    # apart
    controls = [p for p in result.probes if p.settings.get("null_of")]
    for name, probes in (
        ("tokens.jsonl", [p for p in result.probes if p not in controls]),
        ("controls.jsonl", controls),
    ):
        if not probes and name == "controls.jsonl":
            continue
        with open(tmp / name, "w") as f:
            for probe in probes:
                for i, ids in enumerate(probe.sequences):
                    rec = {"probe": probe.name, "index": i, "token_ids": [int(t) for t in ids]}
                    if probe.token_types is not None:
                        rec["token_type_ids"] = [int(t) for t in probe.token_types[i]]
                    if probe.repeat_len is not None:
                        rec["repeat_len"] = probe.repeat_len
                    if probe.needles is not None:
                        rec["needle"] = probe.needles[i]
                    if probe.settings.get("null_of"):
                        rec["null_of"] = probe.settings["null_of"]
                    f.write(json.dumps(rec) + "\n")
    # what the bootstrap resampled: intervals can be recomputed without the model
    if result.per_sequence:
        import numpy as np

        arrays = {}
        for name, rec in result.per_sequence.items():
            arrays[f"{name}.total"] = np.asarray(rec["total"], dtype=np.float64)
            arrays[f"{name}.count"] = np.asarray(rec["count"], dtype=np.float64)
            arrays[f"{name}.probe"] = np.asarray(rec["probe"])
        np.savez_compressed(tmp / "per_sequence.npz", **arrays)
    if result.views.get("examples"):  # the report's interactive views, drawn without the model
        import numpy as np

        arrays = {"heads": np.asarray(result.views["heads"], dtype=np.int64).reshape(-1, 2)}
        for i, ex in enumerate(result.views["examples"]):
            arrays[f"{i}.probe"] = np.asarray(ex["probe"])
            arrays[f"{i}.token_ids"] = np.asarray(ex["token_ids"], dtype=np.int64)
            arrays[f"{i}.tokens"] = np.asarray(ex["tokens"], dtype=str)
            arrays[f"{i}.n_full"] = np.asarray(ex["n_full"], dtype=np.int64)
            arrays[f"{i}.pattern"] = np.asarray(ex["pattern"], dtype=np.float32)
        np.savez_compressed(tmp / VIEWS, **arrays)
    (tmp / "summary.md").write_text(summary_markdown(result))


def _write_report(run_dir: Path, path: Path, figures: bool) -> None:
    from headscope.report.html import report_html

    path.write_text(report_html(load_run(run_dir), figures=figures), encoding="utf-8")


# ------------------------------------------------------------------------------ loading


def load_run(path: str | Path) -> ScanResult:
    """Read a run directory back: a :class:`~headscope.result.ScanResult` without the model.

    A missing folder, a folder that is not a run, or a ``scores.csv`` that is not headscope's gets
    one line (with the nearest run directory beside it, when there is one)."""
    from headscope.errors import did_you_mean

    path = Path(path)
    table = path / "scores.csv"
    if not path.is_dir() or not table.is_file():
        parent = path.parent if path.parent.is_dir() else Path(".")
        runs = [d.name for d in parent.iterdir() if (d / "scores.csv").is_file()]
        what = (
            "does not exist"
            if not path.exists()
            else "is not a directory"
            if not path.is_dir()
            else ("is not a headscope run directory (no scores.csv)")
        )
        raise HeadscopeError(
            f"'{path}' {what}; give a directory written by `headscope scan`."
            + did_you_mean(path.name, runs)
        )
    try:
        na = {
            c: ["NaN", "nan", ""]
            for c in ("score", "chance", "null", "ci_low", "ci_high", "stability")
        }
        scores = pd.read_csv(table, keep_default_na=False, na_values=na, dtype={"label": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise HeadscopeError(
            f"'{table}' cannot be read as a table ({str(exc).splitlines()[0]}); rerun the scan."
        ) from None
    missing = [c for c in COLUMNS if c not in scores.columns]
    if missing or scores.empty:
        raise HeadscopeError(
            f"'{table}' lacks {', '.join(missing) or 'rows'}; a run's scores.csv has columns "
            f"{', '.join(COLUMNS)}."
        )
    odd = [m for m in scores["metric"].astype(str).unique() if not METRIC_NAME.match(m)]
    if odd:  # a metric names a file (<metric>.png): never a path
        raise HeadscopeError(
            f"'{table}' names a metric '{odd[0]}', which is not a metric name "
            "(letters, digits, '_', '.', '-'); is it from `headscope scan`?"
        )
    scores["label"] = scores["label"].fillna("")
    meta = read_metadata(path) or {}
    probes: dict[str, Probe] = {}
    for name in ("tokens.jsonl", "controls.jsonl"):
        if not (path / name).is_file():
            continue
        for line in (path / name).read_text().splitlines():
            rec = json.loads(line)
            settings = {"null_of": rec["null_of"]} if "null_of" in rec else {}
            p = probes.setdefault(
                rec["probe"],
                Probe(rec["probe"], [], repeat_len=rec.get("repeat_len"), settings=settings),
            )
            p.sequences.append(rec["token_ids"])
            if "token_type_ids" in rec:
                p.token_types = (p.token_types or []) + [rec["token_type_ids"]]
            if "needle" in rec:
                p.needles = (p.needles or []) + [rec["needle"]]
    per_sequence = {}
    if (path / "per_sequence.npz").is_file():
        import numpy as np

        try:
            with np.load(path / "per_sequence.npz") as z:
                for key in z.files:
                    name, _, part = key.rpartition(".")
                    per_sequence.setdefault(name, {})[part] = (
                        str(z[key]) if part == "probe" else z[key]
                    )
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise HeadscopeError(
                f"'{path / 'per_sequence.npz'}' cannot be read ({type(exc).__name__}); "
                "rerun the scan, or delete that file to load the run without it."
            ) from None
    return ScanResult(
        model_name=str(scores["model"].iloc[0]),
        scores=scores,
        probes=list(probes.values()),
        metadata=meta,
        thresholds=meta.get("thresholds", {}),
        per_sequence=per_sequence,
        views=_read_views(path / VIEWS),
    )


def _read_views(path: Path) -> dict:
    """``views.npz`` back as :attr:`ScanResult.views` (empty when the run has none or it is
    unreadable)."""
    if not path.is_file():
        return {}
    import numpy as np

    try:
        with np.load(path) as z:
            heads = [(int(layer), int(head)) for layer, head in z["heads"]]
            examples = []
            for i in range(len(z.files)):
                if f"{i}.pattern" not in z.files:
                    break
                examples.append(
                    {
                        "probe": str(z[f"{i}.probe"]),
                        "token_ids": z[f"{i}.token_ids"].tolist(),
                        "tokens": [str(t) for t in z[f"{i}.tokens"]],
                        "n_full": int(z[f"{i}.n_full"]),
                        "pattern": z[f"{i}.pattern"],
                    }
                )
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        # views are an extra of the page: an unreadable file only means a page without them
        return {}
    return {"heads": heads, "examples": examples}
