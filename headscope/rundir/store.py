"""Run directories: written atomically, read back, and never a folder headscope did not write.

:func:`save_run` writes everything into a hidden temporary folder beside ``OUT`` (same file system)
and renames it into place when complete; ``metadata.json`` is written last, complete (the list of
files, the time taken to write them), so no file is ever rewritten after the rename.

* ``OUT`` does not exist: the rename creates it. If another process published ``OUT`` in the
  meantime (two scans to one ``--out``), exactly one wins; the other fails with one line and
  leaves nothing.
* ``OUT`` exists: refused without ``force``. With ``force`` it is replaced only if it is an empty
  folder or a headscope run directory holding nothing that headscope did not write; anything else
  (a thesis folder, a home directory) is refused with one line and left untouched. The same rules
  serve other kinds of run (``headscope patch``'s, :data:`PATCH_RUN_FORMAT`): each replaces only
  a run of its own kind.
* Ctrl-C, ``SIGTERM`` (what Slurm, Kubernetes and Ray send) or any error while writing removes
  the temporary folder and any parent folder made for ``OUT``: nothing is left behind. While a
  run is written, ``SIGTERM`` is handled like Ctrl-C, and both are held back during the final
  rename and the clean-up, so neither is ever half done (:func:`interruptible`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from headscope.errors import HeadscopeError
from headscope.files import Claimed, fsync_tree, make_parents, optional, rename_into
from headscope.result import COLUMNS, FLOAT_FORMAT, METRIC_NAME, RUN_FORMAT, Probe, ScanResult
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
PATCH_RUN_FORMAT = "headscope-patching/1"  # a run of `headscope patch` (headscope.apps.patch)
CIRCUIT_RUN_FORMAT = "headscope-circuit/1"  # a run of `headscope circuit` (headscope.apps.circuit)
#: Per kind of run directory (its ``run_format``): its main table and what messages call it.
RUN_KINDS = {
    RUN_FORMAT: ("scores.csv", "run directory"),
    PATCH_RUN_FORMAT: ("patching.csv", "patching run"),
    CIRCUIT_RUN_FORMAT: ("path.csv", "circuit run"),
}


# ------------------------------------------------------------------------------ what a run is


def read_metadata(path: Path) -> dict | None:
    """``metadata.json`` of a folder as a dict, or None when it is missing or not JSON."""
    try:
        meta = json.loads((Path(path) / "metadata.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def is_run_dir(path: str | Path, formats: str | tuple[str, ...] = (RUN_FORMAT,)) -> bool:
    """Whether ``path`` is a headscope run directory of one of ``formats`` (``run_format`` values;
    a scan's by default; ``headscope census`` and ``headscope patch`` name their own): its main
    table (:data:`RUN_KINDS`: ``scores.csv``, ``patching.csv``) plus a headscope ``metadata.json``.
    Scans written before the ``run_format`` key are known by their recorded headscope version."""
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    path = Path(path)
    meta = read_metadata(path)
    if meta is None:
        return False
    if "run_format" in meta:
        kind = meta["run_format"]
        table = RUN_KINDS.get(kind, ("scores.csv",))[0]
        return kind in formats and (path / table).is_file()
    if not (path / "scores.csv").is_file():
        return False
    versions = meta.get("versions")
    return RUN_FORMAT in formats and isinstance(versions, dict) and "headscope" in versions


def foreign_entries(path: str | Path, run_format: str = RUN_FORMAT) -> list[str]:
    """Entries of a run directory that headscope did not write (sorted; [] for a clean run)."""
    from headscope.files import FIGURE_FORMATS, is_ours
    from headscope.report.figures import figure_names

    path = Path(path)
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
        if not (e.name == KVPLAN and is_kvplan_dir(e))
        and (e.name not in ours or not e.is_file() or e.is_symlink())
    )


KVPLAN = "kvplan"  # `headscope kvplan RUN_DIR` writes its table, curve and summary here
KVPLAN_FILES = ("kvplan.csv", "kvplan.png", "kvplan.md", "kvplan.json", "kvplan.svg", "kvplan.pdf")


def is_kvplan_dir(path: str | Path) -> bool:
    """A folder holding only what ``headscope kvplan`` writes (and its record)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir() or not (path / "kvplan.json").is_file():
        return False
    return all(
        e.name in KVPLAN_FILES and e.is_file() and not e.is_symlink() for e in path.iterdir()
    )


def check_out_dir(
    out: str | Path, force: bool, formats: str | tuple[str, ...] = (RUN_FORMAT,)
) -> Path:
    """Refuse an ``out`` that may not be written, before any work is done (one line, nothing
    touched).

    Without ``force`` ``out`` must not exist; with it, it may also be an empty folder or a headscope
    run directory (of one of ``formats``, :func:`is_run_dir`) holding only what headscope wrote.
    """
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    kind = RUN_KINDS.get(formats[0], ("", "run directory"))[1]
    out = Path(out)
    if not (out.exists() or out.is_symlink()):
        if out.parent.exists() and not out.parent.is_dir():
            raise HeadscopeError(f"'{out.parent}' is not a directory; choose another --out.")
        return out
    if not force:
        raise HeadscopeError(
            f"Output directory '{out}' already exists; pass --force to replace it "
            "(a headscope "
            "run only) or choose another --out."
        )
    if out.is_symlink() or not out.is_dir():
        what = "a symbolic link" if out.is_symlink() else "not a directory"
        raise HeadscopeError(
            f"'{out}' exists and is {what}; --force replaces only a headscope "
            f"{kind}, "
            "choose another --out."
        )
    entries = sorted(e.name for e in out.iterdir())
    if not entries:
        return out
    if not is_run_dir(out, formats):
        more = f" and {len(entries) - 1} more" if len(entries) > 1 else ""
        raise HeadscopeError(
            f"'{out}' is not a headscope {kind} (it holds {entries[0]}{more}); "
            "--force "
            f"replaces only a {kind} or an empty folder, so choose another --out."
        )
    foreign = foreign_entries(out, (read_metadata(out) or {}).get("run_format", RUN_FORMAT))
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise HeadscopeError(
            f"'{out}' is a headscope run but also holds {foreign[0]}{more}, which "
            "headscope did "
            "not write; move it out first or choose another --out."
        )
    return out


# ------------------------------------------------------------------------------ saving

#: ``metadata.json`` keys noting a figure or page that could not be made (the rest of the run is
# kept).
SKIPPED = ("figures_skipped", "report_skipped")


def save_run(
    result: ScanResult,
    out: str | Path,
    force: bool = False,
    figures: bool = True,
    started: float | None = None,
    say=None,
    figure_formats: Sequence[str] = ("png",),
) -> Path:
    """Write the run directory ``out`` atomically (see the module docstring for every rule).

    Tables and records are written first; a figure or the page that cannot be drawn costs only
    itself (one line to ``say``, ``figures_skipped`` / ``report_skipped`` in ``metadata.json``),
    never the finished scan. ``started`` (a ``time.perf_counter()`` value) lets ``metadata.json``
    record the total time of the run; the time spent writing is always recorded.
    ``figure_formats``: the figures' files (png, svg, pdf; the page's figures are inline PNGs
    whatever they are). ``result.metadata`` is updated to what was saved.
    """
    out = check_out_dir(out, force)
    t0 = time.perf_counter()
    tmp: Path | None = None
    made: list[Path] = []
    published = False
    # Everything is held by default: a signal can only interrupt the writing itself (released),
    # never the making of the folders, the rename or the clean-up, which run whole.
    try:
        with interruptible(), held():
            try:
                made = make_parents(out.absolute().parent)
                tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.absolute().parent))
                with released():
                    notes: dict = {}
                    _write(result, tmp, figures, notes, say, figure_formats)
                    timings = dict(
                        result.metadata.get("timings", {}),
                        write_s=round(time.perf_counter() - t0, 3),
                    )
                    if started is not None:
                        timings["total_s"] = round(time.perf_counter() - started, 3)
                    files = sorted([p.name for p in tmp.iterdir()] + ["metadata.json", REPORT])
                    # a reloaded run's
                    kept = {k: v for k, v in result.metadata.items() if k not in SKIPPED}
                    meta = (
                        kept
                        | notes
                        | {
                            "run_format": RUN_FORMAT,
                            "thresholds": result.thresholds,
                            "timings": timings,
                            "files": files,
                        }
                    )
                    _write_json(tmp / "metadata.json", meta)
                    # from the files as saved, so that a rebuild is the same page
                    optional(
                        "report.html",
                        lambda: _write_report(tmp, tmp / REPORT, figures),
                        meta,
                        "report_skipped",
                        say,
                    )
                    if "report_skipped" in meta:
                        meta["files"] = [f for f in files if f != REPORT]
                        _write_json(tmp / "metadata.json", meta)
                    fsync_tree(tmp)
                    # mkdtemp makes it private; a run directory is an ordinary folder
                    os.chmod(tmp, 0o755)
                _publish(tmp, out, force)
                tmp, published = None, True
                result.metadata = meta
            except BaseException:
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
                for folder in reversed(made):
                    with contextlib.suppress(OSError):
                        folder.rmdir()  # only if still empty
                raise
    except Interrupted as exc:
        if published:  # it came during the rename, which finished: the run is complete
            exc.written = out
        raise
    return out


