"""``headscope sweep SPEC.toml``: models or training checkpoints x probe settings x seeds.

Every job is one ordinary scan (:func:`headscope.scanner.runner.scan_to_dir`) written atomically to
``OUT/runs/<job>/``; the sweep then gathers every job's ``scores.csv`` into one tidy atlas
(``atlas.csv``, ``atlas.parquet``) with ``job, model, source, checkpoint, step, seed, setting``
columns, and draws each labelled head's score against the training step (``steps.png``) and the
models side by side (``models.png``), one pair per probe setting (``steps-s1.png``, ... after the
first).

* Rerunning resumes: a job whose run directory exists is finished (it appears only complete) and
  is skipped, but only when the spec still asks for the scan it ran (same source, same settings,
  as ``sweep.json`` recorded them); a finished job the spec now scans differently is refused in one
  line, never passed off as the new scan.
* A failed job is retried (``retries``); if it still fails, it is reported with its error (stderr,
  ``failures.json``, and a ``status = failed`` row in the atlas), never dropped.
* With Ray (``address``) the jobs run as Ray tasks, ``workers`` at a time, on a local instance or
  a cluster; without, one after another in this process.

A SPEC (paths relative to the SPEC file's folder)::

    seeds = [0, 1]                         # default [0]
    models = ["smollm2-135m"]              # names, folders, NAME@REVISION: one model each
    [[checkpoints]]                        # the checkpoints of one training run
    model = "attn-only-2l"                 # its name in the atlas
    folders = ["ckpts/step-0000", "ckpts/step-0200"]   # or glob = "ckpts/step-*"
    # steps = [0, 200]                     # default: the last number in each folder's name
    [[checkpoints]]
    model = "EleutherAI/pythia-70m"
    revisions = ["step1000", "step2000"]   # hub revisions (NAME@REVISION)
    [scan]                                 # ScanSettings settings for every job
    metrics = ["induction", "duplicate_token"]
    bootstrap = 0
    [[settings]]                           # probe settings swept (default: one, [scan]'s)
    repeat_len = 20
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import pandas as pd

from headscope.errors import HeadscopeError, did_you_mean
from headscope.files import figure_files, optional, save_figure, write_atomic
from headscope.files import figure_formats as check_figure_formats
from headscope.result import model_slug
from headscope.scanner.config import ScanSettings

__all__ = ["Job", "read_spec", "run_sweep", "atlas_table"]

TOP_KEYS = ("seeds", "models", "checkpoints", "scan", "settings")
CHECKPOINT_KEYS = ("model", "folders", "glob", "revisions", "steps")
PROBE_KEYS = ("n_prompts", "repeat_len", "seq_len", "prompts", "text_join", "token_types")
MARKER = "sweep.json"


@dataclass(frozen=True)
class Job:
    """One scan of a sweep."""

    model: str  # the model's name in the atlas
    source: str  # what load_model gets: a name, an absolute folder, NAME@REVISION
    checkpoint: str  # the folder's name or the revision ("" for a plain model)
    step: int | None  # the training step (None for a plain model)
    setting: int  # index into the spec's [[settings]]
    seed: int
    config: dict = field(default_factory=dict, compare=False)  # ScanSettings keyword arguments

    @property
    def id(self) -> str:
        ckpt = f"--{model_slug(self.checkpoint)}" if self.checkpoint else ""
        return f"{model_slug(self.model)}{ckpt}--s{self.setting}--seed{self.seed}"

    def scan_config(self) -> ScanSettings:
        cfg = dict(self.config)
        if isinstance(cfg.get("metrics"), list):
            cfg["metrics"] = tuple(cfg["metrics"])
        return ScanSettings(**cfg, seed=self.seed)


def _fail(spec: Path, msg: str):
    raise HeadscopeError(f"Sweep spec '{spec}': {msg}")


def _keys(spec: Path, table: dict, allowed, where: str) -> None:
    for key in table:
        if key not in allowed:
            _fail(
                spec,
                f"unknown key '{key}' in {where}.{did_you_mean(key, allowed)} Allowed: "
                f"{', '.join(allowed)}.",
            )


def _list_of(spec: Path, value, kind, what: str) -> list:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
    ):
        _fail(spec, f"{what} must be a non-empty list of {kind.__name__}s, got {value!r}.")
    return value


def _step_of(name: str) -> int | None:
    """The last number in a checkpoint's name: ``step-0200`` -> 200, ``step1000`` -> 1000."""
    numbers = re.findall(r"\d+", name)
    return int(numbers[-1]) if numbers else None


