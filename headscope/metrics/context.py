"""What a metric needs besides the attention itself: which positions are real and which are
special."""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Bool, Float, Int
from torch import Tensor


@dataclass(frozen=True)
class PatternBatch:
    """What a metric needs besides the pattern: which positions are real and which are special."""

    lengths: Int[Tensor, " batch"]  # real (non-padding) tokens per sequence
    causal: bool  # a causal model: query q sees keys k <= q
    q_start: int = 0  # absolute position of the pattern's first query row
    separator: Bool[Tensor, "batch key"] | None = None  # keys holding the separator token
    punctuation: Bool[Tensor, "batch key"] | None = None  # keys holding a punctuation token
    repeat_len: int | None = None  # L of the repeat probe: BOS + R + R, |R| = L
    #: A sliding-window layer's reach: a query sees only keys with ``|q - k| <= reach`` (None: all).
    #: It decides which keys a uniform head spreads over (chance); qualifying queries never depend
    # on it.
    reach: int | None = None
    #: ``(sinks, window)`` of the sink + window band the ``streaming`` metric reads (None: not
    # asked).
    band: tuple[int, int] | None = None
    #: The needle probe's answer queries: per (sequence, query) the key position of the needle token
    #: the query's next token copies, -1 for every other query (``retrieval``).
    targets: Int[Tensor, "batch query"] | None = None
    #: Each key's unigram count in the bundled prose (``inf``: not counted), for ``rare_word``.
    key_counts: Float[Tensor, "batch key"] | None = None

    def to(self, device) -> PatternBatch:
        """The same context with its tensors on ``device``."""

        def mv(t):
            return None if t is None else t.to(device)

        return PatternBatch(
            lengths=self.lengths.to(device),
            causal=self.causal,
            q_start=self.q_start,
            separator=mv(self.separator),
            punctuation=mv(self.punctuation),
            repeat_len=self.repeat_len,
            reach=self.reach,
            band=self.band,
            targets=mv(self.targets),
            key_counts=mv(self.key_counts),
        )
