"""Streaming extraction: one forward per batch, each layer's pattern reduced inside its hook.

For every batch, :func:`score_probe` runs :meth:`Model.run_patterns`; the callback turns the layer's
``[batch, head, query, key]`` pattern into per-head sums and counts for every metric of the probe,
and the pattern is dropped before the next layer runs. No activation cache is ever built.

Batches are right-padded and carry an attention mask; metrics exclude padding as query and as key,
so a padded batch scores exactly like one sequence at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.errors import HeadscopeError
from headscope.metrics import Metric, PatternBatch, uniform_pattern
from headscope.metrics.base import key_set_flags
from headscope.metrics.stats import HeadStats
from headscope.probes import Probe, PunctuationTable


@dataclass
class MetricScores:
    """One metric's pooled result over a probe: a ``[layer, head]`` score and its chance value."""

    metric: Metric
    total: Float[Tensor, "layer head"]  # sum of f over qualifying (sequence, query) pairs
    count: float  # how many pairs qualified
    chance_total: float  # the same sum for a uniform head

    @property
    def score(self) -> Float[Tensor, "layer head"]:
        return self.total / self.count if self.count else torch.full_like(self.total, torch.nan)

    @property
    def chance(self) -> float:
        return self.chance_total / self.count if self.count else float("nan")


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad to the longest: (tokens ``[batch, pos]``, mask ``[batch, pos]``, lengths ``[batch]``)."""
    lengths = torch.tensor([len(s) for s in seqs])
    n = int(lengths.max())
    tokens = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    mask = torch.arange(n)[None, :] < lengths[:, None]  # [batch, pos]
    return tokens, mask, lengths


def pattern_batch(model, probe: Probe, tokens: Tensor, mask: Tensor, lengths: Tensor,
                  punct: PunctuationTable | None = None) -> PatternBatch:
    """The metric context of one padded batch: lengths, causality and special-key flags."""
    punct = punct or PunctuationTable(model)
    return PatternBatch(
        lengths=lengths,
        causal=model.causal,
        separator=(tokens == model.sep_id) & mask,  # [batch, key]
        punctuation=punct(tokens) & mask if probe.name == "text" else None,
        repeat_len=probe.repeat_len,
    )


def score_probe(
    model,
    probe: Probe,
    metrics: Sequence[Metric],
    batch_size: int | None = None,
    on_batch: Callable[[int], None] | None = None,
    engine: str = "auto",
) -> dict[str, MetricScores]:
    """Score every head of ``model`` on ``probe`` for each metric, streaming layer by layer.

    ``engine``: ``"fused"`` replaces each scanned layer's attention by a CPU kernel that returns
    its output and the metrics' per-row statistics from one pass (see :mod:`headscope.kernels`);
    ``"blocked"`` runs sdpa and scores exact pattern blocks (see :mod:`headscope.blocked`); ``"hooks"`` reads each layer's full
    pattern from the transformer-lens bridge's ``hook_pattern``; ``"auto"`` takes the first of these
    that the model, device and metrics allow. All give the same scores. ``batch_size=None`` picks
    one from the sequence length.
    """
    engine = resolve_engine(model, engine, metrics)
    if batch_size is None:
        batch_size = auto_batch_size(model, max(len(s) for s in probe.sequences))
    if batch_size < 1:
        raise HeadscopeError(f"--batch-size must be at least 1, got {batch_size}.")
    metrics = [m for m in metrics if m.probe == probe.name]
    totals = {m.name: torch.zeros(model.n_layers, model.n_heads, dtype=torch.float64) for m in metrics}
    counts = dict.fromkeys(totals, 0.0)
    chance = dict.fromkeys(totals, 0.0)
    if not metrics:
        return {}
    punct = PunctuationTable(model)
    # Similar lengths together: less padding. Sums are order-free, so scores do not change.
    order = sorted(range(len(probe)), key=lambda i: (len(probe.sequences[i]), i))
    for start in range(0, len(order), batch_size):
        chunk = [probe.sequences[i] for i in order[start : start + batch_size]]
        tokens, mask, lengths = pad_batch(chunk, model.pad_id)
        batch = pattern_batch(model, probe, tokens, mask, lengths, punct)
        dev_batch = _to(batch, model.device)

        def on_block(layer: int, pattern: Tensor | HeadStats, q_start: int = 0,
                     log_pattern: Tensor | None = None, batch=dev_batch, n=tokens.shape[1]) -> None:
            # [batch, head, query block, key]; bf16/fp16 scored in fp32 (HeadStats are float64)
            p = pattern if isinstance(pattern, HeadStats) else pattern.float()
            block = batch if q_start == 0 and p.shape[-1] == n else _block(batch, q_start, p.shape[-1])
            if log_pattern is not None:
                block = replace(block, log_pattern=log_pattern)
            for m in metrics:
                pooled = m(p, block)
                totals[m.name][layer] += pooled.total.sum(0).cpu()  # [head]

        if engine == "fused":
            model.run_pattern_blocks(tokens, mask, on_block, fused_flags=fused_flags(dev_batch, tokens.shape[1]))
        elif engine == "blocked":
            model.run_pattern_blocks(tokens, mask, on_block)
        else:
            model.run_patterns(tokens, mask, on_block)
        b, n = tokens.shape
        rows = max(16, (16 * 2**20) // (4 * b * n))  # uniform head in query blocks: O(n) memory
        for q_start in range(0, n, rows):
            block = replace(batch, q_start=q_start)
            uniform = uniform_pattern((b, 1, min(rows, n - q_start), n), block)  # [b, 1, rows, n]
            for m in metrics:
                pooled = m(uniform, block)
                counts[m.name] += float(pooled.count.sum())
                chance[m.name] += float(pooled.total.sum())
        if on_batch is not None:
            on_batch(len(chunk))
    return {m.name: MetricScores(m, totals[m.name], counts[m.name], chance[m.name]) for m in metrics}


ENGINES = ("auto", "fused", "blocked", "hooks")
FLAG_SETS = ("separator", "punctuation")  # PatternBatch key sets whose mass the fused kernel sums


def fused_flags(batch: PatternBatch, n_keys: int) -> dict[str, Tensor]:
    """The key sets of ``batch`` for the fused kernel, exactly as :func:`key_set_mass` counts them."""
    return {name: key_set_flags(batch, name, n_keys, batch.lengths.device)
            for name in FLAG_SETS if getattr(batch, name) is not None}


def resolve_engine(model, engine: str, metrics: Sequence[Metric] | None = None) -> str:
    """The engine ``engine`` names, with ``"auto"`` resolved; one clear line when it cannot run."""
    if engine not in ENGINES:
        raise HeadscopeError(f"Unknown engine '{engine}'; use one of {', '.join(ENGINES)}.")
    not_fused = [m.name for m in (metrics or []) if not m.fused]
    on_cpu = getattr(model.device, "type", "cpu") == "cpu"
    if engine == "auto":
        if not model.supports_blocked:
            return "hooks"
        from headscope import kernels

        return "fused" if on_cpu and not not_fused and kernels.available() else "blocked"
    if engine in ("fused", "blocked") and not model.supports_blocked:
        raise HeadscopeError(f"{model.name} does not support the {engine} engine; use --engine hooks.")
    if engine == "fused":
        from headscope import kernels

        if not on_cpu:
            raise HeadscopeError(f"The fused engine runs on the CPU only, not {model.device}; use --engine blocked.")
        if not_fused:
            raise HeadscopeError(f"Metric(s) {', '.join(not_fused)} need the pattern itself (Metric.fused is False); "
                                 "use --engine blocked.")
        if not kernels.available():
            raise HeadscopeError(f"The fused engine is not available: {kernels.unavailable_reason()}; "
                                 "use --engine blocked.")
    return engine


def auto_batch_size(model, seq_len: int, budget_bytes: int | None = None) -> int:
    """Sequences per forward from the context length and the memory there is.

    Aims at ~4k tokens a batch (enough to keep matrix kernels busy) and keeps the activations
    (~24 fp32 vectors of ``d_model`` per token, a generous bound) within a quarter of the free memory.
    """
    d_model = int(getattr(model.hf.config, "hidden_size", 768))
    per_seq = seq_len * d_model * 4 * 24 + model.n_heads * seq_len * 4 * 64
    if budget_bytes is None:
        budget_bytes = _free_memory(model.device) // 4
    by_memory = max(1, budget_bytes // max(1, per_seq))
    by_tokens = max(1, 4096 // max(1, seq_len))
    return int(max(1, min(64, by_memory, by_tokens)))


def _free_memory(device) -> int:
    if getattr(device, "type", "cpu") == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 4 * 2**30


def _block(batch: PatternBatch, q_start: int, n_keys: int) -> PatternBatch:
    """The context of a query block whose key axis stops at ``n_keys`` (causal blocks)."""
    def cut(t):
        return None if t is None else t[:, :n_keys]

    return replace(batch, q_start=q_start, separator=cut(batch.separator), punctuation=cut(batch.punctuation))


def _to(batch: PatternBatch, device) -> PatternBatch:
    def mv(t):
        return None if t is None else t.to(device)

    return PatternBatch(
        lengths=batch.lengths.to(device), causal=batch.causal, q_start=batch.q_start,
        separator=mv(batch.separator), punctuation=mv(batch.punctuation), repeat_len=batch.repeat_len,
    )
