"""A whole scan as one function: probes -> streaming extraction -> a tidy report (-> a run
directory).

* :func:`scan` scores a loaded model on probes and returns a :class:`~headscope.result.ScanResult`
  that carries everything its run directory records (model, source, settings, versions, timings), so
  :func:`~headscope.rundir.store.save_run` writes the same ``metadata.json`` however it is called;
* :func:`scan_to_dir` is the ``headscope scan`` command as a function: checks, load, probes, scan,
  atomic save.

Both read one :class:`~headscope.scanner.config.ScanSettings`. The route of a setting, top to
bottom: ``cli/main.py`` builds the config from the options -> :func:`scan_to_dir` -> the probes
(:func:`~headscope.probes.defaults.build_probes`) -> :func:`scan` (engine, metrics, null, effects
via :meth:`~headscope.scanner.config.ScanSettings.effect_settings`, bootstrap) -> ``metadata.json``
(:meth:`~headscope.scanner.config.ScanSettings.record`) -> :func:`~headscope.rundir.store.save_run`.
From Python, settings may also be given as keywords (``scan(model, probes, metrics=["sink"])``).

>>> import headscope                                           # doctest: +SKIP
>>> model = headscope.load_model("smollm2-135m")               # doctest: +SKIP
>>> result = headscope.scan(model)                             # doctest: +SKIP
>>> result.scores.query("metric == 'induction'").nlargest(3, "score")   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from headscope.catalog import CIRCUIT
from headscope.effects.heads import check_model, head_effects
from headscope.engines.extract import MetricScores, score_probe
from headscope.engines.registry import resolve_engine
from headscope.errors import HeadscopeError, listening
from headscope.files import figure_formats as check_figure_formats
from headscope.models.loading import load_model
from headscope.models.placement import threads
from headscope.models.sources import resolve
from headscope.probes.defaults import build_probes, n_prompts
from headscope.probes.pairs import NULL_PROBE, null_probe
from headscope.report.tables import to_frame
from headscope.result import Probe, ScanResult, model_slug, timed
from headscope.rundir.record import run_record
from headscope.rundir.signals import interruptible
from headscope.rundir.store import check_out_dir, save_run
from headscope.scale.options import check_address, require_ray
from headscope.scanner.config import ScanSettings
from headscope.scanner.examples import example_patterns, pick_heads
from headscope.uncertainty import bootstrap as run_bootstrap
from headscope.uncertainty import passes_fn

__all__ = ["ScanResult", "default_out", "default_probes", "scan", "scan_to_dir"]


def default_probes(
    model,
    config: ScanSettings | None = None,
    *,
    probes: Sequence[str] | None = None,
    say: Callable[[str], None] | None = None,
    **settings,
) -> list[Probe]:
    """The probes ``config`` (or the keyword ``settings``, e.g. ``n_prompts=8, repeat_len=20``) asks
    for, built for ``model``: see :func:`~headscope.probes.defaults.build_probes`. ``probes`` names
    the ones wanted (default: text and repeat, plus the needle probe with ``long_context``)."""
    config = ScanSettings.configure(config, settings)
    if probes is None and config.metrics is None:
        probes = ("text", "repeat", "needle") if config.long_context else ("text", "repeat")
    return build_probes(model, config, probes, say)


def scan(
    model,
    probes: Sequence[Probe] | None = None,
    config: ScanSettings | None = None,
    *,
    progress=None,
    say: Callable[[str], None] | None = None,
    interventions: Sequence = (),
    scorer: Callable | None = None,
    **settings,
) -> ScanResult:
    """Score every head of ``model`` for every chosen metric; return a :class:`ScanResult`.

    ``config`` (default: every setting's default) may be amended by keyword ``settings``:
    ``metrics`` (names or :class:`~headscope.metrics.base.Metric` objects; default every default
    metric), ``thresholds``, ``engine``, ``batch_size``, ``effects`` (a mode, adding every head's
    causal effect and circuit scores: :mod:`headscope.effects.heads`, :mod:`headscope.circuits`),
    ``bootstrap``/``ci``/``seed`` (every score's interval and every label's stability:
    :mod:`headscope.uncertainty`), ``null`` (the repeat metrics again on sequences with no
    repetition: the ``null`` column) and ``examples`` (the strongest heads' patterns for the page).

    ``probes`` defaults to the config's (:func:`default_probes`). ``progress`` is an optional
    ``tqdm``-like factory ``progress(total=..., desc=...)``; ``say`` hears progress lines and
    notices. ``interventions`` (:mod:`headscope.models.attention`, e.g. ``ReplaceHeadOutput``) are
    applied in every forward of the pattern scan: where heads look with another head ablated.
    ``scorer`` replaces :func:`~headscope.engines.extract.score_probe` (same signature) for the
    pattern scores and the positional null: a :class:`headscope.scale.shard.ShardedScorer` shards
    them over workers with the same results.
    """
    config = ScanSettings.configure(config, settings)
    with listening(say):
        return _scan(model, probes, config, progress, say, interventions, scorer or score_probe)


def _scan(model, probes, config: ScanSettings, progress, say, interventions, score) -> ScanResult:
    probes = list(probes) if probes is not None else build_probes(model, config, say=say)
    chosen = config.metric_objects()
    thresholds = dict(config.thresholds)
    effects = config.effect_settings()
    if effects is not None:
        check_model(model, effects.mode)  # before any work
        if interventions:
            raise HeadscopeError(
                "Effects are measured on the model as it is; scan with interventions, or with "
                "effects, not both at once."
            )
    eng = resolve_engine(model, config.engine, chosen, interventions=bool(interventions))
    if say is not None:
        say(
            f"scanning {model.n_layers} layers x {model.n_heads} heads on {model.device} "
            f"({eng.name} engine)"
        )
    results: dict[str, MetricScores] = {}
    timings: dict[str, float] = {}

    def scored(probe: Probe, metrics, label: str) -> dict[str, MetricScores]:
        bar = progress(total=len(probe), desc=label) if progress else None
        try:
            return score(
                model,
                probe,
                metrics,
                config.batch_size,
                on_batch=bar.update if bar is not None else None,
                engine=eng.name,
                interventions=interventions,
            )
        finally:
            if bar is not None:
                bar.close()

    for probe in probes:
        with timed(timings, f"scan_{probe.name}_s"):
            results.update(scored(probe, chosen, f"{probe.name} probe"))
    ordered = [results[m.name] for m in chosen if m.name in results]
    metadata = {"engine": eng.name, "batch_size": config.batch_size or "auto"}
    nulls = {}
    repeat = next((p for p in probes if p.name == "repeat"), None)
    repeat_metrics = [m for m in chosen if m.probe == "repeat"]
    if (
        config.null
        and repeat is not None
        and repeat_metrics
        and not any(p.name == NULL_PROBE for p in probes)
    ):
        with timed(timings, "scan_repeat_null_s"):
            control = null_probe(repeat, model)
            # the repeat metrics, read at the same positions of sequences with no repetition
            nulls = {
                name: r.score
                for name, r in scored(
                    replace(control, name="repeat"), repeat_metrics, "positional null"
                ).items()
            }
            probes = [*probes, control]
    if effects is not None:
        with timed(timings, "effects_s"):
            extra = circuit_scores(
                model,
                [effects.subset(p) for p in probes],
                effects.batch_size or 8,
                say,
                timings,
                progress,
            )
            nulls.update(
                {r.metric.name: r.null for r in extra if getattr(r, "null", None) is not None}
            )
            effect_results = head_effects(model, probes, effects, list(ordered), say, timings)
            ordered += extra + effect_results
            metadata["effects"] = {
                "mode": effects.mode,
                "ablation": effects.ablation,
                "n_sequences": effects.n_sequences,
                "exact_heads": {
                    r.metric.name: int((r.estimator == "exact").sum())
                    for r in effect_results
                    if r.metric.name.startswith("effect_")
                },
            }
    intervals, per_sequence = None, {}
    if config.bootstrap:
        intervals = {}
        for r in ordered:
            if getattr(r, "seq_total", None) is None:
                continue
            intervals[r.metric.name] = run_bootstrap(
                r.seq_total,
                r.seq_count,
                passes_fn(r.metric, thresholds.get(r.metric.name)),
                config.bootstrap,
                config.ci,
                config.seed,
            )
            per_sequence[r.metric.name] = {
                "probe": r.metric.probe,
                "total": r.seq_total.numpy(),
                "count": r.seq_count.numpy(),
            }
        metadata["bootstrap"] = {
            "resamples": config.bootstrap,
            "level": config.ci,
            "seed": config.seed,
            "method": "percentile interval of the pooled score over sequences "
            "resampled with replacement; stability = share of resamples passing the label",
        }
    frame = to_frame(
        model.name, model.n_layers, model.n_heads, ordered, thresholds, intervals, nulls or None
    )
    views: dict = {}
    if config.examples:
        with timed(timings, "examples_s"):
            heads = pick_heads(frame)
            try:
                views = {
                    "heads": heads,
                    "examples": example_patterns(
                        model,
                        probes,
                        heads,
                        engine="hooks" if eng.reads_model_attention else "blocked",
                        interventions=interventions,
                    ),
                }
            # the report's views are extras: never lose a finished scan to them
            except Exception as exc:
                metadata["examples_skipped"] = (
                    str(exc) if isinstance(exc, HeadscopeError) else f"{type(exc).__name__}: {exc}"
                )
                if say is not None:
                    say(f"no example patterns for the report: {exc}")
    return ScanResult(
        model_name=model.name,
        scores=frame,
        probes=probes,
        metadata=run_metadata(model, probes, config, {**metadata, "timings": timings}),
        thresholds={
            r.metric.name: thresholds.get(r.metric.name, r.metric.threshold)
            for r in ordered
            if getattr(r.metric, "label", "")
        },
        per_sequence=per_sequence,
        views=views,
    )


def circuit_scores(
    model,
    probes: Sequence[Probe],
    batch_size: int,
    say=None,
    timings: dict | None = None,
    progress=None,
) -> list:
    """Every circuit score of the catalog (:data:`headscope.catalog.CIRCUIT`: ``copying``,
    ``value_sink``, ...) that applies to ``model`` and ``probes``, by the function its ``impl``
    names."""
    from importlib import import_module

    say = say or (lambda _msg: None)
    timings = {} if timings is None else timings
    by_name = {p.name: p for p in probes}
    out = []
    for info in CIRCUIT.values():
        module, attr = info.impl.split(":")
        t0 = time.perf_counter()
        got = getattr(import_module(module), attr)(model, by_name, batch_size, progress)
        if got is not None:
            say(f"circuits: {info.name} of every head")
            out.append(got)
            timings[f"{info.name}_s"] = round(time.perf_counter() - t0, 3)
    return out


def default_out(model) -> Path:
    """Where ``headscope scan MODEL`` writes without ``--out``: ``runs/<model slug>``."""
    return Path("runs") / model_slug(
        model if isinstance(model, str) else getattr(model, "name", "model")
    )


def scan_to_dir(
    model_name,
    out: str | Path | None = None,
    config: ScanSettings | None = None,
    *,
    tokenizer=None,
    force: bool = False,
    figures: bool = True,
    figure_formats: Sequence[str] = ("png",),
    say: Callable[[str], None] | None = None,
    progress=None,
    **settings,
) -> ScanResult:
    """``headscope scan``: check everything, load ``model_name``, scan, and save the run to ``out``.

    Every mistake a user can make (settings, prompts file, model name, an ``out`` that may not be
    written) is refused with one line before the model loads; nothing is written unless the whole
    run succeeds. ``model_name`` may also be a model in memory: a loaded :class:`Model`, a
    transformer-lens bridge, or a Hugging Face model with its ``tokenizer`` (``device`` and
    ``dtype`` then stay the model's own; see :func:`headscope.models.loading.load_model`). ``out``
    defaults to :func:`default_out`. ``say`` gets progress lines; ``progress`` is a ``tqdm``-like
    factory for the probes' progress bars. ``config.threads`` sets torch's CPU threads for the scan
    only. ``config.ray`` shards the pattern scan's batches over ``config.workers`` Ray actors
    (:mod:`headscope.scale`): the scores and tokens are those of the plain scan, bit for bit.
    ``figure_formats``: the files of each figure (png, svg, pdf; ``--figure-format``).
    """
    t_start = time.perf_counter()
    config = ScanSettings.configure(config, settings)
    figure_formats = check_figure_formats(figure_formats)
    say = say or (lambda _msg: None)
    out = default_out(model_name) if out is None else Path(out)
    in_memory = not isinstance(model_name, (str, os.PathLike))
    with interruptible(), listening(say):
        check_out_dir(out, force)
        if not in_memory:
            resolve(str(model_name))  # a typo is answered in milliseconds, before any loading
        if in_memory and config.ray is not None:
            raise HeadscopeError(
                "--ray needs a model name or checkpoint folder that every worker can load, not a "
                "model in memory."
            )
        if in_memory and config.device_map is not None:
            raise HeadscopeError(
                "--device-map loads a model by name; an in-memory model is used where it is."
            )
        if config.ray is not None:
            require_ray()
            check_address(config.ray)
        # the prompts file read and checked now, before the model loads (said when built)
        n_prompts(config)
        with contextlib.ExitStack() as stack:
            scorer = None
            # the actors load their replicas while this process loads its own
            if config.ray is not None:
                from headscope.scale.ray_scan import sharded

                say(
                    f"starting {config.workers or 1} Ray worker(s) "
                    f"({'local instance' if config.ray == 'local' else config.ray})"
                )
                scorer = stack.enter_context(
                    sharded(model_name, config.ray, config.workers, config.device, config.dtype)
                )
            stack.enter_context(threads(config.threads))
            t0 = time.perf_counter()
            placed = (
                {}
                if config.device_map is None
                else {"device_map": config.device_map, "max_memory": config.max_memory}
            )
            model = load_model(
                model_name,
                tokenizer,
                device=config.device,
                dtype=config.dtype,
                progress=say,
                **placed,
            )
            t_load = time.perf_counter() - t0
            probes = build_probes(model, config, say=say)
            result = _scan(model, probes, config, progress, say, (), scorer or score_probe)
            result.metadata["timings"] = {"load_s": round(t_load, 3), **result.metadata["timings"]}
            if config.ray is not None:
                result.metadata["ray"] = {"address": config.ray, "workers": config.workers or 1}
            save_run(
                result,
                out,
                force=force,
                figures=figures,
                started=t_start,
                say=say,
                figure_formats=figure_formats,
            )
    return result


def run_metadata(model, probes: Sequence[Probe], config: ScanSettings, scan_meta: dict) -> dict:
    """Everything ``metadata.json`` records about a scan: the one run record
    (:func:`headscope.rundir.record.run_record`: model, source, settings, versions) and what the
    scan itself measured (``scan_meta``: engine, batch size, effects, bootstrap, timings)."""
    return run_record(
        model,
        config,
        probes={p.name: {**p.settings, "n_sequences": len(p)} for p in probes},
        prompts=str(Path(config.prompts).resolve())
        if config.prompts
        else "builtin:headscope/data/pairs.tsv",
        token_type_ids=(
            "segment ids of each pair, saved in tokens.jsonl"
            if config.token_types
            else "all zero (sequences are fed as token ids alone)"
        ),
        engine=scan_meta.get("engine"),
        **{k: scan_meta[k] for k in ("effects", "bootstrap", "examples_skipped") if k in scan_meta},
        batch_size=scan_meta.get("batch_size"),
        timings=dict(scan_meta.get("timings", {})),
    )
