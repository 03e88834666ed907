"""Streaming extraction: one forward per batch, each layer's attention reduced to per-head sums.

For every batch, :func:`score_probe` runs the chosen engine (:mod:`headscope.engines.registry`); its
callback turns a layer's attention rows into per-head sums and counts for every metric of the
probe, and the rows are dropped before the next layer runs. No activation cache is ever built.

Batches are right-padded and carry an attention mask; metrics exclude padding as query and as key,
so a padded batch scores exactly like one sequence at a time. Sums are order-free, so the
:class:`MetricScores` of disjoint shards of a probe add up (``a + b``) to those of the whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.engines.registry import AUTO, resolve_engine
from headscope.errors import HeadscopeError
from headscope.metrics import Metric, PatternBatch, uniform_pattern
from headscope.metrics.rows import Rows
from headscope.metrics.streaming import SINKS, WINDOW
from headscope.probes.pairs import PunctuationTable
from headscope.result import Probe


@dataclass
class MetricScores:
    """One metric's pooled result over a probe: a ``[layer, head]`` score and its chance value."""

    metric: Metric
    total: Float[Tensor, "layer head"]  # sum of f over qualifying (sequence, query) pairs, float64
    count: float  # how many pairs qualified
    #: The same sum for a uniform head: one number, or one per layer (``[layer]``) when layers see
    #: different keys (sliding-window layers spread a uniform head over their window only).
    chance_total: float | Float[Tensor, " layer"]
    #: The same sums and counts per sequence of the probe (in the probe's order): what a bootstrap
    #: over sequences resamples (:mod:`headscope.uncertainty`). None when not kept.
    seq_total: Float[Tensor, "sequence layer head"] | None = None
    seq_count: Float[Tensor, " sequence"] | None = None

    @property
    def score(self) -> Float[Tensor, "layer head"]:
        return self.total / self.count if self.count else torch.full_like(self.total, torch.nan)

    @property
    def chance(self) -> float | Float[Tensor, " layer"]:
        """The score of a uniform head: a float, or ``[layer]`` when it differs by layer."""
        if isinstance(self.chance_total, Tensor):
            return (
                self.chance_total / self.count
                if self.count
                else torch.full_like(self.chance_total, torch.nan)
            )
        return self.chance_total / self.count if self.count else float("nan")

    def chance_at(self, layer: int) -> float:
        """The chance value of ``layer``'s heads."""
        c = self.chance
        return float(c[layer]) if isinstance(c, Tensor) else float(c)

    def __add__(self, other: MetricScores) -> MetricScores:
        """The scores of two disjoint sets of sequences, pooled (sums and counts add)."""
        if other.metric.name != self.metric.name or other.total.shape != self.total.shape:
            raise ValueError(
                f"Cannot pool {self.metric.name} {tuple(self.total.shape)} with "
                f"{other.metric.name} {tuple(other.total.shape)}."
            )
        both = self.seq_total is not None and other.seq_total is not None
        return MetricScores(
            self.metric,
            self.total + other.total,
            self.count + other.count,
            self.chance_total + other.chance_total,
            torch.cat([self.seq_total, other.seq_total]) if both else None,
            torch.cat([self.seq_count, other.seq_count]) if both else None,
        )

    def __radd__(self, other) -> MetricScores:
        """``sum(shards)`` starts from 0."""
        if isinstance(other, int) and other == 0:
            return self
        return NotImplemented


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad to the longest: (tokens ``[batch, pos]``, mask ``[batch, pos]``, lengths
    ``[batch]``)."""
    lengths = torch.tensor([len(s) for s in seqs])
    n = int(lengths.max())
    tokens = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    mask = torch.arange(n)[None, :] < lengths[:, None]  # [batch, pos]
    return tokens, mask, lengths


def pattern_batch(
    model,
    probe: Probe,
    tokens: Tensor,
    mask: Tensor,
    lengths: Tensor,
    punct: PunctuationTable | None = None,
    index: Sequence[int] | None = None,
    metrics: Sequence[Metric] = (),
) -> PatternBatch:
    """The metric context of one padded batch: lengths, causality and special-key flags; the
    needle probe's answer targets (``index``: each row's place in the probe), and the sink +
    window band when a metric reads it."""
    punct = punct or PunctuationTable(model)
    targets = None
    if probe.needles is not None:
        targets = torch.full(tokens.shape, -1, dtype=torch.long)  # [batch, query]
        for row, i in enumerate(range(len(tokens)) if index is None else index):
            for q, k in probe.targets(int(i)).items():
                # a sequence cut short (the report's example views) keeps its early answers
                if q < tokens.shape[1]:
                    targets[row, q] = k
    band = None
    if any("band" in m.needs for m in metrics):
        band = tuple(probe.settings.get("band") or (SINKS, WINDOW))
    counts = None
    if any("counts" in m.needs for m in metrics):  # rare_word: unigram counts of the bundled prose
        from headscope.probes.unigrams import key_counts

        counts = key_counts(model, tokens, mask)
    return PatternBatch(
        lengths=lengths,
        causal=model.causal,
        separator=(tokens == model.sep_id) & mask,  # [batch, key]
        punctuation=punct(tokens) & mask if probe.name == "text" else None,
        repeat_len=probe.repeat_len,
        band=band,
        targets=targets,
        key_counts=counts,
    )


def score_probe(
    model,
    probe: Probe,
    metrics: Sequence[Metric],
    batch_size: int | None = None,
    on_batch: Callable[[int], None] | None = None,
    engine: str = AUTO,
    interventions: Sequence = (),
) -> dict[str, MetricScores]:
    """Score every head of ``model`` on ``probe`` for each metric, streaming layer by layer.

    ``engine`` names a registered engine (:mod:`headscope.engines.registry`) or ``"auto"``, the
    first that the model, device and metrics allow; all give the same scores. ``batch_size=None``
    picks one from the sequence length and free memory. ``interventions``
    (:mod:`headscope.models.attention`) are applied in every forward: the scores of a model with
    some heads ablated or restricted.

    The work is :func:`plan_batches`, then :func:`score_batch` on each batch, added up in batch
    order by :class:`Sums`: a sharded scan (:mod:`headscope.scale`) scores the same batches
    elsewhere and adds them the same way, so its sums are bit-identical to these.
    """
    eng = resolve_engine(model, engine, metrics, interventions=bool(interventions))
    if batch_size is None:
        batch_size = auto_batch_size(model, max(len(s) for s in probe.sequences))
    metrics = [m for m in metrics if m.probe == probe.name]
    batches = plan_batches(probe, batch_size)
    if not metrics:
        return {}
    sums = Sums(model, probe, metrics)
    punct = PunctuationTable(model)
    for index in batches:
        sums.add(score_batch(model, probe, metrics, index, eng, interventions, punct))
        if on_batch is not None:
            on_batch(len(index))
    return sums.result()


def plan_batches(probe: Probe, batch_size: int) -> list[list[int]]:
    """The batches :func:`score_probe` scores, as probe indices: sequences sorted by length (less
    padding), cut every ``batch_size``. Sums are order-free, so scores do not depend on the plan
    beyond float rounding; the same plan gives the same bits.

    >>> plan_batches(Probe("text", [[1, 2, 3], [1], [1, 2]]), 2)
    [[1, 2], [0]]
    """
    if batch_size < 1:
        raise HeadscopeError(f"batch_size (--batch-size) must be at least 1, got {batch_size}.")
    order = sorted(range(len(probe)), key=lambda i: (len(probe.sequences[i]), i))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


@dataclass
class BatchScores:
    """One batch's contribution, kept as the additions :class:`Sums` makes, in order, so that adding
    batches scored anywhere (another process, another machine) gives the same bits as one loop."""

    index: list[int]  # each row's place in the probe
    total_steps: dict[str, list[tuple[int, Tensor]]]  # per metric: (layer, [head] sum) per call
    count_steps: dict[str, list[float]]  # per metric: qualifying pairs, per query block
    chance_steps: dict[str, list[tuple[list[int], float]]]  # per metric: (layers, uniform-head sum)
    seq_total: dict[str, Tensor]  # per metric: [b, layer, head]
    seq_count: dict[str, Tensor]  # per metric: [b]


def score_batch(
    model,
    probe: Probe,
    metrics: Sequence[Metric],
    index: Sequence[int],
    eng,
    interventions: Sequence = (),
    punct: PunctuationTable | None = None,
) -> BatchScores:
    """One forward over the probe's sequences ``index`` with engine ``eng``: a
    :class:`BatchScores`."""
    index = list(index)
    part = BatchScores(
        index,
        {m.name: [] for m in metrics},
        {m.name: [] for m in metrics},
        {m.name: [] for m in metrics},
        {
            m.name: torch.zeros(len(index), model.n_layers, model.n_heads, dtype=torch.float64)
            for m in metrics
        },
        {m.name: torch.zeros(len(index), dtype=torch.float64) for m in metrics},
    )
    chunk = [probe.sequences[i] for i in index]
    tokens, mask, lengths = pad_batch(chunk, model.pad_id)  # [b, n], [b, n], [b]
    batch = pattern_batch(model, probe, tokens, mask, lengths, punct, index, metrics)
    on_device = batch.to(model.device)
    n = tokens.shape[1]
    seen: set[int] = set()

    def on_rows(layer: int, rows: Rows, q_start: int = 0) -> None:
        # a block of query rows whose key axis may stop early (causal blocks)
        block = (
            on_device
            if q_start == 0 and rows.shape[-1] == n
            else _block(on_device, q_start, rows.shape[-1])
        )
        seen.add(layer)
        for m in metrics:
            per_seq = m(rows, block).total.cpu()  # [b, head]
            part.total_steps[m.name].append((layer, per_seq.sum(0)))  # [head]
            part.seq_total[m.name][:, layer] += per_seq

    # engines written before them still run
    extra = {"interventions": interventions} if interventions else {}
    if probe.token_types is not None:
        extra["token_types"] = pad_batch([probe.token_types[i] for i in index], 0)[0]  # [b, n]
    eng.run(model, tokens, mask, on_device, on_rows, **extra)
    if len(seen) != model.n_layers:  # a layer the engine never reached would score 0, silently
        missed = sorted(set(range(model.n_layers)) - seen)
        raise HeadscopeError(
            f"The {eng.name} engine never saw layer(s) {', '.join(map(str, missed))} of "
            f"{model.name}: its attention did not reach headscope; use --engine hooks."
        )
    reach = tuple(getattr(model, "reach", ()) or ()) or (None,) * model.n_layers
    # where the model is: O(n^2) per batch, a GPU's job there
    _add_chance(metrics, on_device, part, reach)
    return part


class Sums:
    """The running sums of one probe's scan; :meth:`add` takes batches in plan order."""

    def __init__(self, model, probe: Probe, metrics: Sequence[Metric]):
        self.metrics = list(metrics)
        self.totals = {
            m.name: torch.zeros(model.n_layers, model.n_heads, dtype=torch.float64) for m in metrics
        }
        self.counts = dict.fromkeys(self.totals, 0.0)
        self.chance = {m.name: torch.zeros(model.n_layers, dtype=torch.float64) for m in metrics}
        # per sequence, in the probe's order (kept beside the pooled sums)
        self.seq_totals = {
            m.name: torch.zeros(len(probe), model.n_layers, model.n_heads, dtype=torch.float64)
            for m in metrics
        }
        self.seq_counts = {m.name: torch.zeros(len(probe), dtype=torch.float64) for m in metrics}

    def add(self, part: BatchScores) -> None:
        index = torch.tensor(part.index)  # [b]
        for name in self.totals:
            for layer, head_sum in part.total_steps[name]:
                self.totals[name][layer] += head_sum
            self.seq_totals[name][index] += part.seq_total[name]
            for layers, value in part.chance_steps[name]:
                self.chance[name][layers] += value
            for value in part.count_steps[name]:
                self.counts[name] += value
            self.seq_counts[name][index] += part.seq_count[name]

    def result(self) -> dict[str, MetricScores]:
        return {
            m.name: MetricScores(
                m,
                self.totals[m.name],
                self.counts[m.name],
                self.chance[m.name],
                self.seq_totals[m.name],
                self.seq_counts[m.name],
            )
            for m in self.metrics
        }


