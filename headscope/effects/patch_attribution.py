"""Attribution patching (first order, Nanda 2023): every head, every activation kind, both
directions, from one forward on each prompt and one backward per direction. Always labelled
``attribution``.

For a patch of activation ``a`` (one head's slice of a stage) from the source run into the base run,
the metric moves by, to first order,

    est = sum over the patched positions p of  grad_m(a)[p] . (a_source[p] - a_base[p])

with the gradient taken in the base run (denoising: the corrupt run; noising: the clean run),
through everything after ``a`` (later layers included). ``m_patched ~ m_base + est`` per pair, and
the estimate goes through the same ratio-of-means and bootstrap as an exact patch.

How the gradients are read: :func:`~headscope.effects.stages.attend` adds a zero tensor with
``requires_grad`` at each stage of each layer (``q``, per-head ``k_head``/``v_head``, ``pattern``,
``z``), and one ``torch.autograd.grad`` of the summed metric gives ``d m_i / d delta`` for every
pair ``i`` at once (pairs are separate rows; no parameter gradients are computed). The group-mode
(KV head) estimate of ``k``/``v`` is the sum over the query heads of the group, since the KV head
reaches the metric only through their copies; for ``pattern`` the dot product runs over keys and
the positions are query rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.effects.patching import Batch, position_masks, stage_of
from headscope.effects.readout import read_metric
from headscope.effects.stages import explicit_handler, softmax_pattern
from headscope.models.attention import AttentionCall, StopForward

#: the per-head stages gradients are taken at, per activation kind
GRAD_STAGE = {"z": "z", "q": "q", "k": "k_head", "v": "v_head", "pattern": "pattern"}


def _shape(stage: str, b: int, n: int, heads: int, d: int) -> tuple[int, ...]:
    return {"z": (b, n, heads, d), "pattern": (b, heads, n, n)}.get(stage, (b, heads, n, d))


@contextlib.contextmanager
def no_parameter_grads(model) -> Iterator[None]:
    """The model's parameters stop requiring grad for one pass (under the model's lock), restored
    after: autograd then records only what the deltas need (measured on SmolLM2, 32 x 21 tokens:
    a forward + backward in 0.65 of the time it takes with parameters recorded too)."""
    with model._lock:
        params = [p for p in model.hf.parameters() if p.requires_grad]
        for p in params:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in params:
                p.requires_grad_(True)


def _stop_after(handler, last: int):
    """``handler``, ending the forward once layer ``last``'s attention has run (what follows it,
    the last MLP and the final norm, no stage of a source run needs)."""

    def run(call: AttentionCall) -> Tensor:
        out = handler(call)
        if call.layer == last:
            raise StopForward
        return out

    return run


def _calls_into(calls: dict | None, handler):
    """``handler``, also keeping each layer's :class:`AttentionCall` in ``calls`` (when given)."""
    if calls is None:
        return handler

    def run(call: AttentionCall) -> Tensor:
        calls[call.layer] = call
        return handler(call)

    return run


def grad_run(
    model, batch: Batch, prompt: str, metric: str, stages: Sequence[str], calls: dict | None = None
):
    """One forward of ``prompt`` with a zero delta at ``stages`` of every layer, one backward:
    ``(acts {layer: {stage: tensor}}, grads {layer: {stage: d sum(m) / d stage}}, m [b])``;
    ``calls`` (a dict) receives each layer's attention call (its scale, mask, soft cap)."""
    b, n = batch.mask.shape
    deltas = {
        layer: {
            s: torch.zeros(
                _shape(s, b, n, model.n_heads, model.d_head),
                device=model.device,
                dtype=model.dtype,
                requires_grad=True,
            )
            for s in stages
        }
        for layer in range(model.n_layers)
    }
    acts: dict[int, dict[str, Tensor]] = {}
    with no_parameter_grads(model):
        hidden = model.run(
            batch.tokens(prompt),
            batch.mask,
            output="hidden",
            grad=True,
            handler=_calls_into(
                calls, explicit_handler(acts, tuple(stages), deltas_by_layer=deltas)
            ),
        )
        with torch.enable_grad():
            m, _ = read_metric(model, metric, hidden, batch.lengths, batch.answer, batch.wrong)
            flat = [(layer, s) for layer in range(model.n_layers) for s in stages]
            grads = torch.autograd.grad(m.sum(), [deltas[layer][s] for layer, s in flat])
    out: dict[int, dict[str, Tensor]] = {}
    for (layer, s), g in zip(flat, grads, strict=True):
        out.setdefault(layer, {})[s] = g
    return acts, out, m.detach()


def contributions(
    stage: str, grad: Tensor, base: Tensor, source: Tensor
) -> Float[Tensor, "b head pos"]:
    """``grad . (source - base)`` per pair, head and position (the stage's dim summed; keys for
    ``pattern``), float64."""
    c = (grad.double() * (source.double() - base.double())).sum(
        -1
    )  # z: [b, pos, head]; others [b, head, pos]
    return c.transpose(1, 2) if stage == "z" else c


