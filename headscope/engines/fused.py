"""The fused engine: a C++ kernel computes each layer's output and its per-row statistics in one
pass.

It replaces the scanned layers' attention: per (batch, head, tile of queries) the kernel walks
cache-sized tiles of ``q k^T`` with a running maximum, as flash attention does, and from the same
tiles of exp-scores computes the output ``A v`` and what the metrics read from each query row:
its entropy, its mass on each flagged key set (separator, punctuation) and its log-sum-exp (so any
single entry is ``exp(q·k - lse)``). The pattern never exists in memory, and a scanned layer costs
what its fused attention alone does. See :mod:`headscope.engines.kernel` for the kernel itself.

CPU only, boolean (or no) masks shared by all heads, and metrics that read patterns only through
the selectors (``Metric.fused``). Sliding-window layers (``Model.reach``) go through the kernel with
their mask, and the key tiles outside the window are skipped. A call the kernel cannot take (an
additive mask, a per-head mask from an intervention) is scored from exact pattern blocks instead,
as the blocked engine does, and the scan hears about it once, in one line
(:func:`headscope.errors.notice`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from headscope.engines import kernel
from headscope.engines.base import Engine
from headscope.engines.blocked import BlockHandler, refuse_unmodelled
from headscope.errors import notice
from headscope.metrics.base import PatternBatch, key_set_flags
from headscope.models.attention import AttentionCall, RestrictKeys, StopForward, band

FLAG_SETS = ("separator", "punctuation")  # PatternBatch key sets whose mass the kernel sums


def fused_flags(batch: PatternBatch, n_keys: int) -> dict[str, Tensor]:
    """The key sets of ``batch`` for the kernel, exactly as :func:`key_set_mass` counts them."""
    return {
        name: key_set_flags(batch, name, n_keys, batch.lengths.device)
        for name in FLAG_SETS
        if getattr(batch, name) is not None
    }


class FusedHandler(BlockHandler):
    """Kernel output + statistics for the wanted layers; pattern blocks where the kernel cannot
    go."""

    engine = "fused"

    def __init__(
        self,
        on_rows,
        layers,
        flags: dict[str, Tensor],
        reach: tuple = (),
        band: tuple[int, int] | None = None,
        argmax: bool = False,
    ):
        super().__init__(on_rows, layers)
        self.flags = flags
        self.reach = reach
        self.band = band  # (sinks, window): each row's mass on that band (the streaming metric)
        self.argmax = argmax  # each row's arg-max key (the retrieval and rare_word metrics)
        self.fell_back = False

    def __call__(self, call: AttentionCall) -> Tensor:
        if call.layer not in self.layers:
            return super().__call__(call)
        if not kernel.supports(call.query, call.mask):
            if not self.fell_back:
                self.fell_back = True
                kind = (
                    "an additive"
                    if call.mask is not None and call.mask.dtype != torch.bool
                    else "a per-head"
                )
                notice(
                    f"layer {call.layer}'s attention has {kind} mask, which the fused kernel "
                    "does not take: scored from exact pattern blocks (same scores, slower).",
                    once=True,
                )
            return super().__call__(call)
        refuse_unmodelled(call, self.engine)
        reach = self.reach[call.layer] if call.layer < len(self.reach) else None
        # what both kernel entries read besides q, k (and v)
        rest = (call.mask, call.scale, call.causal, self.flags, reach, self.band, self.argmax)
        if call.layer == self.last:  # nothing runs after it: statistics only, no output
            self.on_rows(call.layer, kernel.head_stats(call.query, call.key, *rest), 0)
            raise StopForward
        # the kernel's own output replaces sdpa's: one pass over the scores, not two
        out, stats = kernel.attention(call.query, call.key, call.value, *rest)
        self.on_rows(call.layer, stats, 0)
        # [batch, head, query, dim] -> [batch, query, head, dim]
        return out.transpose(1, 2).contiguous()


class FusedEngine(Engine):
    name = "fused"
    summary = (
        "a C++ kernel replaces each layer's attention: "
        "output plus per-row statistics, one pass (CPU)"
    )

    def unavailable(self, model, metrics):
        if not model.attention_interface:
            return "its attention does not run through transformers' attention interface"
        if model.device.type != "cpu":
            return f"the kernel runs on the CPU only, not {model.device}"
        elsewhere = sorted(
            {
                d
                for d in (getattr(model, "device_map", None) or {}).values()
                if d not in ("cpu", "disk")
            }
        )
        if elsewhere:
            return (
                "the kernel runs on the CPU only, "
                f"and the device map puts layers on {', '.join(elsewhere)}"
            )
        need_pattern = [m.name for m in metrics if not m.fused]
        if need_pattern:
            return (
                f"metric(s) {', '.join(need_pattern)} need the pattern itself "
                "(Metric.fused is False)"
            )
        if not kernel.available():
            return kernel.unavailable_reason()
        return None

    def run(
        self, model, tokens, mask, batch, on_rows, layers=None, interventions=(), token_types=None
    ) -> None:
        layers = range(model.n_layers) if layers is None else layers
        handler = FusedHandler(
            on_rows,
            layers,
            fused_flags(batch, tokens.shape[1]),
            tuple(model.reach),
            batch.band,
            batch.targets is not None or batch.key_counts is not None,
        )
        model.run(
            tokens, mask, handler=handler, interventions=interventions, token_types=token_types
        )


ENGINE = FusedEngine()


# -------------------------------------------------------------------------- a sink + window plan


class Restricted:
    """An attention handler: the heads of ``heads`` (layer, head) see only keys ``k < sinks`` and
    ``q - window < k <= q`` (a sink + window KV cache:
    :class:`~headscope.models.attention.RestrictKeys` with
    :func:`~headscope.models.attention.band`). On the CPU kernel their key tiles outside that band
    are skipped; elsewhere (a GPU, an additive mask) they get that per-head mask and the model's
    own attention."""

    def __init__(self, heads, n_heads: int, sinks: int, window: int):
        self.sinks, self.window = sinks, window
        self.by_layer: dict[int, Tensor] = {}
        for layer, head in heads:
            self.by_layer.setdefault(layer, torch.zeros(n_heads, dtype=torch.bool))[head] = True

    def __call__(self, call: AttentionCall) -> Tensor:
        heads = self.by_layer.get(call.layer)
        if heads is None:
            return call.output()
        if kernel.supports(call.query, call.mask) and not call.extras:
            out, _ = kernel.attention(
                call.query,
                call.key,
                call.value,
                call.mask,
                call.scale,
                call.causal,
                {},
                band=(self.sinks, self.window),
                restrict=heads,
            )
            return out.transpose(1, 2).contiguous()
        restrict = RestrictKeys(call.layer, heads, band(self.sinks, self.window))
        return restrict.before(call).output()
