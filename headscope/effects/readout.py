"""The metric of a task, read at each prompt's last position (docs/patching.md).

* ``logit_diff`` (default): ``logit[answer] - logit[wrong]``;
* ``prob``: ``softmax(logits)[answer]``;
* ``loss``: ``-log softmax(logits)[answer]`` (nats).

Logits are the model's own: the last hidden state after the final norm (what ``Model.run(...,
output="hidden")`` returns) through the LM head, then the model's final logit soft-cap where its
config has one (Gemma 2). Models that rescale their logits otherwise are refused.

Why the unembedding is done here, in blocks of exactly :data:`ROWS` rows (the last one zero-padded):
the BLAS under torch picks another kernel for a matrix product with fewer rows, and its results
differ in the last bits (measured here: a ``[1, 576] x [576, 49152]`` product against the same row
inside a 16-row product). A patched forward has more rows than the cached one it is compared with,
so without fixed blocks "patching a head with its own activation" would move the metric by ~1e-5
instead of nothing. The rest of a forward is row-for-row identical at the shapes used here; the
exactness tests check it on each model they run.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from headscope.errors import HeadscopeError
from headscope.probes.tasks import check_metric

ROWS = 16


def check_logits(model) -> None:
    """Refuse a model whose logits are not ``lm_head(final hidden)`` (+ an optional soft-cap)."""
    cfg = model.hf.config
    for attr in ("logit_scale", "logits_scaling", "output_multiplier_scale"):
        if getattr(cfg, attr, None) not in (None, 1, 1.0):
            raise HeadscopeError(
                f"{model.name} rescales its logits ({attr} = {getattr(cfg, attr)}), which the "
                "patching metric does not reproduce."
            )


def final_logits(model, hidden: Float[Tensor, "row d_model"]) -> Float[Tensor, "row vocab"]:
    """The model's logits from final hidden states (after the final norm), at least float32."""
    head = model.hf.get_output_embeddings()
    n = hidden.shape[0]
    pad = (-n) % ROWS
    if pad:
        hidden = torch.cat(
            [hidden, hidden.new_zeros(pad, hidden.shape[1])]
        )  # [rows, d_model], a multiple of ROWS
    logits = torch.cat([head(block) for block in hidden.split(ROWS)])[:n]  # [row, vocab]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    cap = getattr(model.hf.config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits


def metric_values(
    metric: str,
    logits: Float[Tensor, "row vocab"],
    answer: Int[Tensor, " row"],
    wrong: Int[Tensor, " row"],
) -> Float[Tensor, " row"]:
    """The metric of each row (in the logits' dtype; differentiable)."""
    check_metric(metric)
    a = answer.to(logits.device)[:, None]
    if metric == "logit_diff":
        return (logits.gather(1, a) - logits.gather(1, wrong.to(logits.device)[:, None]))[:, 0]
    logp = torch.log_softmax(logits, dim=-1).gather(1, a)[:, 0]
    return logp.exp() if metric == "prob" else -logp


def read_metric(
    model,
    metric: str,
    hidden: Float[Tensor, "row pos d_model"],
    lengths: Int[Tensor, " row"],
    answer: Int[Tensor, " row"],
    wrong: Int[Tensor, " row"],
) -> tuple[Tensor, Tensor]:
    """``(metric [row], logit_diff [row])`` at each row's last real position (``lengths - 1``)."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    last = hidden[rows, (lengths - 1).to(hidden.device)]  # [row, d_model]
    logits = final_logits(model, last)
    m = metric_values(metric, logits, answer, wrong)
    ld = m if metric == "logit_diff" else metric_values("logit_diff", logits, answer, wrong)
    return m, ld
