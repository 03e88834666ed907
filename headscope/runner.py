"""A whole scan as one function: probes -> streaming extraction -> a tidy report (-> a run directory).

* :func:`scan` scores a loaded model on probes and returns a :class:`~headscope.result.ScanResult`;
* :func:`scan_to_dir` is the ``headscope scan`` command as a function: checks, load, probes, scan,
  metadata, atomic save. The CLI only parses options into a :class:`~headscope.config.ScanConfig`
  and prints what this returns.

>>> import headscope                                           # doctest: +SKIP
>>> model = headscope.load_model("smollm2-135m")               # doctest: +SKIP
>>> result = headscope.scan(model)                             # doctest: +SKIP
>>> result.scores.query("metric == 'induction'").nlargest(3, "score")   # doctest: +SKIP
"""

from __future__ import annotations

import platform
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from headscope import kernels
from headscope.catalog import check_score_name
from headscope.circuits.copying import copying_scores
from headscope.circuits.value_weighted import value_sink_scores
from headscope.config import LONG_SEQ_LEN, ScanConfig
from headscope.effects import EffectSettings, check_model, head_effects
from headscope.engines import AUTO, resolve_engine
from headscope.errors import HeadscopeError, at_least
from headscope.examples import example_patterns, pick_heads
from headscope.extract import MetricScores, score_probe
from headscope.loading import check_device_map, load_model
from headscope.metrics import Metric, default_metrics, get_metric
from headscope.probes import (
    NULL_PROBE,
    load_pairs,
    null_probe,
    packed_text_probe,
    repeat_len_for,
    repeat_probe,
    text_probe,
)
from headscope.report import to_frame
from headscope.result import METRIC_NAME, Probe, ScanResult, model_slug
from headscope.rundir import check_out_dir, interruptible, save_run
from headscope.sources import check_dtype, resolve
from headscope.uncertainty import LEVEL, RESAMPLES, passes_fn
from headscope.uncertainty import bootstrap as run_bootstrap
from headscope.uncertainty import check as check_bootstrap

__all__ = ["ScanResult", "default_out", "default_probes", "scan", "scan_to_dir"]

_DEFAULT = ScanConfig()
_LONG = LONG_SEQ_LEN


