"""The flex engine: FlexAttention replaces each layer's attention, output plus per-row statistics.

The GPU counterpart of the fused engine. Per scanned layer, one FlexAttention pass (compiled by
``torch.compile`` on CUDA) with values ``[V | K | 1 | key flags]`` gives the layer's output
``A V``, handed back to the model, and from the same pass each query row's log-sum-exp, entropy and
masses on the flagged key sets; a second pass over the window tiles gives the streaming band. The
pattern never exists in memory. See :mod:`headscope.engines.flex_stats` for the maths.

Devices: ``auto`` chooses it for models on CUDA. On the CPU FlexAttention runs uncompiled, with
the full ``n x n`` scores in memory, so ``auto`` leaves the CPU to the fused and blocked engines;
``--engine flex`` (``engine="flex"``) still runs it there, which is how its statistics are tested
against the blocked engine without a GPU. Calls it cannot take (an additive mask, a per-head mask
from an intervention) are scored from exact pattern blocks instead, as the fused engine does, and
the scan hears about it once (:func:`headscope.errors.notice`). Softmax changes it does not model
(soft-capping, learned sinks, position biases) are refused in one line naming the engine that can.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from headscope.engines.base import Engine
from headscope.engines.blocked import BlockHandler, refuse_unmodelled
from headscope.engines.flex_stats import StatsRequest, Visibility, flex_reason, layer_stats
from headscope.errors import notice
from headscope.metrics.base import PatternBatch, key_set_flags
from headscope.models.attention import AttentionCall, StopForward

FLAG_SETS = ("separator", "punctuation")  # PatternBatch key sets whose mass the pass sums


def flex_request(batch: PatternBatch, n_keys: int) -> StatsRequest:
    """What the scan's metrics read, as the flex pass computes it (key sets exactly as
    :func:`~headscope.metrics.base.key_set_mass` counts them)."""
    flags = {
        name: key_set_flags(batch, name, n_keys, batch.lengths.device)
        for name in FLAG_SETS
        if getattr(batch, name) is not None
    }
    targets = batch.targets
    # rare_word reads every row's arg-max: every row is a target row
    if batch.key_counts is not None:
        targets = torch.zeros(
            len(batch.lengths), n_keys, dtype=torch.long, device=batch.lengths.device
        )
    return StatsRequest(flags=flags, band=batch.band, targets=targets)


def takes_mask(mask: Tensor | None) -> bool:
    """Whether the flex pass takes this call's mask: none, or boolean and shared by the heads."""
    return mask is None or (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1)


class FlexHandler(BlockHandler):
    """FlexAttention output + statistics for the wanted layers; pattern blocks where it cannot
    go."""

    engine = "flex"

    def __init__(
        self,
        on_rows,
        layers,
        request: StatsRequest,
        device: torch.device | None = None,
        stats: Callable = layer_stats,
    ):
        super().__init__(on_rows, layers, device=device)
        self.request = request
        # (query, key, value, vis, scale, request, block, window) -> (output, HeadStats)
        self.stats = stats
        self.fell_back = False
        # Block masks per distinct call mask: the model passes one mask object to every layer of a
        # kind (full / sliding), so each is classified once per forward. Holding the mask keeps its
        # id.
        self._blocks: dict[tuple, tuple] = {}

    def _visibility(self, call: AttentionCall):
        b, h, n_q, n_k = call.shape
        dense = None if call.mask is None else call.mask[:, 0]  # [1 or batch, q or 1, k], a view
        if dense is not None and dense.shape[1] != n_q:
            # a key-only (padding) mask, per row: still a view
            dense = dense.expand(dense.shape[0], n_q, n_k)
        key = (id(call.mask), call.causal, n_q, n_k, call.query.device)
        if key not in self._blocks:
            vis = Visibility(n_q, n_k, call.causal, dense, call.query.device)
            window = (
                vis.block_mask(window=self.request.band) if self.request.band is not None else None
            )
            self._blocks[key] = (call.mask, vis, vis.block_mask(), window)
        return self._blocks[key][1:]

    def __call__(self, call: AttentionCall) -> Tensor:
        if call.layer not in self.layers:
            return super().__call__(call)
        if not takes_mask(call.mask):
            if not self.fell_back:
                self.fell_back = True
                kind = "an additive" if call.mask.dtype != torch.bool else "a per-head"
                notice(
                    f"layer {call.layer}'s attention has {kind} mask, which the flex engine "
                    "does not take: scored from exact pattern blocks (same scores, slower).",
                    once=True,
                )
            return super().__call__(call)
        refuse_unmodelled(call, self.engine)
        vis, block, window = self._visibility(call)
        last = call.layer == self.last
        request = self.request
        if request.targets is not None or request.flags:
            dev = call.query.device
            request = StatsRequest(
                {n: f.to(dev) for n, f in request.flags.items()},
                request.band,
                None if request.targets is None else request.targets.to(dev),
            )
        # the last layer's output is not needed, but computing it keeps one compiled kernel per
        # shape
        out, stats = self.stats(
            call.query, call.key, call.value, vis, call.scale, request, block, window
        )
        # a layer elsewhere in a device map
        if self.device is not None and call.query.device != self.device:
            stats = _moved(stats, self.device)
        self.on_rows(call.layer, stats, 0)
        if last:  # nothing runs after it: statistics only
            raise StopForward
        # [batch, head, query, dim] -> [batch, query, head, dim]
        return out.transpose(1, 2).contiguous()


