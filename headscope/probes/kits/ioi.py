"""``ioi`` (Wang et al. 2022): their 15 BABA templates and the 15 ABBA templates derived from
them, alternating (pair 0 BABA, pair 1 ABBA, ...), each pair's template drawn from its order; the
prompt stops before the final indirect object. Answer: the indirect object IO ([A]); wrong: the
subject S ([B]). Corrupt: the ABC prompt, IO, S1 and S2 replaced by three other names. Named
positions IO, S1, S2 (and END). Templates: BABA 0..14, then ABBA 15..29.
"""

from __future__ import annotations

import re

from headscope.probes.kits.base import Kit, fill
from headscope.probes.tasks import Pair


def build(words, data, rng, i, template, t) -> Pair:
    names, places, objects = words["names"], words["places"], words["objects"]
    assert template.endswith(" [A]")
    template = template[: -len(" [A]")]  # the prompt stops before the indirect object
    a, b, c, d, e = rng.sample(names, 5)  # IO, S; the ABC corruption's three other names
    nouns = {"PLACE": rng.choice(places), "OBJECT": rng.choice(objects)}
    clean, spans = fill(template, {"A": a, "B": b, **nouns})
    # ABC: the IO, first S and second S become c, d, e (one name per occurrence, in order)
    order = iter([c, d, e])
    corrupt_template = re.sub(r"\[(A|B)\]", lambda m: next(order), template)
    corrupt, _ = fill(corrupt_template, nouns)
    s_chars = [ch for slot, ch in spans if slot == "B"]
    io_char = next(ch for slot, ch in spans if slot == "A")
    order = "BABA" if t < len(data["templates"]["BABA"]) else "ABBA"
    return Pair(
        clean,
        corrupt,
        " " + a,
        " " + b,
        {"IO": {"char": io_char}, "S1": {"char": s_chars[0]}, "S2": {"char": s_chars[1]}},
        {"template": str(t), "order": order, "IO": a, "S": b, "corrupt_names": f"{c},{d},{e}"},
    )


def templates(data: dict) -> list[str]:
    return data["templates"]["BABA"] + data["templates"]["ABBA"]


def order(data: dict, chosen: list[int], i: int) -> list[int]:
    """BABA templates for even pairs, ABBA for odd ones, where the chosen templates have both."""
    n_baba = len(data["templates"]["BABA"])
    same = [t for t in chosen if (t < n_baba) == (i % 2 == 0)]
    return same or chosen


KIT = Kit(
    "ioi",
    build,
    (("names", 5), ("places", 1), ("objects", 1)),
    (
        '"Then, John and Mary went to the store. John gave a drink to" -> " Mary" (the '
        "indirect object IO)",
        'ABC: IO, S1 and S2 replaced by three other names; wrong = the subject S (" John")',
        "IO, S1, S2",
    ),
    templates,
    order,
)