def attribution_patching(
    model,
    batches: Sequence[Batch],
    n_pairs: int,
    metric: str,
    kinds: Sequence[str],
    kv_modes: Sequence[str],
    positions: Sequence[str],
    directions: Sequence[str],
) -> dict[tuple, Float[Tensor, "pair layer unit"]]:
    """First-order estimate of ``m_patched - m_base`` per pair, for every head:
    ``{(direction, kind, kv_mode, position label): [pair, layer, unit]}`` (float64), units as in
    :func:`~headscope.effects.patching.n_units` (KV heads for group-mode k/v)."""
    stages = sorted({GRAD_STAGE[k] for k in kinds})
    group = model.n_heads // model.n_kv_heads
    out: dict[tuple, Tensor] = {}
    for batch in batches:
        runs = {}
        for prompt in ("clean", "corrupt"):
            base_of = {"denoising": "corrupt", "noising": "clean"}
            if any(base_of[d] == prompt for d in directions):  # a base: gradients needed
                runs[prompt] = grad_run(model, batch, prompt, metric, stages)
            else:  # only a source: its activations, up to the last layer's attention
                acts: dict = {}
                model.run(
                    batch.tokens(prompt),
                    batch.mask,
                    handler=_stop_after(explicit_handler(acts, tuple(stages)), model.n_layers - 1),
                    output=None,
                )
                runs[prompt] = (acts, None, None)
        for direction in directions:
            base, src = ("corrupt", "clean") if direction == "denoising" else ("clean", "corrupt")
            (base_acts, grads, _), (src_acts, _, _) = runs[base], runs[src]
            for kind in kinds:
                s = GRAD_STAGE[kind]
                per = torch.stack(
                    [
                        contributions(s, grads[la][s], base_acts[la][s], src_acts[la][s])
                        for la in range(model.n_layers)
                    ],
                    1,
                ).cpu()  # [b, layer, head, pos]
                per = per * batch.mask[:, None, None, :]  # padding never counts
                for kv_mode in kv_modes if kind in ("k", "v") else ("head",):
                    units = per
                    if stage_of(kind, kv_mode) in (
                        "k",
                        "v",
                    ):  # the KV head: the sum over its query heads
                        b, L, H, n = per.shape
                        units = per.view(b, L, H // group, group, n).sum(
                            3
                        )  # [b, layer, kv_head, pos]
                    for pos in positions:
                        for label, where in position_masks(batch, pos):
                            est = (units * where[:, None, None, :]).sum(-1)  # [b, layer, unit]
                            key = (direction, kind, kv_mode, label)
                            if key not in out:
                                out[key] = torch.full(
                                    (n_pairs, *est.shape[1:]), torch.nan, dtype=torch.float64
                                )
                            out[key][batch.index] = est
    return out


def qk_fixed(
    model, batches: Sequence[Batch], n_pairs: int, metric: str, direction: str = "noising"
) -> dict[str, Float[Tensor, "pair layer unit"]]:
    """AtP*'s fix for saturated attention (Kramár et al. 2024, "QK fix") for patching a head's
    whole query (every position), or a KV head's whole key, from the source run: the layer's
    pattern recomputed exactly through the softmax with the patched query or key, the rest to
    first order,

        est = sum over query rows and keys of  d m / d pattern . (A(q', k') - A(q, k))

    where plain attribution takes ``d m / d q . (q' - q)``, which misses how far a saturated
    softmax moves (it barely moves until it flips). Both from one forward and backward of the base
    prompt and a forward of the source. Returns, per pair (float64): ``"q"`` ``[layer, head]``,
    ``"k"`` ``[layer, kv_head]`` (the KV head's key patched for every query head of its group),
    ``"k_head"`` ``[layer, head]`` (what one query head reads of it), and the plain estimates of
    the same patches, ``"atp_q"``, ``"atp_k"``, ``"atp_k_head"``."""
    base, src = ("corrupt", "clean") if direction == "denoising" else ("clean", "corrupt")
    L, H, group = model.n_layers, model.n_heads, model.n_heads // model.n_kv_heads
    units = {"q": H, "k": H // group, "k_head": H}
    out = {
        f"{pre}{k}": torch.full((n_pairs, L, u), torch.nan, dtype=torch.float64)
        for k, u in units.items()
        for pre in ("", "atp_")
    }
    for batch in batches:
        calls: dict = {}
        acts, grads, _ = grad_run(model, batch, base, metric, ("q", "k_head", "pattern"), calls)
        s_acts: dict = {}
        model.run(
            batch.tokens(src),
            batch.mask,
            handler=_stop_after(explicit_handler(s_acts, ("q", "k_head")), L - 1),
            output=None,
        )
        real = batch.mask.to(model.device)  # [b, pos]: padding never counts
        b = real.shape[0]
        for la in range(L):
            a, s, call = acts[la], s_acts[la], calls[la]
            a0 = softmax_pattern(call, a["q"], a["k_head"])
            g = grads[la]["pattern"].to(a0.dtype) * real[:, None, :, None]  # query rows
            for key, new in (
                ("q", softmax_pattern(call, s["q"], a["k_head"])),
                ("k_head", softmax_pattern(call, a["q"], s["k_head"])),
            ):
                moved = torch.where(real[:, None, :, None], new - a0, 0.0)
                out[key][batch.index, la] = (moved * g).sum((-1, -2)).double().cpu()
                plain = contributions(key, grads[la][key], a[key], s[key])  # [b, head, pos]
                plain = (plain * real[:, None, :]).sum(-1).cpu()
                out[f"atp_{key}"][batch.index, la] = plain
        for pre in ("", "atp_"):
            per_head = out[f"{pre}k_head"][batch.index]
            out[f"{pre}k"][batch.index] = per_head.view(b, L, H // group, group).sum(-1)
    return out
