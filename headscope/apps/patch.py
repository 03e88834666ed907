"""``headscope.patch(model, task, ...)`` and ``headscope patch``: counterfactual patching of every
head on a task's prompt pairs (design.md section 10), its settings, its result, its run directory.

    task   = headscope.Task.from_pairs([(clean, corrupt, " Mary", " John"), ...])  # or a kit: "ioi"
    result = headscope.patch(model, task, activations=("z", "v"), positions=("all", "named"))
    result.table                          # tidy: a row per (activation, position, direction, head)
    save_patching(result, "runs/ioi")     # patching.csv, metadata.json, tokens.jsonl, figures, page

Estimators (the ``estimator`` column of every row):

* ``exact``: every head patched for real (:mod:`headscope.effects.patching`), the truth;
* ``attribution``: every head estimated to first order (:mod:`headscope.effects.patch_attribution`),
  always labelled so;
* ``both``: both, for every head (two rows per head);
* ``auto``: attribution for every head, and exact patching for the heads that matter: per
  (direction, activation, kv_mode, position), the top :data:`TOP_SHARE` of units by |attribution|
  (at least :data:`TOP_MIN`), as ``--effects auto`` chooses heads for ablation.

The run directory (written whole, :func:`headscope.files.publish_dir`; the ``--force`` rules of
:mod:`headscope.rundir.store`, for a patching run)::

    OUT/
      patching.csv        the tidy table (PatchResult.table; columns COLUMNS of effects.patch_table)
      baseline.csv        clean and corrupt metric and their gap, with intervals; share correct
      dla.csv             every head's direct logit attribution, clean and corrupt prompts
      tokens.jsonl        one line per pair: clean and corrupt ids, answer and wrong ids, positions
      pattern_scores.csv  with ``--scan RUN_DIR``: that scan's pattern scores of every head
      metadata.json       model, source, weights sha256, task and its provenance, settings, seed,
                          versions, timings, the baseline, the files
      *.png               a layer x head heatmap per (activation, position, direction, kv_mode), the
                          per-position grid, the DLA heatmap
      report.html         the page (:mod:`headscope.report.patch_page`), from the files above

Tables first, then figures and the page: a figure or the page that fails costs only itself
(``figures_skipped`` / ``report_skipped`` in ``metadata.json``).

Importing this module loads no torch (``headscope patch --help`` is instant); the work imports it.
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from headscope.effects.settings import (
    PATCH_ACTIVATIONS,
    PATCH_DIRECTIONS,
    PATCH_ESTIMATORS,
    PATCH_KV_MODES,
)
from headscope.errors import HeadscopeError, at_least, did_you_mean, listening, setting
from headscope.files import optional
from headscope.models.sources import check_dtype
from headscope.probes.kits import N_PAIRS
from headscope.probes.tasks import END, METRICS
from headscope.result import FLOAT_FORMAT
from headscope.scanner.config import opt
from headscope.uncertainty import check as check_bootstrap

if TYPE_CHECKING:  # pragma: no cover - pandas is imported where a table is made or read
    import pandas as pd

KV_MODE_CHOICES = ("both", *PATCH_KV_MODES)
TOP_SHARE, TOP_MIN = 0.1, 10
#: The tables of a patching run, written before any figure.
TABLES = (
    "patching.csv",
    "baseline.csv",
    "dla.csv",
    "tokens.jsonl",
    "pattern_scores.csv",
    "metadata.json",
)
REPORT = "report.html"
#: Scan scores shown beside each head's effect (those the scan has).
PATTERN_SCORES = ("induction", "previous_token", "duplicate_token", "sink", "copying")


@dataclass(frozen=True)
class PatchConfig:
    """Everything a patching run is made with but the model and the task (and, for the run
    directory, where it goes and which scan it is read beside)."""

    activations: tuple = opt(
        ("z",),
        "What to patch, comma-separated: z (each head's output, the input of "
        "the output projection), q, k, v, pattern.",
        kind="csv",
        choices=PATCH_ACTIVATIONS,
    )
    positions: tuple = opt(
        ("all",),
        "Where, comma-separated: all (every position at once), each (one "
        "position at a time: the layer x head x position grid), named (the "
        "task's named positions and END), or names such as END,S2.",
        kind="csv",
    )
    directions: tuple = opt(
        PATCH_DIRECTIONS,
        "denoising (clean into corrupt: share of the gap restored) "
        "and/or noising (corrupt into clean: share destroyed).",
        kind="csv",
        choices=PATCH_DIRECTIONS,
    )
    estimator: str = opt(
        "auto",
        "auto (attribution for every head, exact patching for the top ones), "
        "exact, attribution (a first-order estimate, labelled so) or both.",
        choices=PATCH_ESTIMATORS,
    )
    kv_mode: str = opt(
        "both",
        "k/v of grouped-query models: group (patch the KV head: every query head "
        "sharing it sees the change), head (only what one query head reads) or both.",
        choices=KV_MODE_CHOICES,
    )
    metric: str | None = opt(
        None,
        "Read at the last position: logit_diff (logit[answer] - logit[wrong]), "
        "prob (of the answer) or loss (of the answer). [default: the task's, "
        "logit_diff for kits and files]",
        choices=METRICS,
    )
    n_pairs: int | None = opt(
        None,
        f"Pairs: drawn from a kit, or the first N of a file. [default: {N_PAIRS} "
        "from a kit, every pair of a file]",
    )
    templates: tuple | None = opt(
        None,
        "A kit's templates to draw from, comma-separated indices (one "
        "template: every pair has one length, as positions=each needs). "
        "[default: all]",
        kind="csv",
    )
    seed: int = opt(0, "Seed of a kit's pairs and of the bootstrap.")
    bootstrap: int = opt(1000, "Resamples of the pairs for every interval (0: none).")
    ci: float = opt(0.95, "Coverage of the intervals.")
    batch_size: int = opt(32, "Pairs per forward pass.")
    dla: bool = opt(True, "Also every head's direct logit attribution at the last position.")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N or mps.")
    dtype: str | None = opt(
        None, "Model weights dtype: float32, bfloat16 or float16. [default: float32]"
    )
    threads: int | None = opt(None, "CPU threads for torch. [default: torch's choice]")

    def __post_init__(self) -> None:
        def put(name, value):
            object.__setattr__(self, name, value)

        for name in ("activations", "positions", "directions"):
            value = getattr(self, name)
            items = value.split(",") if isinstance(value, str) else list(value)
            put(name, tuple(dict.fromkeys(str(v).strip() for v in items if str(v).strip())))
        for name in ("estimator", "kv_mode"):
            put(name, str(getattr(self, name)).strip().lower())
        put("templates", template_indices(self.templates))
        self._check()

    def _check(self) -> None:
        for name, allowed in (("activations", PATCH_ACTIVATIONS), ("directions", PATCH_DIRECTIONS)):
            values = getattr(self, name)
            if not values:
                raise HeadscopeError(
                    f"{setting(name)} is empty; give one or more of {', '.join(allowed)}."
                )
            for v in values:
                if v not in allowed:
                    raise HeadscopeError(
                        f"Unknown {name[:-1]} '{v}' ({setting(name)}).{did_you_mean(v, allowed)} "
                        f"Use {', '.join(allowed)}."
                    )
        if not self.positions:
            raise HeadscopeError(
                f"{setting('positions')} is empty; give all, each, named or position names."
            )
        for name, allowed in (("estimator", PATCH_ESTIMATORS), ("kv_mode", KV_MODE_CHOICES)):
            value = getattr(self, name)
            if value not in allowed:
                raise HeadscopeError(
                    f"Unknown {setting(name)} '{value}'.{did_you_mean(value, allowed)} "
                    f"Use one of {', '.join(allowed)}."
                )
        if self.metric is not None and self.metric not in METRICS:
            raise HeadscopeError(
                f"Unknown {setting('metric')} '{self.metric}'."
                f"{did_you_mean(self.metric, METRICS)} "
                f"Use one of {', '.join(METRICS)}."
            )
        for name in ("n_pairs", "batch_size", "threads"):
            at_least(name, getattr(self, name))
        check_bootstrap(self.bootstrap, self.ci)
        check_dtype(self.dtype)

    def record(self) -> dict:
        """The settings as saved in ``metadata.json``."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def changed(self) -> dict:
        """The recorded settings that differ from their defaults."""
        default = PatchConfig().record()
        return {k: v for k, v in self.record().items() if v != default[k]}

    @classmethod
    def settings(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def template_indices(value) -> tuple[int, ...] | None:
    """A kit's ``templates`` setting (``"0,3"`` or a sequence) as indices, or one line."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        return tuple(int(t) for t in items if str(t).strip())
    except (TypeError, ValueError):
        raise HeadscopeError(
            f"{setting('templates')} are template indices such as 0,3; got {value!r}."
        ) from None


def configure(config: PatchConfig | None, settings: dict) -> PatchConfig:
    """``config`` with the keyword ``settings`` of the Python API applied (checked once)."""
    unknown = [k for k in settings if k not in PatchConfig.settings()]
    if unknown:
        raise HeadscopeError(
            f"Unknown setting '{unknown[0]}'.{did_you_mean(unknown[0], PatchConfig.settings())} "
            f"Settings: {', '.join(PatchConfig.settings())}."
        )
    settings = {k: (tuple(v) if isinstance(v, list) else v) for k, v in settings.items()}
    if config is None:
        return PatchConfig(**settings)
    return replace(config, **settings) if settings else config


# ------------------------------------------------------------------------------ the result


@dataclass
class PatchResult:
    """What :func:`patch` returns (and :func:`load_patching` reads back, without ``per_pair``).

    ``table``: one row per patch (:data:`headscope.effects.patch_table.COLUMNS`); ``baseline``: the
    clean and corrupt metric and their gap with intervals; ``dla``: every head's direct logit
    attribution on the clean and the corrupt prompts (None without); ``tokens``: the tokenized task
    (:class:`~headscope.probes.tasks.TokenizedTask`); ``example``: pair 0's tokens as text (for the
    per-position figure); ``per_pair``: ``m_clean``, ``m_corrupt`` and ``m_patched`` (``[row,
    pair]``, rows in ``table`` order) for recomputing anything; ``metadata``: what ``metadata.json``
    holds (filled by :func:`patch` and completed when saved).
    """

    task: str
    model: str
    metric: str
    table: pd.DataFrame
    baseline: pd.DataFrame
    dla: pd.DataFrame | None
    tokens: object
    example: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    per_pair: dict = field(default_factory=dict, repr=False)
    pattern_scores: pd.DataFrame | None = None

    def top(self, n: int = 10, **where) -> pd.DataFrame:
        """The ``n`` rows with the largest |effect| of those matching ``where`` (column=value)."""
        t = self.table
        for k, v in where.items():
            t = t[t[k] == v]
        return t.reindex(t["effect"].abs().sort_values(ascending=False).index).head(n)


def _positions(positions: Sequence[str], tt) -> list[str]:
    named = list(tt.positions)
    allowed = ["all", "each", "named", *named]
    out = []
    for p in positions:
        if p not in allowed and not p.isdigit():
            raise HeadscopeError(
                f"Unknown position '{p}' ({setting('positions')}).{did_you_mean(p, allowed)} "
                f"Use {', '.join(allowed)} or a token index."
            )
        if p.isdigit() and int(p) >= min(tt.lengths):
            raise HeadscopeError(
                f"Position {p} ({setting('positions')}) is past the end of the shortest pair "
                f"({min(tt.lengths)} tokens); use 0..{min(tt.lengths) - 1}."
            )
        out.extend([n for n in named if n != END] + [END] if p == "named" else [p])
    if "each" in out and len(set(tt.lengths)) > 1:
        raise HeadscopeError(
            f"positions=each needs every pair to have one length; task '{tt.name}' has lengths "
            f"{min(tt.lengths)}..{max(tt.lengths)} (use one template: {setting('templates')} 0)."
        )
    return list(dict.fromkeys(out))


def check_model(model) -> None:
    """One line for a model patching cannot read (an encoder, no LM head, rescaled logits)."""
    from headscope.effects.readout import check_logits
    from headscope.probes.tasks import check_model as check_decoder

    check_decoder(model)
    check_logits(model)


def patch(
    model,
    task,
    config: PatchConfig | None = None,
    *,
    say: Callable[[str], None] | None = None,
    **settings,
) -> PatchResult:
    """Patch every head of ``model`` on ``task`` (a :class:`~headscope.probes.tasks.Task`, a
    :class:`~headscope.probes.tasks.TokenizedTask`, a kit name or a ``.jsonl`` / ``.tsv`` file).

    ``config`` (a :class:`PatchConfig`) or keyword ``settings`` (its fields: ``activations``,
    ``positions``, ``directions``, ``estimator``, ``kv_mode``, ``metric``, ``n_pairs``, ``seed``,
    ``bootstrap``, ...) say what is patched and how; ``say`` hears progress lines.
    """
    import torch

    from headscope.effects.logit_attribution import direct_logit_attribution
    from headscope.effects.patch_attribution import attribution_patching
    from headscope.effects.patch_table import baseline_table, dla_table, effect_table
    from headscope.effects.patching import (
        Request,
        baseline_metrics,
        exact_patching,
        make_batches,
        n_units,
    )
    from headscope.probes.kits import resolve_task
    from headscope.probes.tasks import TokenizedTask

    config = configure(config, settings)
    say = say or (lambda _m: None)
    timings: dict[str, float] = {}
    check_model(model)
    if isinstance(task, TokenizedTask):
        tt, provenance = task, {"source": "tokenized in code"}
        if config.metric is not None:
            tt = TokenizedTask(
                tt.name,
                tt.clean,
                tt.corrupt,
                tt.answer,
                tt.wrong,
                tt.positions,
                config.metric,
                tt.info,
            )
    else:
        templates = list(config.templates) if config.templates is not None else None
        t = resolve_task(task, model, config.metric, config.n_pairs, config.seed, templates)
        tt, provenance = t.tokenize(model), dict(t.provenance)
    tt = tt.subset(config.n_pairs)
    pos = _positions(config.positions, tt)
    kinds, dirs, est = list(config.activations), list(config.directions), config.estimator
    gqa = model.n_kv_heads < model.n_heads
    wanted_kv = list(PATCH_KV_MODES) if config.kv_mode == "both" else [config.kv_mode]
    run_kv = (
        wanted_kv if gqa else ["head"]
    )  # without GQA a KV head is its query head: computed once
    batches = make_batches(tt, config.batch_size, model.pad_id)
    n = len(tt)
    combos = [
        (d, k, m) for d in dirs for k in kinds for m in (run_kv if k in ("k", "v") else ["head"])
    ]

    attribution = {}
    if est in ("attribution", "both", "auto"):
        say(f"patching: attribution estimates for every head ({', '.join(kinds)}; {n} pairs)")
        t0 = time.perf_counter()
        attribution = attribution_patching(model, batches, n, tt.metric, kinds, run_kv, pos, dirs)
        timings["attribution_s"] = round(time.perf_counter() - t0, 3)
    requests = []
    if est != "attribution":
        for d, k, m in combos:
            every = tuple(
                (la, u) for la in range(model.n_layers) for u in range(n_units(model, k, m))
            )
            if est in ("exact", "both"):
                requests.append(Request(d, k, m, tuple(pos), every))
                continue
            for label in dict.fromkeys(key[3] for key in attribution if key[:3] == (d, k, m)):
                a = attribution[(d, k, m, label)].mean(0)  # [layer, unit]
                top = (
                    a.abs()
                    .flatten()
                    .argsort(descending=True)[: max(TOP_MIN, math.ceil(TOP_SHARE * a.numel()))]
                )
                units = tuple(sorted((int(i) // a.shape[1], int(i) % a.shape[1]) for i in top))
                requests.append(Request(d, k, m, (label,), units))
    exact, base = {}, {}
    if requests:
        say(
            f"patching: exact patches of {sum(len(r.units) * len(r.positions) for r in requests)} "
            "(head, position) pairs"
        )
        t0 = time.perf_counter()
        exact = exact_patching(model, batches, n, tt.metric, requests, baseline=base)
        timings["exact_s"] = round(time.perf_counter() - t0, 3)
    else:
        base = baseline_metrics(model, batches, n, tt.metric)

    keys, patched = [], []
    for (d, k, m, label), e in attribution.items():
        base_m = base["corrupt" if d == "denoising" else "clean"]
        for la in range(e.shape[1]):
            for u in range(e.shape[2]):
                keys.append((d, k, m, label, la, u, "attribution"))
                patched.append(base_m + e[:, la, u])
    for (d, k, m, label, la, u), v in sorted(exact.items()):
        keys.append((d, k, m, label, la, u, "exact"))
        patched.append(v)
    if not gqa and "group" in wanted_kv:  # the group rows are the head rows, relabelled
        extra = [(i, key) for i, key in enumerate(keys) if key[1] in ("k", "v")]
        keys += [(*key[:2], "group", *key[3:]) for _, key in extra]
        patched += [patched[i] for i, _ in extra]
        if "head" not in wanted_kv:
            keep = [
                i for i, key in enumerate(keys) if not (key[1] in ("k", "v") and key[2] == "head")
            ]
            keys, patched = [keys[i] for i in keep], [patched[i] for i in keep]
    matrix = (
        torch.stack(patched) if patched else torch.zeros(0, n, dtype=torch.float64)
    )  # [row, pair]
    b, level, seed = config.bootstrap, config.ci, config.seed
    table = effect_table(
        keys,
        base["clean"],
        base["corrupt"],
        matrix,
        tt.name,
        model.n_heads,
        model.n_kv_heads,
        b,
        level,
        seed,
    )
    dla = None
    if config.dla:
        t0 = time.perf_counter()
        dla = dla_table(
            tt.name,
            {p: direct_logit_attribution(model, batches, n, p) for p in ("clean", "corrupt")},
            b,
            level,
            seed,
        )
        timings["dla_s"] = round(time.perf_counter() - t0, 3)
    baseline = baseline_table(tt.name, tt.metric, base, b, level, seed)
    example = {
        "pair": 0,
        "clean": model.str_tokens(tt.clean[0]),
        "corrupt": model.str_tokens(tt.corrupt[0]),
    }
    meta = {
        "run_kind": "patching",
        "model": model.name,
        "task": tt.name,
        "task_provenance": provenance,
        "metric": tt.metric,
        "n_pairs": n,
        "positions_run": pos,
        "gqa_group": model.n_heads // model.n_kv_heads,
        "settings": config.record(),
        "settings_changed": config.changed(),
        "seed": config.seed,
        "timings": timings,
        **model_record(model),
    }
    return PatchResult(
        tt.name,
        model.name,
        tt.metric,
        table,
        baseline,
        dla,
        tt,
        example,
        meta,
        {"m_clean": base["clean"], "m_corrupt": base["corrupt"], "m_patched": matrix},
    )


def model_record(model) -> dict:
    """What ``metadata.json`` records about the model and where it ran (as a scan's does)."""
    import torch

    source = {"kind": model.source.kind, **model.provenance}
    if model.source.kind == "memory":  # no weights file to hash: the weights themselves
        source["state_dict_sha256"] = model.fingerprint()
    return {
        "source": source,
        "n_layers": model.n_layers,
        "n_heads": model.n_heads,
        "n_kv_heads": model.n_kv_heads,
        "d_head": model.d_head,
        "causal": model.causal,
        "device": str(model.device),
        "dtype": str(model.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "versions": versions(),
    }


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from headscope import __version__

    out = {"headscope": __version__}
    for dist in ("torch", "transformers", "transformer-lens"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    out["python"] = platform.python_version()
    return out


# ------------------------------------------------------------------------------ beside a scan


def scan_scores(run_dir: str | Path) -> tuple[pd.DataFrame, dict]:
    """The pattern scores of a scan's run directory (one row per metric and head, the metrics of
    :data:`PATTERN_SCORES` it has) and its metadata; one line when it is not a scan run."""
    from headscope.rundir.store import is_run_dir, load_run

    path = Path(run_dir)
    if not is_run_dir(path):
        raise HeadscopeError(
            f"--scan '{run_dir}' is not a headscope scan run directory (no scores.csv with its "
            "metadata.json); give a folder written by `headscope scan`."
        )
    run = load_run(path)
    s = run.scores
    s = s[s["metric"].isin(PATTERN_SCORES)]
    cols = [
        c
        for c in ("metric", "layer", "head", "head_name", "score", "ci_low", "ci_high", "label")
        if c in s.columns
    ]
    return s[cols].reset_index(drop=True), run.metadata


def check_same_model(model, scan_meta: dict, run_dir) -> None:
    """Refuse a scan of another model (its weights' sha256, else its name, and its shape)."""
    src = scan_meta.get("source") or {}
    mine = model_record_light(model)
    shape = (scan_meta.get("n_layers"), scan_meta.get("n_heads"))
    if shape != (model.n_layers, model.n_heads):
        raise HeadscopeError(
            f"--scan '{run_dir}' is a run of {scan_meta.get('model')} ({shape[0]} layers x "
            f"{shape[1]} heads), not of {model.name} ({model.n_layers} x {model.n_heads}); give a "
            "scan of the same model."
        )
    for key in ("weights_sha256", "state_dict_sha256"):
        if src.get(key) and mine.get(key):
            if src[key] != mine[key]:
                raise HeadscopeError(
                    f"--scan '{run_dir}' is a run of other weights ({key} {src[key][:12]}..., "
                    f"{model.name}'s is {mine[key][:12]}...); give a scan of the same model."
                )
            return
    if scan_meta.get("model") != model.name:
        raise HeadscopeError(
            f"--scan '{run_dir}' is a run of {scan_meta.get('model')}, not of {model.name}; "
            "give a scan of the same model."
        )


def model_record_light(model) -> dict:
    out = dict(model.provenance)
    if model.source.kind == "memory":
        out["state_dict_sha256"] = model.fingerprint()
    return out


# ------------------------------------------------------------------------------ the run directory


def save_patching(
    result: PatchResult,
    out: str | Path,
    *,
    force: bool = False,
    figures: bool = True,
    say: Callable[[str], None] | None = None,
    started: float | None = None,
    figure_formats: Sequence[str] | None = None,
) -> Path:
    """Write ``result`` to the run directory ``out`` (see the module docstring), published whole;
    an existing ``out`` is replaced only with ``force`` and only when it is a patching run (or
    empty). ``figure_formats``: each figure as png (the default), svg and/or pdf.
    ``result.metadata`` becomes what was saved."""
    from headscope.rundir.store import PATCH_RUN_FORMAT, check_out_dir, publish_run

    out = check_out_dir(out, force, PATCH_RUN_FORMAT)
    t0 = time.perf_counter()
    result.metadata = publish_run(
        out,
        force,
        PATCH_RUN_FORMAT,
        lambda tmp: _write(result, tmp, figures, say, t0, started, figure_formats),
    )
    return out


def _write(
    result: PatchResult,
    tmp: Path,
    figures: bool,
    say,
    t0: float,
    started: float | None,
    figure_formats: Sequence[str] | None = None,
) -> dict:
    from headscope.rundir.store import PATCH_RUN_FORMAT

    tt = result.tokens
    result.table.to_csv(tmp / "patching.csv", index=False, float_format=FLOAT_FORMAT, na_rep="NaN")
    result.baseline.to_csv(
        tmp / "baseline.csv", index=False, float_format=FLOAT_FORMAT, na_rep="NaN"
    )
    if result.dla is not None:
        result.dla.to_csv(tmp / "dla.csv", index=False, float_format=FLOAT_FORMAT, na_rep="NaN")
    if result.pattern_scores is not None:
        result.pattern_scores.to_csv(
            tmp / "pattern_scores.csv", index=False, float_format=FLOAT_FORMAT, na_rep="NaN"
        )
    tt.write_jsonl(tmp / "tokens.jsonl")
    meta = {
        k: v
        for k, v in result.metadata.items()
        if k not in ("figures_skipped", "report_skipped", "files")
    }
    base = result.baseline.set_index("prompt")
    meta.update(
        run_format=PATCH_RUN_FORMAT,
        run_kind="patching",
        model=result.model,
        task=result.task,
        metric=result.metric,
        example=result.example,
        baseline={p: base.loc[p].drop("task").to_dict() for p in base.index},
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    meta["timings"] = dict(meta.get("timings", {}), write_s=round(time.perf_counter() - t0, 3))
    if started is not None:
        meta["timings"]["total_s"] = round(time.perf_counter() - started, 3)

    def record() -> None:
        meta["files"] = sorted(p.name for p in tmp.iterdir() if not p.name.startswith("."))
        if "metadata.json" not in meta["files"]:
            meta["files"] = sorted([*meta["files"], "metadata.json"])
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")

    record()  # the tables and their record are complete before any figure is drawn
    if figures:
        optional(
            "the figures",
            lambda: _figures(result, tmp, figure_formats),
            meta,
            "figures_skipped",
            say,
        )
    optional(REPORT, lambda: _page(tmp, figures), meta, "report_skipped", say)
    record()
    return meta


def _figures(result: PatchResult, tmp: Path, formats: Sequence[str] | None = None) -> None:
    from headscope.report.patching import save_patch_figures

    save_patch_figures(
        result.table,
        result.dla,
        tmp,
        model=result.model,
        tokens=result.example.get("clean"),
        formats=formats,
    )


def _page(run_dir: Path, figures: bool) -> None:
    from headscope.report.patch_page import patch_page_html

    run = load_patching(run_dir)
    (run_dir / REPORT).write_text(
        patch_page_html(
            run.table, run.baseline, run.dla, run.metadata, run.pattern_scores, figures=figures
        ),
        encoding="utf-8",
    )


def load_patching(path: str | Path) -> PatchResult:
    """Read a patching run directory back (tables, tokens, metadata; no per-pair values)."""
    import pandas as pd

    from headscope.probes.tasks import TokenizedTask
    from headscope.rundir.store import PATCH_RUN_FORMAT, read_metadata

    path = Path(path)
    meta = read_metadata(path)
    if (
        meta is None
        or meta.get("run_format") != PATCH_RUN_FORMAT
        or not (path / "patching.csv").is_file()
    ):
        raise HeadscopeError(
            f"'{path}' is not a headscope patching run (no patching.csv with its metadata.json); "
            "give a folder written by `headscope patch`."
        )

    def read(name: str, str_cols=()) -> pd.DataFrame | None:
        if not (path / name).is_file():
            return None
        return pd.read_csv(
            path / name,
            keep_default_na=False,
            na_values=["NaN", "nan", ""],
            dtype={c: str for c in str_cols},
        )

    table = read("patching.csv", ("position", "query_heads", "head_name"))
    tokens = None
    if (path / "tokens.jsonl").is_file():
        name, metric = meta.get("task", ""), meta.get("metric", "logit_diff")
        tokens = TokenizedTask.read_jsonl(path / "tokens.jsonl", name, metric)
    return PatchResult(
        meta.get("task", ""),
        meta.get("model", ""),
        meta.get("metric", ""),
        table,
        read("baseline.csv", ("prompt",)),
        read("dla.csv", ("head_name",)),
        tokens,
        meta.get("example", {}),
        meta,
        {},
        read("pattern_scores.csv", ("head_name", "label")),
    )


def patch_to_dir(
    model_name,
    task,
    out: str | Path,
    config: PatchConfig | None = None,
    *,
    scan: str | Path | None = None,
    tokenizer=None,
    force: bool = False,
    figures: bool = True,
    say: Callable[[str], None] | None = None,
    figure_formats: Sequence[str] | None = None,
    **settings,
) -> PatchResult:
    """``headscope patch``: check everything, load ``model_name``, patch, save the run to ``out``.

    Every mistake a user can make (settings, the task file or kit, ``--scan``, an ``out`` that may
    not be written, the model name) is refused with one line before the model loads; what needs
    the model (an encoder, an answer that is not one token, pairs of different lengths, a scan of
    another model) is refused before any forward pass. Nothing is written unless the run succeeds.
    """
    import os

    from headscope.models.loading import load_model
    from headscope.models.sources import resolve
    from headscope.probes.kits import check_task
    from headscope.rundir.store import PATCH_RUN_FORMAT, check_out_dir

    t_start = time.perf_counter()
    config = configure(config, settings)
    say = say or (lambda _m: None)
    out = Path(out)
    with listening(say):
        check_out_dir(out, force, PATCH_RUN_FORMAT)
        checked = check_task(task)
        if not isinstance(checked, str) and config.templates:
            raise HeadscopeError(
                f"{setting('templates')} choose a kit's templates; '{task}' is a file of pairs."
            )
        pattern, scan_meta = scan_scores(scan) if scan is not None else (None, None)
        in_memory = not isinstance(model_name, (str, os.PathLike))
        if not in_memory:
            resolve(str(model_name))  # a typo is answered before any loading
        with contextlib.ExitStack() as stack:
            if config.threads is not None:
                stack.enter_context(_threads(config.threads))
            t0 = time.perf_counter()
            model = load_model(
                model_name, tokenizer, device=config.device, dtype=config.dtype, progress=say
            )
            t_load = time.perf_counter() - t0
            check_model(model)
            if scan_meta is not None:
                check_same_model(model, scan_meta, scan)
            say(
                f"patching {model.n_layers} layers x {model.n_heads} heads of {model.name} on "
                f"{model.device}"
            )
            result = patch(model, checked, config, say=say)
            result.metadata["timings"] = {"load_s": round(t_load, 3), **result.metadata["timings"]}
            if pattern is not None:
                result.pattern_scores = pattern
                result.metadata["scan"] = {
                    "run_dir": str(Path(scan).resolve()),
                    "model": scan_meta.get("model"),
                    "source": scan_meta.get("source"),
                    "metrics": sorted(pattern["metric"].unique()),
                }
            save_patching(
                result,
                out,
                force=force,
                figures=figures,
                say=say,
                started=t_start,
                figure_formats=figure_formats,
            )
    return result


@contextlib.contextmanager
def _threads(n: int):
    """torch's CPU threads set to ``n`` for one block, and put back after."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
