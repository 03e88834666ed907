"""``capital``: "The capital of France is the city of" -> " Paris"; corrupt: another country.
Answer: the clean country's capital; wrong: the corrupt country's. Named position COUNTRY.
"""

from __future__ import annotations

from headscope.probes.kits.base import Kit, fill, need, single_token_words
from headscope.probes.tasks import Pair


def build(words, data, rng, i, template, t) -> Pair:
    caps = data["capitals"]
    a, b = rng.sample(words["countries"], 2)
    clean, spans = fill(template, {"COUNTRY": a})
    corrupt, _ = fill(template, {"COUNTRY": b})
    return Pair(
        clean,
        corrupt,
        " " + caps[a],
        " " + caps[b],
        {"COUNTRY": {"char": spans[0][1]}},
        {"template": str(t), "country": a, "corrupt_country": b},
    )


def countries(data: dict, model) -> dict[str, list[str]]:
    """The countries whose name and capital are both single tokens for ``model``."""
    caps = data["capitals"]
    single = set(single_token_words(model, caps.values()))
    usable = [c for c in single_token_words(model, caps) if caps[c] in single]
    return {"countries": need(usable, 2, "country/capital pairs", "capital", model)}


KIT = Kit(
    "capital",
    build,
    (),
    (
        '"The capital of France is the city of" -> " Paris"',
        "another country; wrong = its capital",
        "COUNTRY",
    ),
    words=countries,
)
