"""Which query and key a head is decomposed at (:mod:`headscope.circuits.qk_attribution`): the
rules (the key a head attends to most, position 0, an induction target, a number or a task's
named position) and each instance's null key (docs/qk.md)."""

from __future__ import annotations

import torch
from torch import Tensor

from headscope.circuits.qk_attribution import Instances, QKRecord
from headscope.errors import HeadscopeError

#: key rules besides a named or numbered position
KEY_RULES = ("argmax", "sink", "induction")
#: query rules besides a named or numbered position
QUERY_RULES = ("last", "all")


def _position(spec, rows: int, n: int, positions: dict | None, what: str) -> Tensor:
    """A named (``positions[name]``, one per row) or numbered position (negative: from the end)
    as ``[rows]`` indices."""
    if positions and spec in positions:
        return torch.as_tensor(positions[spec], dtype=torch.long)
    try:
        p = int(spec)
    except (TypeError, ValueError):
        names = ", ".join(sorted(positions)) if positions else "none (not a task)"
        raise HeadscopeError(
            f"Unknown {what} position '{spec}'; use a number, a rule, or one of the task's "
            f"positions: {names}."
        ) from None
    if not -n <= p < n:
        raise HeadscopeError(f"The {what} position {p} is outside prompts of {n} tokens.")
    return torch.full((rows,), p % n, dtype=torch.long)


def instances(
    rec: QKRecord,
    layer: int,
    head: int,
    query="last",
    key="argmax",
    positions: dict | None = None,
    seed: int = 0,
) -> Instances:
    """Where head ``(layer, head)`` is decomposed, per row of ``rec``: the query positions
    (``last``, ``all`` from position 1, a number, or a task's named position) and each one's key
    (``argmax``: the key it attends to most; ``sink``: position 0; ``induction``: the token after
    the query token's previous occurrence, queries without one left out; a number or a named
    position, which must not come after its query: with ``all``, the queries before it are left
    out)."""
    ids = rec.ids
    rows_n, n = ids.shape
    pat = rec.head_pattern(layer, head)  # [row, query, key]
    vis = rec.visible(layer)
    vis = vis[:, 0 if vis.shape[1] == 1 else head].expand(rows_n, n, n)
    if query == "all":
        r, i = torch.meshgrid(torch.arange(rows_n), torch.arange(1, n), indexing="ij")
        r, i = r.reshape(-1), i.reshape(-1)
    else:
        spec = n - 1 if query == "last" else query
        i = _position(spec, rows_n, n, positions, "query")
        r = torch.arange(rows_n)
    if key == "argmax":
        j = pat[r, i].argmax(-1)
    elif key == "sink":
        j = torch.zeros_like(i)
    elif key == "induction":
        j = torch.full_like(i, -1)
        for t, (row, q) in enumerate(zip(r.tolist(), i.tolist(), strict=True)):
            seq = ids[row, :q].tolist()
            prev = [p for p, tok in enumerate(seq) if tok == int(ids[row, q])]
            if prev and prev[-1] + 1 < q:
                j[t] = prev[-1] + 1
        keep = j >= 0
        if not keep.any():
            raise HeadscopeError(
                "No query has an earlier occurrence of its token, so no induction target; "
                "use a repeated probe (--probe repeat) or another key rule."
            )
        r, i, j = r[keep], i[keep], j[keep]
    else:
        j = _position(key, rows_n, n, positions, "key")[r]
        if query == "all":  # every query that can see it: from the key's position on
            keep = i >= j
            r, i, j = r[keep], i[keep], j[keep]
        if (j > i).any():
            bad = int((j > i).nonzero()[0, 0])
            raise HeadscopeError(
                f"The key position {int(j[bad])} comes after its query {int(i[bad])} in row "
                f"{int(r[bad])}; a decoder's query sees only earlier keys."
            )
    ok = vis[r, i, j]
    if not ok.all():
        bad = int((~ok).nonzero()[0, 0])
        raise HeadscopeError(
            f"Query {int(i[bad])} cannot see key {int(j[bad])} in row {int(r[bad])} (the model's "
            "mask: causal, or a sliding window); choose a visible key."
        )
    null = _null_keys(vis[r, i], j, pat[r, i].argmax(-1), seed)
    return Instances(r, i, j, null)


def _null_keys(visible: Tensor, key: Tensor, top: Tensor, seed: int) -> Tensor:
    """Per instance (``visible``: ``[n, keys]``), the visible key nearest ``key`` that is neither
    it nor ``top``; ties drawn at random (one draw per instance that has a candidate, in order,
    from a generator seeded ``seed``); -1 where none is left."""
    n_keys = visible.shape[1]
    cand = visible.clone()
    rows = torch.arange(len(key))
    cand[rows, key] = False
    cand[rows, top] = False
    dist = (torch.arange(n_keys)[None] - key[:, None]).abs().masked_fill(~cand, n_keys + 1)
    near = cand & (dist == dist.min(1, keepdim=True).values)
    counts = near.sum(1).tolist()
    at = near.nonzero()[:, 1].tolist()  # the near keys, instance by instance, in key order
    gen = torch.Generator().manual_seed(seed)
    null = torch.full_like(key, -1)
    start = 0
    for t, c in enumerate(counts):
        if c:
            null[t] = at[start + int(torch.randint(c, (1,), generator=gen))]
        start += c
    return null
