"""The induction task as prompt pairs: a repeated sequence of random tokens, and the same prompt
with its first copy redrawn, so that only the first copy can tell the model the next token.

Pair ``i`` (``L`` = ``length``, ``m`` = ``prefix``, tokens ``a_0 .. a_{L-1}`` drawn from the
model's ordinary vocabulary without repeats inside a sequence)::

    clean    BOS a_0 .. a_{L-1} a_0 .. a_{m-1}        answer a_m   (an induction head's copy)
    corrupt  BOS b_0 .. b_{L-1} a_0 .. a_{m-1}        b: L fresh tokens, none of a's

The metric is read at the last token ``a_{m-1}`` (``END``); ``wrong`` is a random ordinary token
outside both sequences. Named positions (counted with the BOS at 0): ``MATCH`` (``m``, the earlier
``a_{m-1}``), ``KEY`` (``m + 1``, the earlier ``a_m``: the key an induction head at END attends
to; a previous-token head writes ``a_{m-1}`` there) and ``FIRST`` (1, the first token after BOS).
Built from token ids, not text: random tokens do not survive a decode and re-encode.

>>> repeat_task.__name__
'repeat_task'
"""

from __future__ import annotations

import torch

from headscope.errors import HeadscopeError
from headscope.probes.tasks import TokenizedTask


def repeat_task(
    model, n_pairs: int = 32, length: int = 20, prefix: int | None = None, seed: int = 0
) -> TokenizedTask:
    """The task of the module docstring (``prefix`` default: ``length // 2``)."""
    prefix = length // 2 if prefix is None else prefix
    if not 1 <= prefix < length:
        raise HeadscopeError(
            f"prefix must be 1..{length - 1} (tokens of the second copy before the answer), got "
            f"{prefix}."
        )
    if n_pairs < 1 or length < 2:
        raise HeadscopeError(f"n_pairs >= 1 and length >= 2, got {n_pairs} and {length}.")
    vocab = model.ordinary_vocab()
    if len(vocab) < 2 * length + 1:
        raise HeadscopeError(
            f"{model.name} has {len(vocab)} ordinary tokens; too few for two copies."
        )
    g = torch.Generator().manual_seed(int(seed))
    bos = [model.bos_id] if model.bos_id is not None else []
    clean, corrupt, answer, wrong = [], [], [], []
    for _ in range(n_pairs):
        pick = vocab[torch.randperm(len(vocab), generator=g)[: 2 * length + 1]].tolist()
        a, b, w = pick[:length], pick[length : 2 * length], pick[-1]
        clean.append([*bos, *a, *a[:prefix]])
        corrupt.append([*bos, *b, *a[:prefix]])
        answer.append(a[prefix])
        wrong.append(w)
    off = len(bos)
    positions = {
        "FIRST": [off] * n_pairs,
        "MATCH": [off + prefix - 1] * n_pairs,
        "KEY": [off + prefix] * n_pairs,
    }
    info = [{"length": length, "prefix": prefix, "seed": seed}] * n_pairs
    return TokenizedTask("repeat", clean, corrupt, answer, wrong, positions, "logit_diff", info)