def _moved(stats, device):
    """The same statistics on ``device`` (where the metrics accumulate)."""
    from dataclasses import fields, replace

    def mv(x):
        if isinstance(x, Tensor):
            return x.to(device)
        if isinstance(x, dict):
            return {k: mv(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(mv(v) for v in x)
        return x

    return replace(
        stats, **{f.name: mv(getattr(stats, f.name)) for f in fields(stats) if f.name != "shape"}
    )


class FlexEngine(Engine):
    name = "flex"
    summary = (
        "FlexAttention (compiled, CUDA) replaces each layer's attention: "
        "output plus per-row statistics"
    )

    def __init__(self, stats: Callable | None = None):
        # None: FlexAttention (flex_stats.layer_stats); the Triton prototype plugs in here
        self.stats = stats

    def unavailable(self, model, metrics):
        if not model.attention_interface:
            return "its attention does not run through transformers' attention interface"
        need_pattern = [m.name for m in metrics if not m.fused]
        if need_pattern:
            return (
                f"metric(s) {', '.join(need_pattern)} need the pattern itself "
                "(Metric.fused is False)"
            )
        devices = {model.device.type} | {
            str(d).split(":")[0]
            for d in (getattr(model, "device_map", None) or {}).values()
            if not isinstance(d, int)
        }
        devices |= {
            "cuda"
            for d in (getattr(model, "device_map", None) or {}).values()
            if isinstance(d, int)
        }
        other = sorted(devices - {"cuda", "cpu", "disk", "meta"})  # offloaded layers run on the CPU
        if other:
            return (
                "FlexAttention runs here on CUDA (compiled) or the CPU (eager), "
                f"not {', '.join(other)}"
            )
        return flex_reason()

    def auto_unavailable(self, model, metrics):
        reason = self.unavailable(model, metrics)
        if reason is None and _on_cpu(model):
            return (
                "on the CPU FlexAttention runs uncompiled, n x n scores in memory "
                "(ask for it with --engine flex)"
            )
        return reason

    def run(
        self, model, tokens, mask, batch, on_rows, layers=None, interventions=(), token_types=None
    ) -> None:
        layers = range(model.n_layers) if layers is None else layers
        handler = FlexHandler(
            on_rows,
            layers,
            flex_request(batch, tokens.shape[1]),
            device=model.device,
            stats=self.stats or layer_stats,
        )
        model.run(
            tokens, mask, handler=handler, interventions=interventions, token_types=token_types
        )


def _on_cpu(model) -> bool:
    """Whether any of the model's layers computes on the CPU (a device map may offload some)."""
    placed = (getattr(model, "device_map", None) or {}).values()
    return (
        model.device.type == "cpu"
        and not placed
        or any(str(d).startswith(("cpu", "disk")) for d in placed)
    )


ENGINE = FlexEngine()
