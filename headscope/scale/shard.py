"""A scan sharded by batches, merged bit for bit: no Ray here, so it is testable anywhere.

A plain scan (:func:`headscope.engines.extract.score_probe`) plans its batches (sequences sorted by
length, cut every ``batch_size``), scores each batch, and adds the batches up in plan order. Padding
and the order of float additions depend on which sequences share a batch, so a shard is a whole
batch of that plan, never a slice of sequences: each worker scores whole batches with
:func:`~headscope.engines.extract.score_batch`, and :func:`merge` adds them in plan order, exactly
as the plain loop does. Per-sequence sums land at their probe positions, so the bootstrap sees the
same arrays too. The batch size must be the same everywhere: the driver fixes it (``auto`` is
resolved once, on the driver) before any worker runs.

>>> from headscope.result import Probe
>>> plan = plan_batches(Probe("repeat", [[1, 2], [1], [1, 2, 3]]), 2)
>>> plan
[[1, 0], [2]]
>>> deal(plan, 2)
[[0], [1]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from headscope.engines.extract import BatchScores, MetricScores, Sums, auto_batch_size, plan_batches
from headscope.engines.registry import AUTO, resolve_engine
from headscope.errors import HeadscopeError
from headscope.metrics import Metric
from headscope.result import Probe

__all__ = ["ShardedScorer", "deal", "merge", "plan_batches"]

#: ``run(probe, metrics, batches, engine, interventions, on_batch) -> one BatchScores per batch``,
#: in any order; each names the probe indices it scored (``BatchScores.index``).
RunBatches = Callable[..., Sequence[BatchScores]]


def deal(batches: Sequence[Sequence[int]], workers: int) -> list[list[int]]:
    """Batch numbers dealt round-robin to ``workers`` (the static split, for reports and tests);
    a live pool hands out the next batch to whichever worker is free instead."""
    return [list(range(w, len(batches), workers)) for w in range(min(workers, len(batches)))]


def merge(
    model,
    probe: Probe,
    metrics: Sequence[Metric],
    batches: Sequence[Sequence[int]],
    parts: Sequence[BatchScores],
) -> dict[str, MetricScores]:
    """Add the batches' scores up in plan order: what :func:`score_probe` returns, bit for bit.

    Every planned batch must come back exactly once (a retried shard is counted once)."""
    by_first = {}
    for part in parts:
        key = tuple(part.index)
        if key in by_first:
            raise HeadscopeError(
                f"Batch of sequences {list(key)[:3]}... came back twice; a shard is counted once."
            )
        by_first[key] = part
    sums = Sums(model, probe, metrics)
    for number, index in enumerate(batches):
        part = by_first.pop(tuple(index), None)
        if part is None:
            raise HeadscopeError(
                f"Batch {number} of the {probe.name} probe never came back from the workers."
            )
        sums.add(part)
    if by_first:
        raise HeadscopeError(f"{len(by_first)} batch(es) came back that the plan does not hold.")
    return sums.result()


class ShardedScorer:
    """:func:`~headscope.engines.extract.score_probe`'s signature, with the batches scored by
    ``run`` (e.g. :meth:`headscope.scale.ray_scan.RayPool.run_batches`) and merged here.

    Pass it as ``scorer=`` to :func:`headscope.scan`."""

    def __init__(self, run: RunBatches):
        self.run = run

    def __call__(
        self,
        model,
        probe: Probe,
        metrics: Sequence[Metric],
        batch_size: int | None = None,
        on_batch: Callable[[int], None] | None = None,
        engine: str = AUTO,
        interventions: Sequence = (),
    ) -> dict[str, MetricScores]:
        eng = resolve_engine(model, engine, metrics, interventions=bool(interventions))
        if batch_size is None:  # resolved once, here: every worker must cut the same batches
            batch_size = auto_batch_size(model, max(len(s) for s in probe.sequences))
        metrics = [m for m in metrics if m.probe == probe.name]
        batches = plan_batches(probe, batch_size)
        if not metrics:
            return {}
        parts = self.run(probe, metrics, batches, eng.name, interventions, on_batch)
        return merge(model, probe, metrics, batches, parts)
