"""A layer's attention summarised per query row: what the fused engine hands to metrics.

The built-in metrics read a pattern row in three ways only: single entries, the mass on a flagged
key set, and the entropy. :class:`HeadStats` holds the last two for every row (computed by the
fused kernel, :mod:`headscope.engines.kernel`) plus each row's log-sum-exp, from which any single
entry is ``A[q, k] = exp(q·k - lse[q])`` on demand. It implements the
:class:`~headscope.metrics.rows.Rows` protocol, so a metric written with the selectors of
:mod:`headscope.metrics.base` runs on it exactly as on a pattern tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.errors import HeadscopeError


@dataclass
class HeadStats:
    """Per-row statistics standing in for a ``[batch, head, query, key]`` pattern."""

    shape: tuple[int, int, int, int]  # (batch, head, query, key) of the pattern it stands for
    entropy: Float[Tensor, "batch head query"]  # -sum_k A ln A, float64
    masses: dict[str, Float[Tensor, "batch head query"]]  # flag-set name -> sum_k A[q,k] flag[k]
    lse: Float[Tensor, "batch head query"]  # ln sum_k exp(score); -inf for a row that sees nothing
    query: Float[Tensor, "batch head query dim"]  # queries, already times the softmax scale
    key: Float[Tensor, "batch kv_head key dim"]
    causal: bool
    mask: Bool[Tensor, "batch query key"] | None = None  # True = may attend (None: all, or causal)
    q_start: int = 0
    #: ``((sinks, window), mass [batch, head, query])``: each row's mass on the sink + window band.
    band: tuple | None = None
    #: Each row's arg-max key ``[batch, head, query]`` (the first holding the largest weight; -1:
    # none).
    argmax: Int[Tensor, "batch head query"] | None = None
    #: ``((sinks, window), heads [head] bool)``: heads that saw only the band (a KV-plan run).
    restrict: tuple | None = None

    @property
    def device(self) -> torch.device:
        return self.entropy.device

    def row_entropy(self, batch=None) -> Float[Tensor, "batch head query"]:
        """The kernel's per-row entropy (it never counts padding or masked keys)."""
        return self.entropy

    def mass(self, batch, name: str, keys=None) -> Float[Tensor, "batch head query"]:
        """The kernel's mass on flag set ``name`` (it summed A over exactly the keys
        :func:`~headscope.metrics.base.key_set_flags` gives for that set, where visible)."""
        if name not in self.masses:
            raise HeadscopeError(
                "The fused kernel summed attention only over "
                f"{', '.join(self.masses) or 'no key sets'}, "
                f"not '{name}'; a metric reading another key set needs Metric.fused = False."
            )
        return self.masses[name]

    def at(
        self, keys: Int[Tensor, "*batch query"], batch=None
    ) -> Float[Tensor, "batch head query"]:
        """``A[b, h, q, keys[q]]`` for every row (``keys`` ``[query]``, or ``[batch, query]`` for
        a key per sequence); 0 where that key is out of range or not visible."""
        b, h, n_q, n_k = self.shape
        kvh = self.key.shape[1]
        keys = keys.to(self.device).expand(b, n_q)  # [batch, query]
        inside = (keys >= 0) & (keys < n_k)
        kc = keys.clamp(0, n_k - 1)
        rows = torch.arange(b, device=self.device)[:, None]
        # [b, kv_head, query, dim, 1]
        k_sel = self.key[rows, :, kc].permute(0, 2, 1, 3).unsqueeze(-1)
        # [b, kv_head, query, group, dim]
        q = self.query.view(b, kvh, h // kvh, n_q, -1).transpose(2, 3)
        # the score of that key, by the same float32 GEMM arithmetic as the kernel's scores
        s = (q @ k_sel).squeeze(-1).transpose(2, 3).reshape(b, h, n_q).double()
        finite = torch.isfinite(self.lse)
        p = torch.where(finite, torch.exp(s - torch.where(finite, self.lse, 0.0)), 0.0)
        pos = torch.arange(n_q, device=self.device) + (n_k - n_q)  # [query]
        vis = inside  # [batch, query]
        if self.causal:
            vis = vis & (kc <= pos[None, :])
        if self.mask is not None:
            vis = vis & self.mask[rows, torch.arange(n_q, device=self.device)[None, :], kc]
        vis = vis[:, None, :].expand(b, h, n_q)
        if self.restrict is not None:  # restricted heads see only the band
            (sinks, window), heads = self.restrict
            in_band = (kc < sinks) | (pos[None, :] - kc < window)  # [batch, query]
            vis = vis & (in_band[:, None, :] | ~heads.to(self.device)[None, :, None])
        return p * vis

    def band_mass(self, batch, sinks: int, window: int) -> Float[Tensor, "batch head query"]:
        """The kernel's per-row mass on keys ``k < sinks`` and ``q - window < k <= q``."""
        if self.band is None or tuple(self.band[0]) != (sinks, window):
            raise HeadscopeError(
                f"The fused kernel was not asked for the ({sinks}, {window}) sink + window band."
            )
        return self.band[1]

    def arg_max(self, batch=None) -> Int[Tensor, "batch head query"]:
        """The kernel's per-row arg-max key."""
        if self.argmax is None:
            raise HeadscopeError("The fused kernel was not asked for each row's arg-max key.")
        return self.argmax