def default_probes(
    model,
    n_prompts: int = _DEFAULT.n_prompts,
    repeat_len: int = _DEFAULT.repeat_len,
    seed: int = _DEFAULT.seed,
    prompts: str | None = None,
    seq_len: int | None = None,
    probes: Sequence[str] = ("text", "repeat"),
    text_join: str = _DEFAULT.text_join,
    token_types: bool = _DEFAULT.token_types,
    long_context: bool = False,
    band: tuple[int, int] = (_DEFAULT.sinks, _DEFAULT.window),
    needle_tokens: int = _DEFAULT.needle_tokens,
    say=None,
) -> list[Probe]:
    """The text probe (first ``n_prompts`` pairs) and ``n_prompts`` repeat sequences (or only the
    ``probes`` named). ``text_join`` and ``token_types``: see :func:`~headscope.probes.text_probe`.

    With ``seq_len``, every sequence is ``seq_len`` tokens long: the text probe is long real prose
    (:func:`~headscope.long_probes.long_text_probe`; with ``prompts``, those pairs packed, never
    wrapped), and the repeat probe uses the longest ``R`` that fits (``repeat_len`` is then ignored).

    ``long_context``: the text probe is long prose of ``seq_len`` tokens (default 2048), at most as
    many sequences as the corpus holds (``say`` hears when fewer than ``n_prompts``), carrying the
    streaming metric's ``band`` (sinks, window); and ``"needle"`` in ``probes`` adds a needle probe of
    ``needle_tokens`` tokens at lengths ``seq_len / 4, / 2, x 1`` and 5 depths.
    """
    from headscope.long_probes import (
        check_fits,
        corpus_ids,
        long_text_probe,
        needle_min_length,
        needle_probe,
    )

    if long_context:  # an encoder or a context too short is refused before any corpus is fetched
        check_fits(model, seq_len or _LONG)
    out = []
    if "text" in probes:
        if long_context:
            n_long = seq_len or _LONG
            fits = len(corpus_ids(model, "scan", say)) // (n_long - 1)
            n = min(n_prompts, max(fits, 1))
            if n < n_prompts and say is not None:
                say(f"the long prose corpus holds {fits} distinct {n_long}-token sequences: scanning {n}, not "
                    f"{n_prompts} (text is never repeated to fill a sequence)")
            text = long_text_probe(model, n_long, n, progress=say)
            text.settings["band"] = list(band)
            out.append(text)
        elif seq_len is not None and prompts is None:
            out.append(long_text_probe(model, seq_len, n_prompts, progress=say))
        else:
            pairs = load_pairs(prompts)
            out.append(text_probe(model, pairs, n_prompts, join=text_join, token_types=token_types) if seq_len is None
                       else packed_text_probe(model, pairs, seq_len, n_prompts))
    if "repeat" in probes:
        L = repeat_len if seq_len is None else repeat_len_for(model, seq_len)
        out.append(repeat_probe(model, repeat_len=L, n_sequences=n_prompts, seed=seed))
    if "needle" in probes:
        n_long = seq_len or _LONG
        shortest = needle_min_length(model, needle_tokens) + 16  # a haystack of at least 16 tokens
        lengths = sorted({max(n_long // 4, shortest), max(n_long // 2, shortest), n_long})
        out.append(needle_probe(model, lengths, k=needle_tokens, seed=seed, progress=say))
    return out


def scan(
    model,
    probes: Sequence[Probe] | None = None,
    metrics: Sequence[str | Metric] | None = None,
    batch_size: int | None = None,
    thresholds: dict[str, float] | None = None,
    progress=None,
    engine: str = AUTO,
    effects: EffectSettings | None = None,
    say=None,
    interventions: Sequence = (),
    bootstrap: int = RESAMPLES,
    ci: float = LEVEL,
    bootstrap_seed: int = 0,
    null: bool = True,
    examples: bool = True,
    scorer: Callable | None = None,
) -> ScanResult:
    """Score every head of ``model`` for every metric; return a :class:`ScanResult`.

    ``probes`` defaults to :func:`default_probes`; ``metrics`` to every registered metric;
    ``thresholds`` overrides label thresholds by metric name; ``engine`` names an engine of
    :mod:`headscope.engines` (``auto``: the first that can run). ``progress`` is an optional
    ``tqdm``-like factory ``progress(total=..., desc=...)``.

    ``effects`` (:class:`~headscope.effects.EffectSettings`) adds, beside the pattern scores,
    every head's causal effect (:mod:`headscope.effects`) and its circuit scores (``copying`` for
    decoders with an unembedding, ``value_sink``: :mod:`headscope.circuits`). ``say`` gets
    progress lines. ``interventions`` (:mod:`headscope.attention`, e.g. ``ReplaceHeadOutput``)
    are applied in every forward of the pattern scan: where heads look with another head ablated.

    ``bootstrap`` resamples of the sequences (0: none) give every score a ``ci`` interval and every
    label its stability (:mod:`headscope.uncertainty`), seeded with ``bootstrap_seed``. ``null``
    scores the repeat metrics again on sequences of the same length with no repetition
    (:func:`~headscope.probes.null_probe`): the ``null`` column, a control beside ``chance``;
    ``copying`` gets its own control there (another token of ``R``, :mod:`headscope.circuits.copying`).
    ``examples`` keeps the strongest heads' patterns on the first sequence of each probe, for the
    run's report (:mod:`headscope.examples`).

    ``scorer`` replaces :func:`~headscope.extract.score_probe` (same signature) for the pattern
    scores and the positional null: a :class:`headscope.scale.shard.ShardedScorer` shards them over
    workers with the same results.
    """
    score = scorer or score_probe
    probes = list(probes) if probes is not None else default_probes(model)
    if metrics is not None and not len(metrics):
        raise HeadscopeError("metrics is empty; give metric names such as ['induction', 'sink'], or None for all.")
    chosen = [m if isinstance(m, Metric) else get_metric(m) for m in (default_metrics() if metrics is None else metrics)]
    bad = [m.name for m in chosen if not METRIC_NAME.match(m.name)]
    if bad:  # a metric names a file of the run (<metric>.png): checked before any work
        raise HeadscopeError(f"Metric name '{bad[0]}' is not allowed: use letters, digits, '_', '.' and '-' "
                             f"(it names the run's {bad[0]}.png), e.g. '{re.sub(r'[^A-Za-z0-9_.-]+', '_', bad[0])}'.")
    thresholds = dict(thresholds or {})
    for name in thresholds:
        check_score_name(name)  # unknown names fail loudly
    if effects is not None:
        effects.validate()
        check_model(model, effects.mode)  # before any work
    check_bootstrap(bootstrap, ci)
    eng = resolve_engine(model, engine, chosen, interventions=bool(interventions))
    if interventions and effects is not None:
        raise HeadscopeError("Effects are measured on the model as it is; scan with interventions, or with effects, "
                             "not both at once.")
    results: dict[str, MetricScores] = {}
    timings: dict[str, float] = {}
    for probe in probes:
        t0 = time.perf_counter()
        bar = progress(total=len(probe), desc=f"{probe.name} probe") if progress else None
        results.update(score(model, probe, chosen, batch_size, on_batch=bar.update if bar is not None else None,
                                   engine=eng.name, interventions=interventions))
        if bar is not None:
            bar.close()
        timings[f"scan_{probe.name}_s"] = round(time.perf_counter() - t0, 3)
    ordered = [results[m.name] for m in chosen if m.name in results]
    metadata = {"timings": timings, "causal": model.causal, "batch_size": batch_size or "auto", "engine": eng.name}
    nulls = {}
    repeat = next((p for p in probes if p.name == "repeat"), None)
    repeat_metrics = [m for m in chosen if m.probe == "repeat"]
    if null and repeat is not None and repeat_metrics and not any(p.name == NULL_PROBE for p in probes):
        t0 = time.perf_counter()
        control = null_probe(repeat, model)
        scored = score(model, replace(control, name="repeat"), repeat_metrics, batch_size, engine=eng.name,
                             interventions=interventions)  # the repeat metrics, read at the same positions
        nulls = {name: r.score for name, r in scored.items()}
        probes = [*probes, control]
        timings["scan_repeat_null_s"] = round(time.perf_counter() - t0, 3)
    if effects is not None:
        t0 = time.perf_counter()
        pattern = to_frame(model.name, model.n_layers, model.n_heads, ordered, thresholds)
        extra = circuit_scores(model, [effects.subset(p) for p in probes], effects.batch_size or 8, say, timings)
        nulls.update({r.metric.name: r.null for r in extra if getattr(r, "null", None) is not None})
        effect_results = head_effects(model, probes, effects, pattern, say, timings)
        ordered += extra + effect_results
        metadata["effects"] = {"mode": effects.mode, "ablation": effects.ablation, "n_sequences": effects.n_sequences,
                               "exact_heads": {r.metric.name: int((r.estimator == "exact").sum())
                                               for r in effect_results if r.metric.name.startswith("effect_")}}
        timings["effects_s"] = round(time.perf_counter() - t0, 3)
    intervals, per_sequence = None, {}
    if bootstrap:
        intervals = {}
        for r in ordered:
            if getattr(r, "seq_total", None) is None:
                continue
            t = thresholds.get(r.metric.name)
            intervals[r.metric.name] = run_bootstrap(r.seq_total, r.seq_count, passes_fn(r.metric, t),
                                                     bootstrap, ci, bootstrap_seed)
            per_sequence[r.metric.name] = {"probe": r.metric.probe, "total": r.seq_total.numpy(),
                                           "count": r.seq_count.numpy()}
        metadata["bootstrap"] = {"resamples": bootstrap, "level": ci, "seed": bootstrap_seed,
                                 "method": "percentile interval of the pooled score over sequences resampled "
                                           "with replacement; stability = share of resamples passing the label"}
    frame = to_frame(model.name, model.n_layers, model.n_heads, ordered, thresholds, intervals, nulls or None)
    views: dict = {}
    if examples:
        t0 = time.perf_counter()
        heads = pick_heads(frame)
        try:
            views = {"heads": heads, "examples": example_patterns(
                model, probes, heads, engine="hooks" if eng.reads_model_attention else "blocked",
                interventions=interventions)}
        except Exception as exc:  # the report's views are extras: never lose a finished scan to them
            metadata["examples_skipped"] = str(exc) if isinstance(exc, HeadscopeError) else f"{type(exc).__name__}: {exc}"
            if say is not None:
                say(f"no example patterns for the report: {exc}")
        timings["examples_s"] = round(time.perf_counter() - t0, 3)
    return ScanResult(
        model_name=model.name,
        scores=frame,
        probes=probes,
        metadata=metadata,
        thresholds={r.metric.name: thresholds.get(r.metric.name, r.metric.threshold) for r in ordered
                    if getattr(r.metric, "label", "")},
        per_sequence=per_sequence,
        views=views,
    )


def circuit_scores(model, probes: Sequence[Probe], batch_size: int, say=None, timings: dict | None = None) -> list:
    """``copying`` (decoders with an unembedding, repeat probe) and ``value_sink`` (text probe)."""
    say = say or (lambda _msg: None)
    timings = {} if timings is None else timings
    by_name = {p.name: p for p in probes}
    out = []
    if model.causal and "repeat" in by_name and model.hf.get_output_embeddings() is not None:
        say("circuits: copying (OV circuit) of every head")
        t0 = time.perf_counter()
        out.append(copying_scores(model, by_name["repeat"], max_sequences=len(by_name["repeat"])))
        timings["copying_s"] = round(time.perf_counter() - t0, 3)
    if "text" in by_name:
        say("circuits: value-weighted sink share of every head")
        t0 = time.perf_counter()
        out.append(value_sink_scores(model, by_name["text"], batch_size))
        timings["value_sink_s"] = round(time.perf_counter() - t0, 3)
    return out


def default_out(model) -> Path:
    """Where ``headscope scan MODEL`` writes without ``--out``: ``runs/<model slug>``."""
    return Path("runs") / model_slug(model if isinstance(model, str) else getattr(model, "name", "model"))


def scan_to_dir(
    model_name,
    out: str | Path | None = None,
    config: ScanConfig = _DEFAULT,
    *,
    tokenizer=None,
    force: bool = False,
    figures: bool = True,
    device: str = "auto",
    dtype: str | None = None,
    threads: int | None = None,
    say: Callable[[str], None] | None = None,
    progress=None,
    ray: str | None = None,
    workers: int | None = None,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
) -> ScanResult:
    """``headscope scan``: check everything, load ``model_name``, scan, and save the run to ``out``.

    Every mistake a user can make (settings, prompts file, model name, an ``out`` that may not be
    written) is refused with one line before the model loads; nothing is written unless the whole
    run succeeds. ``model_name`` may also be a model in memory: a loaded :class:`Model`, a
    transformer-lens bridge, or a Hugging Face model with its ``tokenizer`` (``device`` and
    ``dtype`` then stay the model's own; see :func:`headscope.loading.load_model`). ``out``
    defaults to :func:`default_out`. ``say`` gets progress lines; ``progress`` is a ``tqdm``-like
    factory for the probes' progress bars. ``threads`` sets torch's CPU threads for the scan only.

    ``ray`` shards the pattern scan's batches over ``workers`` Ray actors (:mod:`headscope.scale`):
    ``"local"`` starts a local instance, else a cluster address (``HOST:PORT``, ``auto``,
    ``ray://HOST:PORT``). The scores and tokens are those of the plain scan, bit for bit.

    ``device_map`` / ``max_memory``: a model bigger than one device, placed by accelerate (see
    :func:`headscope.loading.load_model`); not with ``ray`` or effects.
    """
    import contextlib

    import torch

    from headscope.scale.ray_scan import check_options, sharded

    t_start = time.perf_counter()
    say = say or (lambda _msg: None)
    out = default_out(model_name) if out is None else Path(out)
    from headscope.engines import fused

    old_threads, old_on_build, old_on_fallback = torch.get_num_threads(), kernels.on_build, fused.on_fallback
    said: set[str] = set()

    def say_once(msg: str) -> None:  # a fallback line would otherwise repeat for every batch
        if msg not in said:
            said.add(msg)
            say(msg)
    with interruptible():
        config.validate()
        at_least("threads", threads)
        check_dtype(dtype)
        check_out_dir(out, force)
        if isinstance(model_name, str):
            resolve(model_name)  # a typo is answered in milliseconds, before any loading
        check_options(ray, workers, model_name, config.effects is not None)
        check_device_map(device_map, max_memory)
        if device_map is not None:
            if ray is not None:
                raise HeadscopeError("--device-map with --ray is not supported: each Ray actor holds a whole replica; "
                                     "scan a device-mapped model in one process.")
            if config.effects is not None:
                raise HeadscopeError("--effects with --device-map is not supported (circuit scores read the weights "
                                     "directly, which a device map may have offloaded); scan without --effects.")
            if device != "auto":
                raise HeadscopeError(f"--device {device} and --device-map both place the model; give one of them.")
            if not isinstance(model_name, str):
                raise HeadscopeError("--device-map loads a model by name; an in-memory model is used where it is.")
        stack = contextlib.ExitStack()
        try:
            scorer = None
            if ray is not None:  # the actors load their replicas while this process loads its own
                say(f"starting {workers or 1} Ray worker(s) ({'local instance' if ray == 'local' else ray})")
                scorer = stack.enter_context(sharded(model_name, ray, workers, device, dtype))
            if threads is not None:
                torch.set_num_threads(threads)
            kernels.on_build = say
            fused.on_fallback = say_once
            t0 = time.perf_counter()
            placed = {} if device_map is None else {"device_map": device_map, "max_memory": max_memory}
            model = load_model(model_name, tokenizer, device=device, dtype=dtype, progress=say, **placed)
            t_load = time.perf_counter() - t0
            chosen = config.metric_objects()
            probes = default_probes(model, config.n_prompts, config.repeat_len, config.seed, config.prompts,
                                    config.seq_len, probes=config.probe_names(), text_join=config.text_join,
                                    token_types=config.token_types, long_context=config.long_context,
                                    band=(config.sinks, config.window), needle_tokens=config.needle_tokens, say=say)
            engine = resolve_engine(model, config.engine, chosen)
            say(f"scanning {model.n_layers} layers x {model.n_heads} heads on {model.device} ({engine.name} engine)")
            result = scan(model, probes, chosen, batch_size=config.batch_size, thresholds=dict(config.thresholds),
                          progress=progress, engine=engine.name, effects=config.effect_settings(), say=say,
                          bootstrap=config.bootstrap, ci=config.ci, bootstrap_seed=config.seed, scorer=scorer)
            if ray is not None:
                result.metadata["ray"] = {"address": ray, "workers": workers or 1}
            result.metadata = run_metadata(model, result, config, t_load)
            save_run(result, out, force=force, figures=figures, started=t_start)
        finally:
            stack.close()
            torch.set_num_threads(old_threads)
            kernels.on_build = old_on_build
            fused.on_fallback = old_on_fallback
    return result


def run_metadata(model, result: ScanResult, config: ScanConfig, t_load: float) -> dict:
    """Everything ``metadata.json`` records about a scan: model, source, settings, versions, timings."""
    import torch

    import headscope

    source = {"kind": model.source.kind, **model.provenance}
    if model.source.kind == "memory":  # no weights file to hash: hash the weights themselves
        source["state_dict_sha256"] = model.fingerprint()
    return {
        "model": model.name,
        "source": source,
        "n_layers": model.n_layers,
        "n_heads": model.n_heads,
        "n_kv_heads": model.n_kv_heads,
        "n_ctx": model.n_ctx,
        "causal": model.causal,
        "special_tokens": {"bos_or_cls": model.bos_id, "separator": model.sep_id, "pad": model.pad_id},
        "probes": {p.name: {**p.settings, "n_sequences": len(p)} for p in result.probes},
        "seed": config.seed,
        "prompts": str(Path(config.prompts).resolve()) if config.prompts else "builtin:headscope/data/pairs.tsv",
        "settings": config.record(),
        "token_type_ids": ("segment ids of each pair, saved in tokens.jsonl" if config.token_types
                           else "all zero (sequences are fed as token ids alone)"),
        "engine": result.metadata.get("engine"),
        **({k: result.metadata[k] for k in ("effects", "bootstrap", "ray") if k in result.metadata}),
        "batch_size": result.metadata.get("batch_size"),
        "device": str(model.device),
        **({"device_map": model.device_map} if getattr(model, "device_map", None) is not None else {}),
        "threads": torch.get_num_threads(),
        "dtype": str(model.dtype).replace("torch.", ""),
        "versions": {
            "headscope": headscope.__version__,
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "transformer-lens": _version("transformer-lens"),
            "python": platform.python_version(),
        },
        "timings": {"load_s": round(t_load, 3), **result.metadata.get("timings", {})},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None