def read_spec(path: str | Path) -> list[Job]:
    """The jobs of a sweep SPEC, every mistake refused in one line (before anything is written)."""
    from headscope.models.sources import resolve

    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise HeadscopeError(
                "Reading a sweep spec needs Python 3.11+ (tomllib) or pip install tomli."
            ) from None
    spec = Path(path)
    if not spec.is_file():
        raise HeadscopeError(
            f"Sweep spec '{spec}' does not exist; give a TOML file (see `headscope sweep --help`)."
        )
    try:
        data = tomllib.loads(spec.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        _fail(spec, f"not valid TOML: {str(exc).splitlines()[0]}.")
    _keys(spec, data, TOP_KEYS, "the spec")
    here = spec.resolve().parent
    seeds = _list_of(spec, data.get("seeds", [0]), int, "seeds")
    scan = data.get("scan", {})
    if not isinstance(scan, dict):
        _fail(spec, "[scan] must be a table of scan settings.")
    config_keys = [f.name for f in fields(ScanSettings) if f.name != "seed"]
    _keys(spec, scan, config_keys, "[scan]")
    settings = data.get("settings", [{}])
    if (
        not isinstance(settings, list)
        or not settings
        or not all(isinstance(s, dict) for s in settings)
    ):
        _fail(spec, "[[settings]] must be tables of probe settings.")
    for s in settings:
        _keys(spec, s, PROBE_KEYS, "[[settings]]")

    def local(p: str) -> str:
        return str((here / p).resolve()) if (here / p).exists() else p

    models: list[tuple[str, str, str, int | None]] = []  # (model, source, checkpoint, step)
    for name in _list_of(spec, data["models"], str, "models") if "models" in data else []:
        models.append((name, local(name), "", None))
    runs = data.get("checkpoints", [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        _fail(spec, "[[checkpoints]] must be tables (model = ..., folders/glob/revisions = ...).")
    for run in runs:
        _keys(spec, run, CHECKPOINT_KEYS, "[[checkpoints]]")
        model = run.get("model")
        if not isinstance(model, str) or not model:
            _fail(spec, 'every [[checkpoints]] table needs model = "NAME".')
        given = [k for k in ("folders", "glob", "revisions") if k in run]
        if len(given) != 1:
            _fail(
                spec, f"[[checkpoints]] of {model} needs exactly one of folders, glob or revisions."
            )
        if "revisions" in run:
            revs = _list_of(spec, run["revisions"], str, "revisions")
            found = [(r, f"{model}@{r}") for r in revs]
        else:
            if "glob" in run:
                paths = sorted(p for p in here.glob(run["glob"]) if p.is_dir())
                if not paths:
                    _fail(spec, f"glob '{run['glob']}' of {model} matches no folder under {here}.")
            else:
                paths = [here / p for p in _list_of(spec, run["folders"], str, "folders")]
            found = [(p.name, str(p.resolve())) for p in paths]
        steps = run.get("steps")
        if steps is not None and len(_list_of(spec, steps, int, "steps")) != len(found):
            _fail(spec, f"steps of {model} has {len(steps)} entries for {len(found)} checkpoints.")
        for i, (ckpt, source) in enumerate(found):
            models.append((model, source, ckpt, steps[i] if steps else _step_of(ckpt)))
    if not models:
        _fail(spec, "no models: give models = [...] or [[checkpoints]] tables.")
    for _, source, _, _ in models:
        resolve(source)  # a typo, a missing folder or a folder that is not a checkpoint: one line
    jobs = []
    for model, source, ckpt, step in models:
        for k, setting in enumerate(settings):
            for seed in seeds:
                job = Job(model, source, ckpt, step, k, seed, {**scan, **setting})
                try:
                    job.scan_config()
                except TypeError as exc:
                    _fail(spec, f"a setting has the wrong type: {exc}.")
                jobs.append(job)
    ids = [j.id for j in jobs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        _fail(
            spec,
            f"two jobs would share the run directory '{dupes[0]}'; give the models distinct names.",
        )
    return jobs


def _record(job: Job) -> dict:
    """A job as ``sweep.json`` records it (JSON types: a tuple reads back as a list)."""
    return json.loads(json.dumps({**asdict(job), "id": job.id}))


def _check_resume(out: Path, jobs: list[Job]) -> list[dict]:
    """A finished job is reused only when this spec asks for the very scan it ran (same source, same
    settings); otherwise one line, before anything is written, and nothing of the old sweep is
    touched.

    Returns the records of finished jobs this spec no longer names, kept in ``sweep.json`` so that a
    later spec naming them again can still reuse them."""
    marker = out / MARKER
    if not any((out / "runs").glob("*/scores.csv")):
        return []
    try:
        record = json.loads(marker.read_text())
        before = {j["id"]: j for j in record["jobs"] + record.get("earlier_jobs", [])}
    except (OSError, ValueError, KeyError, TypeError):
        raise HeadscopeError(
            f"'{marker}' is unreadable, so the finished jobs in '{out}' cannot be "
            "matched to this spec; sweep into a new --out."
        ) from None
    finished = [j for j in jobs if (out / "runs" / j.id / "scores.csv").is_file()]
    for job in finished:
        now, old = _record(job), before.get(job.id)
        if old is None:
            what = "a run this sweep's record does not list"
        else:
            keys = sorted({*now["config"], *old.get("config", {})})
            changed = [
                f"{k} {old.get('config', {}).get(k)!r} -> {now['config'].get(k)!r}"
                for k in keys
                if old.get("config", {}).get(k) != now["config"].get(k)
            ]
            if old.get("source") != now["source"]:
                changed.insert(0, f"source {old.get('source')!r} -> {now['source']!r}")
            if not changed:
                continue
            what = "other settings (" + ", ".join(changed) + ")"
        raise HeadscopeError(
            f"Job {job.id} in '{out}' was run with {what}; sweep into a new --out, or delete "
            f"'{out / 'runs' / job.id}' to run it again."
        )
    named = {j.id for j in jobs}
    return [
        r
        for i, r in before.items()
        if i not in named and (out / "runs" / i / "scores.csv").is_file()
    ]


def run_job(job: Job, out_dir: str) -> str:
    """One job: an ordinary scan written atomically to ``out_dir`` (also what a Ray task runs)."""
    from headscope.scanner.runner import scan_to_dir

    scan_to_dir(job.source, out_dir, job.scan_config(), figures=False)
    return out_dir


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).is_file())):
        raise HeadscopeError(
            f"'{out}' exists and is not a headscope sweep; choose another --out "
            "(a sweep's own folder is resumed)."
        )


def run_sweep(
    spec: str | Path,
    out: str | Path,
    address: str | None = None,
    workers: int | None = None,
    retries: int = 1,
    say: Callable[[str], None] | None = None,
    figure_formats: Sequence[str] = ("png",),
) -> dict:
    """Run (or resume) the sweep ``spec`` into ``out``; returns ``{"atlas", "failures", "skipped",
    "files"}``. ``figure_formats``: the atlas figures as png, svg and/or pdf (``--figure-format``).

    ``address``: None (this process), ``"local"`` (a local Ray instance) or a cluster address."""
    from headscope.scale.options import check_address, check_options

    say = say or (lambda _msg: None)
    figure_formats = check_figure_formats(figure_formats)
    out = Path(out)
    jobs = read_spec(spec)
    if retries < 0:
        raise HeadscopeError(f"retries (--retries) must be at least 0, got {retries}.")
    check_options(address, workers, effects=False)
    if address is not None:
        from headscope.scale.options import require_ray

        require_ray()
        check_address(address)
    _check_out(out)
    earlier = _check_resume(out, jobs)
    todo = [j for j in jobs if not (out / "runs" / j.id / "scores.csv").is_file()]
    skipped = len(jobs) - len(todo)
    if skipped:
        say(f"resuming: {skipped} of {len(jobs)} job(s) already finished")
    made = not out.exists()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    try:
        (out / MARKER).write_text(
            json.dumps(
                {
                    "spec": str(Path(spec).resolve()),
                    "jobs": [_record(j) for j in jobs],
                    "earlier_jobs": earlier,
                },
                indent=1,
            )
        )
        failures = (
            _run_on_ray(todo, out, address, workers, retries, say)
            if address is not None
            else _run_here(todo, out, retries, say)
        )
    except BaseException:
        if made and not any((out / "runs").iterdir()):
            shutil.rmtree(out, ignore_errors=True)  # an interrupted first run leaves nothing
        raise
    atlas = atlas_table(out, jobs, failures)
    files = _write_outputs(out, atlas, failures, say, figure_formats)
    return {"atlas": atlas, "failures": failures, "skipped": skipped, "files": files}


def _run_here(todo: list[Job], out: Path, retries: int, say) -> dict[str, dict]:
    failures = {}
    for n, job in enumerate(todo, 1):
        for attempt in range(1, retries + 2):
            say(f"job {n}/{len(todo)}: {job.id}" + (f" (attempt {attempt})" if attempt > 1 else ""))
            try:
                run_job(job, str(out / "runs" / job.id))
                failures.pop(job.id, None)
                break
            except Exception as exc:  # KeyboardInterrupt passes: Ctrl-C stops the sweep
                failures[job.id] = {"attempts": attempt, "error": f"{type(exc).__name__}: {exc}"}
        if job.id in failures:
            say(
                f"job {job.id} failed {failures[job.id]['attempts']} time(s): "
                f"{failures[job.id]['error']}"
            )
    return failures


def _run_on_ray(
    todo: list[Job], out: Path, address: str, workers: int | None, retries: int, say
) -> dict[str, dict]:
    from headscope.scale.ray_scan import LOCAL, connect

    failures = {}
    with connect(None if address == LOCAL else address, workers or 1) as ray:
        task = ray.remote(num_cpus=1, max_retries=retries, retry_exceptions=True)(run_job)
        limit = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        pending, running = list(todo)[::-1], {}
        while pending or running:
            while pending and len(running) < limit:
                job = pending.pop()
                running[task.remote(job, str(out / "runs" / job.id))] = job
            ready, _ = ray.wait(list(running), num_returns=1)
            job = running.pop(ready[0])
            try:
                ray.get(ready[0])
                say(f"job done: {job.id}")
            except Exception as exc:
                cause = getattr(exc, "cause", None) or exc
                failures[job.id] = {
                    "attempts": retries + 1,
                    "error": f"{type(cause).__name__}: {cause}".splitlines()[0],
                }
                say(f"job {job.id} failed {retries + 1} time(s): {failures[job.id]['error']}")
    return failures


def atlas_table(
    out: str | Path, jobs: list[Job], failures: dict[str, dict] | None = None
) -> pd.DataFrame:
    """Every job's ``scores.csv`` rows with the job's columns; a failed job is one ``failed``
    row."""
    failures = failures or {}
    frames = []
    for job in jobs:
        cols = {
            "job": job.id,
            "model": job.model,
            "source": job.source,
            "checkpoint": job.checkpoint,
            "step": job.step,
            "seed": job.seed,
            "setting": job.setting,
        }
        path = Path(out) / "runs" / job.id / "scores.csv"
        if path.is_file():
            scores = pd.read_csv(path).drop(columns=["model"])
            frames.append(scores.assign(**cols, status="done", error=""))
        else:
            error = failures.get(job.id, {}).get("error", "not run")
            frames.append(pd.DataFrame([{**cols, "status": "failed", "error": error}]))
    atlas = pd.concat(frames, ignore_index=True)
    atlas["step"] = atlas["step"].astype("Int64")
    first = ["job", "model", "checkpoint", "step", "seed", "setting", "status"]
    return atlas[first + [c for c in atlas.columns if c not in first]]


def _write_outputs(
    out: Path,
    atlas: pd.DataFrame,
    failures: dict,
    say=None,
    figure_formats: Sequence[str] = ("png",),
) -> list[Path]:
    """The atlas tables first, then its figures (a figure that fails is noted in failures.json's
    ``figures_skipped`` and costs nothing else)."""
    from headscope.report.sweep import models_figure, steps_figure

    files = [out / "atlas.csv"]
    write_atomic(out / "atlas.csv", lambda p: atlas.to_csv(p, index=False))
    try:
        import pyarrow  # noqa: F401

        write_atomic(out / "atlas.parquet", lambda p: atlas.to_parquet(p, index=False))
        files.append(out / "atlas.parquet")
    except ImportError:
        pass
    notes: dict = {}
    settings = sorted(int(s) for s in atlas["setting"].dropna().unique())
    for setting in settings:  # the first setting's figures keep the plain names; others get -s<k>
        tag = "" if setting == settings[0] else f"-s{setting}"
        for name, draw in ((f"steps{tag}.png", steps_figure), (f"models{tag}.png", models_figure)):
            fig = optional(
                name,
                lambda draw=draw, setting=setting: draw(atlas, setting=setting),
                notes,
                "figures_skipped",
                say,
            )

            def save(fig=fig, name=name):
                return save_figure(fig, out / name, formats=figure_formats)

            if fig is not None and optional(name, save, notes, "figures_skipped", say) is not None:
                files.extend(figure_files(out / name, figure_formats))
    record = dict(failures, **({"figures_skipped": notes["figures_skipped"]} if notes else {}))
    write_atomic(out / "failures.json", lambda p: p.write_text(json.dumps(record, indent=1)))
    files.append(out / "failures.json")
    return files
