"""Where a path ends, by name (light: no torch, so settings naming receivers are checked before
anything loads).

* :class:`Receiver`: ``logits`` (the residual stream at the last position, read by the
  unembedding), or head ``(layer, head)``'s query, key or value input at a position: ``all``, a
  named position of the task (IOI's ``END``, ``S2``; shifted: ``S1+1``) or a token index. Written
  ``logits`` or ``L9H1.q@END`` (``@all`` left out).
* :class:`ReceiverGroup`: several heads' inputs of one kind written together.

>>> Receiver.parse("L9H1.q@END"), Receiver.parse("L9H1.q@END").name
(Receiver(kind='q', layer=9, head=1, position='END'), 'L9H1.q@END')
>>> parse_head("L3H0")
(3, 0)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from headscope.errors import HeadscopeError, did_you_mean

#: What a receiver reads: the logits (the residual stream at the last position), or one head's
#: query, key or value input.
RECEIVER_KINDS = ("logits", "q", "k", "v")
#: The attend() stage path patching writes for each head kind (per query head: with grouped-query
#: attention only the receiver head reads the new key or value).
STAGE = {"q": "q", "k": "k_head", "v": "v_head"}
_NAME = re.compile(r"^L(\d+)H(\d+)\.([a-z]+)(?:@(\S+))?$")
_HEAD = re.compile(r"^L(\d+)H(\d+)$")


def parse_head(text: str) -> tuple[int, int]:
    """``L3H0`` -> ``(3, 0)``, or one line saying how to write a head."""
    m = _HEAD.match(str(text).strip())
    if not m:
        raise HeadscopeError(f"Cannot read head '{text}'; write LAYERhHEAD, e.g. L3H0.")
    return int(m[1]), int(m[2])


@dataclass(frozen=True)
class Receiver:
    """Where a path ends: ``logits``, or head ``(layer, head)``'s ``q``/``k``/``v`` input at
    ``position`` (``all``, a named position of the task such as IOI's ``END``, or a token index)."""

    kind: str
    layer: int = -1
    head: int = -1
    position: str = "all"

    @property
    def name(self) -> str:
        if self.kind == "logits":
            return "logits"
        at = "" if self.position == "all" else f"@{self.position}"
        return f"L{self.layer}H{self.head}.{self.kind}{at}"

    @classmethod
    def parse(cls, text: str) -> Receiver:
        """``logits`` or ``L9H1.q``, ``L9H1.k@S2``: the names :attr:`name` writes."""
        text = text.strip()
        if text == "logits":
            return cls("logits")
        m = _NAME.match(text)
        if not m:
            raise HeadscopeError(
                f"Cannot read receiver '{text}'; write logits or LAYERhHEAD.KIND[@POSITION], "
                "e.g. L9H1.q@END (KIND: q, k or v)."
            )
        layer, head, kind, pos = int(m[1]), int(m[2]), m[3], m[4] or "all"
        check_kind(kind)
        return cls(kind, layer, head, pos)


@dataclass(frozen=True)
class ReceiverGroup:
    """Several heads' inputs of one kind that step (3) writes together (Wang et al. patch the path
    into every name mover's query at once): ``members`` are :class:`Receiver` s of one kind."""

    members: tuple[Receiver, ...]
    label: str = ""

    def __post_init__(self) -> None:
        kinds = {r.kind for r in self.members}
        if not self.members or len(kinds) != 1 or "logits" in kinds:
            raise HeadscopeError(
                "A receiver group holds one or more heads' inputs of one kind (q, k or v), "
                f"not {', '.join(r.name for r in self.members) or 'nothing'}."
            )

    @property
    def kind(self) -> str:
        return self.members[0].kind

    @property
    def layer(self) -> int:
        """The lowest member's layer: a sender must lie below every member."""
        return min(r.layer for r in self.members)

    @property
    def name(self) -> str:
        return self.label or "+".join(r.name for r in self.members)


def check_kind(kind: str) -> str:
    if kind not in RECEIVER_KINDS:
        raise HeadscopeError(
            f"Unknown receiver input '{kind}'.{did_you_mean(kind, RECEIVER_KINDS)} "
            f"Use one of {', '.join(RECEIVER_KINDS)}."
        )
    return kind


def members(target: Receiver | ReceiverGroup) -> tuple[Receiver, ...]:
    """A group's members, or the receiver itself."""
    return target.members if isinstance(target, ReceiverGroup) else (target,)


#: A path: a sender head ``(layer, head)`` and the receiver its output reaches.
Path = tuple[tuple[int, int], "Receiver | ReceiverGroup"]
