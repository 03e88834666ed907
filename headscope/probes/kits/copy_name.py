"""``copy_name``: "I met John Smith at the station. Later that day, I saw John" -> " Smith";
corrupt: the same first name with another surname (the wrong token). Named positions FIRST,
LAST, FIRST2.
"""

from __future__ import annotations

from headscope.probes.kits.base import Kit, fill
from headscope.probes.tasks import Pair


def build(words, data, rng, i, template, t) -> Pair:
    f = rng.choice(words["first"])
    a, b = rng.sample(words["last"], 2)
    clean, spans = fill(template, {"FIRST": f, "LAST": a})
    corrupt, _ = fill(template, {"FIRST": f, "LAST": b})
    chars = [ch for _, ch in spans]
    return Pair(
        clean,
        corrupt,
        " " + a,
        " " + b,
        {"FIRST": {"char": chars[0]}, "LAST": {"char": chars[1]}, "FIRST2": {"char": chars[2]}},
        {"template": str(t), "first": f, "last": a, "corrupt_last": b},
    )


KIT = Kit(
    "copy_name",
    build,
    (("first", 1), ("last", 2)),
    (
        '"I met John Smith at the station. Later that day, I saw John" -> " Smith"',
        "the same first name with another surname (the wrong token)",
        "FIRST, LAST, FIRST2",
    ),
)
