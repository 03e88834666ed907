"""``pronoun``: "Yesterday John went to the store because" -> " he"; corrupt: a name of the
other gender. Answer: the clean name's pronoun; wrong: the other. Named position NAME.
"""

from __future__ import annotations

from headscope.probes.kits.base import Kit, fill
from headscope.probes.tasks import Pair


def build(words, data, rng, i, template, t) -> Pair:
    male, female = words["male"], words["female"]
    he, she = data["pronouns"]["male"], data["pronouns"]["female"]
    if i % 2 == 0:  # half the pairs have a man in the clean prompt, half a woman
        name, other, answer, wrong = rng.choice(male), rng.choice(female), he, she
    else:
        name, other, answer, wrong = rng.choice(female), rng.choice(male), she, he
    clean, spans = fill(template, {"NAME": name})
    corrupt, _ = fill(template, {"NAME": other})
    return Pair(
        clean,
        corrupt,
        " " + answer,
        " " + wrong,
        {"NAME": {"char": spans[0][1]}},
        {"template": str(t), "name": name, "corrupt_name": other},
    )


KIT = Kit(
    "pronoun",
    build,
    (("male", 1), ("female", 1)),
    (
        '"Yesterday John went to the store because" -> " he"',
        "a name of the other gender; wrong = the other pronoun",
        "NAME",
    ),
)
