"""Ray actors that each hold one model replica and score whole batches of a scan.

:class:`RayPool` starts ``workers`` actors (one GPU each where the cluster has GPUs), hands every
planned batch to whichever actor is free and returns the batches' scores for
:func:`headscope.scale.shard.merge`. An actor that dies (its process killed, its node lost) is
restarted by Ray, which reloads the model and retries the batches it held; a batch is counted once
because the merge takes exactly one result per planned batch.

Ray is imported inside the functions: ``import headscope`` never needs it.

Address forms: none (a local instance starts, and stops at the end), ``auto`` (the cluster this
machine joined with ``ray start``), ``HOST:PORT`` (a head node started with
``ray start --head --port=PORT``), ``ray://HOST:10001`` (Ray Client).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from headscope.engines.extract import BatchScores, score_batch
from headscope.errors import HeadscopeError
from headscope.scale.options import LOCAL, check_address, require_ray  # noqa: F401

__all__ = ["LOCAL", "RayPool", "check_address", "connect", "require_ray"]

RETRIES = 2  # restarts of a dead actor, and retries of the batches it held


@contextlib.contextmanager
def connect(address: str | None = None, workers: int = 1) -> Iterator[object]:
    """Ray, connected: to the cluster at ``address``, or a local instance started for this block
    (and stopped after it). A session that is already connected is used as it is."""
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    check_address(address)
    kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address in (None, LOCAL):
        kwargs["num_cpus"] = max(workers, os.cpu_count() or 1)
        # token authentication stays on (Ray's default for a local instance); its one-line banner at
        # every start says so and nothing else, so it is not shown
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
            logging.ERROR
        )
    else:
        kwargs["address"] = address
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError) as exc:
        raise HeadscopeError(
            f"Could not connect to Ray at {address}: {str(exc).splitlines()[0]}"
        ) from None
    try:
        yield ray
    finally:
        ray.shutdown()


class ScanWorker:
    """One model replica (an actor's state): scores whole batches with the engine it is told."""

    def __init__(
        self,
        model_name: str,
        device: str = "auto",
        dtype: str | None = None,
        threads: int | None = None,
    ):
        import torch

        from headscope.models.loading import load_model

        if threads:
            torch.set_num_threads(threads)
        self.model = load_model(model_name, device=device, dtype=dtype)

    def pid(self) -> int:
        return os.getpid()

    def score(
        self, probe, metrics, index: Sequence[int], engine: str, interventions=()
    ) -> BatchScores:
        from headscope.engines.registry import get_engine

        return score_batch(self.model, probe, metrics, index, get_engine(engine), interventions)


def worker_name(model_name: str) -> str:
    """What a worker loads: a local folder as an absolute path (workers may start elsewhere)."""
    path = Path(model_name).expanduser()
    return str(path.resolve()) if path.exists() else model_name


class RayPool:
    """``workers`` :class:`ScanWorker` actors on the connected Ray cluster.

    >>> with connect() as ray:                                    # doctest: +SKIP
    ...     pool = RayPool("smollm2-135m", workers=2)
    ...     scan(model, scorer=ShardedScorer(pool.run_batches))
    """

    def __init__(
        self,
        model_name: str,
        workers: int,
        device: str = "auto",
        dtype: str | None = None,
        threads: int | None = None,
    ):
        ray = require_ray()
        if workers < 1:
            raise HeadscopeError(f"workers (--workers) must be at least 1, got {workers}.")
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        actor = ray.remote(
            num_cpus=1, num_gpus=gpus, max_restarts=RETRIES, max_task_retries=RETRIES
        )(ScanWorker)
        self.actors = [
            actor.remote(worker_name(model_name), device, dtype, threads) for _ in range(workers)
        ]

    def pids(self) -> list[int]:
        """Each actor's process id (e.g. to kill one in a test)."""
        import ray

        return ray.get([a.pid.remote() for a in self.actors])

    def run_batches(
        self,
        probe,
        metrics,
        batches: Sequence[Sequence[int]],
        engine: str,
        interventions=(),
        on_batch: Callable[[int], None] | None = None,
    ) -> list[BatchScores]:
        """Every batch scored by some actor, two in flight per actor; results in plan order."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        probe_ref = ray.put(probe)  # shipped once per node, not once per batch
        todo = list(range(len(batches)))[::-1]
        running: dict = {}  # object ref -> (batch number, actor)
        done: dict[int, BatchScores] = {}

        def submit(actor) -> None:
            number = todo.pop()
            ref = actor.score.remote(probe_ref, metrics, batches[number], engine, interventions)
            running[ref] = (number, actor)

        for _ in range(2):
            for actor in self.actors:
                if todo:
                    submit(actor)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            number, actor = running.pop(ready[0])
            try:
                done[number] = ray.get(ready[0])
            except RayTaskError as exc:
                cause = exc.cause if isinstance(getattr(exc, "cause", None), Exception) else exc
                if isinstance(cause, HeadscopeError):
                    raise cause from None
                raise HeadscopeError(
                    f"A Ray worker failed on batch {number} of the {probe.name} probe: "
                    f"{type(cause).__name__}: {str(cause).splitlines()[0]}"
                ) from None
            except RayActorError as exc:
                raise HeadscopeError(
                    f"A Ray worker died {RETRIES + 1} times scoring batch {number} of the "
                    f"{probe.name} probe: {str(exc).splitlines()[0]}"
                ) from None
            if on_batch is not None:
                on_batch(len(batches[number]))
            if todo:
                submit(actor)
        return [done[i] for i in range(len(batches))]

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)


@contextlib.contextmanager
def sharded(
    model_name: str,
    address: str | None,
    workers: int | None,
    device: str = "auto",
    dtype: str | None = None,
) -> Iterator[object]:
    """A :class:`~headscope.scale.shard.ShardedScorer` over a :class:`RayPool` for one block:
    connects (or starts a local instance), starts the actors, and stops them afterwards."""
    from headscope.scale.shard import ShardedScorer

    workers = workers or 1
    with connect(None if address == LOCAL else address, workers):
        pool = RayPool(str(model_name), workers, device, dtype)
        try:
            scorer = ShardedScorer(pool.run_batches)
            scorer.pool = pool
            yield scorer
        finally:
            pool.close()