def _write_json(path: Path, record: dict) -> None:
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")


def _write(
    result: ScanResult,
    tmp: Path,
    figures: bool,
    notes: dict | None = None,
    say=None,
    figure_formats: Sequence[str] = ("png",),
) -> None:
    """Every file of the run but ``metadata.json`` and the page: tables first, figures last (a
    figure that fails is noted in ``notes["figures_skipped"]``; the tables stay)."""
    from headscope.report.tables import summary_markdown

    result.scores.to_csv(tmp / "scores.csv", index=False, float_format=FLOAT_FORMAT, na_rep="NaN")
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
    if figures:
        from headscope.report.figures import save_figures

        optional(
            "the figures",
            lambda: save_figures(
                result.scores,
                tmp,
                n_sequences={p.name: len(p) for p in result.probes},
                thresholds=result.thresholds,
                formats=figure_formats,
            ),
            {} if notes is None else notes,
            "figures_skipped",
            say,
        )


REPORT = "report.html"


def _write_report(run_dir: Path, path: Path, figures: bool) -> None:
    from headscope.report.html import report_html

    path.write_text(report_html(load_run(run_dir), figures=figures), encoding="utf-8")


def _publish(tmp: Path, out: Path, force: bool) -> None:
    """Rename the finished ``tmp`` to ``out`` (signals held by the caller)."""
    try:
        rename_into(
            tmp,
            out,
            replace=force and (out.exists() or out.is_symlink()),
            # it may have changed meanwhile
            before_replace=lambda: check_out_dir(out, force=True),
        )
    except Claimed:
        raise HeadscopeError(
            f"Output directory '{out}' appeared while this scan ran (another scan "
            "to the same "
            "--out?); nothing was written. Choose another --out, or pass --force."
        ) from None


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
            f"'{table}' lacks {', '.join(missing) or 'rows'}; a run's scores.csv "
            "has columns "
            f"{', '.join(COLUMNS)}."
        )
    odd = [m for m in scores["metric"].astype(str).unique() if not METRIC_NAME.match(m)]
    if odd:  # a metric names a file (<metric>.png): never a path
        raise HeadscopeError(
            f"'{table}' names a metric '{odd[0]}', which is not a metric name "
            "(letters, digits, "
            "'_', '.', '-'); is it from `headscope scan`?"
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
                f"'{path / 'per_sequence.npz'}' cannot be read "
                f"({type(exc).__name__}); "
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


def publish_run(out: Path, force: bool, run_format: str, write) -> dict:
    """Publish the run directory ``out`` whole (``--force`` rules of :func:`check_out_dir` for
    ``run_format``, checked again just before a replace): ``write(tmp) -> dict`` fills a temporary
    folder (signals released while it runs) and its dict is returned. An interrupt after the
    publish says so (``exc.written``)."""
    from headscope.files import publish_dir

    saved: dict = {}

    def build(tmp: Path) -> None:
        with released():
            saved.update(write(tmp))

    published = False
    try:
        with interruptible(), held():
            publish_dir(
                out,
                build,
                replace=force and (out.exists() or out.is_symlink()),
                before_replace=lambda: check_out_dir(out, True, run_format),
            )
            published = True
    except Interrupted as exc:
        if published:
            exc.written = out
        raise
    return saved