def _add_chance(
    metrics: Sequence[Metric],
    batch: PatternBatch,
    part: BatchScores,
    reach: Sequence[int | None] = (None,),
) -> None:
    """Counts and per-layer chance sums of one batch: each metric on a uniform head over the keys
    each layer can see (``reach``, one entry per layer), in query blocks (O(n) memory). Counts do
    not depend on the layer; chance is computed once per distinct reach."""
    b, n = len(batch.lengths), int(batch.lengths.max())
    rows = max(16, (16 * 2**20) // (4 * b * n))
    layers_of: dict[int | None, list[int]] = {}
    for layer, r in enumerate(reach):
        # a reach >= n sees all
        layers_of.setdefault(r if r is None or r < n - 1 else None, []).append(layer)
    for r, layers in layers_of.items():
        first = r == next(iter(layers_of))
        for q_start in range(0, n, rows):
            block = replace(batch, q_start=q_start, reach=r)
            uniform = uniform_pattern(
                (b, 1, min(rows, n - q_start), n), block, device=batch.lengths.device
            )  # [b, 1, rows, n]
            for m in metrics:
                pooled = (m.chance_fn or m.fn)(uniform, block)
                part.chance_steps[m.name].append((layers, float(pooled.total.sum())))
                if first:  # the qualifying queries are the same in every layer
                    part.count_steps[m.name].append(float(pooled.count.sum()))
                    part.seq_count[m.name] += pooled.count.cpu()  # [b]


def auto_batch_size(model, seq_len: int, budget_bytes: int | None = None) -> int:
    """Sequences per forward from the context length and the memory there is.

    Aims at ~4k tokens a batch (enough to keep matrix kernels busy) and keeps the activations (~24
    fp32 vectors of ``d_model`` per token, a generous bound) within a quarter of the free memory.
    """
    d_model = model.d_model or 768
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

    return replace(
        batch,
        q_start=q_start,
        separator=cut(batch.separator),
        punctuation=cut(batch.punctuation),
        key_counts=cut(batch.key_counts),
    )
