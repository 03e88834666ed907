"""Built-in task kits: templates and word lists in ``headscope/data/tasks/<kit>.json`` (each file
records where its contents came from), filled in for one model's tokenizer, seeded.

Every word a slot takes is kept only if it is a single token *with its leading space* for that
tokenizer (slots never start a prompt), so a clean prompt and its corrupt twin always tokenize to
the same length, and every pair of one template has the same length too (``positions="each"``
needs that: pass ``templates=[i]``). Pairs are drawn with ``random.Random(seed)``: a template,
then the words.

* ``ioi`` (Wang et al. 2022): their 15 BABA templates and the 15 ABBA templates derived from them,
  alternating (pair 0 BABA, pair 1 ABBA, ...), each pair's template drawn from its order; the
  prompt stops before the final indirect object.
  Answer: the indirect object IO ([A]); wrong: the subject S ([B]). Corrupt: the ABC prompt, IO,
  S1 and S2 replaced by three other names. Named positions IO, S1, S2 (and END).
* ``capital``: "The capital of France is the city of" -> " Paris"; corrupt: another country.
  Answer: the clean country's capital; wrong: the corrupt country's. Named position COUNTRY.
* ``pronoun``: "Yesterday John went to the store because" -> " he"; corrupt: a name of the other
  gender. Answer: the clean name's pronoun; wrong: the other. Named position NAME.
* ``copy_name``: "I met John Smith at the station. Later that day, I saw John" -> " Smith";
  corrupt: the same first name with another surname (the wrong token). Named positions FIRST,
  LAST, FIRST2.
"""

from __future__ import annotations

import json
import random
import re
from functools import cache
from pathlib import Path

from headscope.errors import HeadscopeError, did_you_mean
from headscope.probes.tasks import Pair, Task, TokenizedTask, check_metric

DATA = Path(__file__).resolve().parent.parent / "data" / "tasks"
KITS = ("ioi", "capital", "pronoun", "copy_name")
N_PAIRS = 64


@cache
def kit_data(name: str) -> dict:
    """The kit's data file, parsed (templates, word lists, provenance)."""
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def load_kit(
    name: str,
    model,
    n_pairs: int = N_PAIRS,
    seed: int = 0,
    metric: str = "logit_diff",
    templates: list[int] | None = None,
) -> Task:
    """The kit ``name`` as a :class:`Task` of ``n_pairs`` pairs for ``model``'s tokenizer.

    ``templates``: indices into the kit's template list (IOI: BABA 0..14 then ABBA 15..29) to draw
    from; None: all of them.
    """
    if name not in KITS:
        raise HeadscopeError(
            f"Unknown task kit '{name}'.{did_you_mean(name, KITS)} Use one of {', '.join(KITS)}, "
            "or a .jsonl / .tsv file of pairs."
        )
    check_metric(metric)
    if n_pairs < 1:
        raise HeadscopeError(f"n_pairs (--n-pairs) must be at least 1, got {n_pairs}.")
    data = kit_data(name)
    all_templates = _templates(name, data)
    chosen = list(range(len(all_templates))) if templates is None else list(templates)
    if not chosen or any(not 0 <= t < len(all_templates) for t in chosen):
        raise HeadscopeError(
            f"Kit '{name}' has templates 0..{len(all_templates) - 1}; got {templates}."
        )
    rng = random.Random(seed)
    words = _usable_words(name, data, model)
    build = {"ioi": _ioi, "capital": _capital, "pronoun": _pronoun, "copy_name": _copy_name}[name]
    pairs = []
    for i in range(n_pairs):
        t = rng.choice(_order_of(name, data, chosen, i))
        pairs.append(build(words, data, rng, i, all_templates[t], t))
    provenance = {
        "source": "kit",
        "kit": name,
        "file": f"headscope/data/tasks/{name}.json",
        "seed": seed,
        "n_pairs": n_pairs,
        "templates": chosen,
        **data["provenance"],
    }
    return Task(name, tuple(pairs), metric, True, provenance)


def is_task_file(task) -> bool:
    """Whether ``task`` (a string or path) names a task file rather than a kit."""
    text = str(task)
    return text.endswith((".jsonl", ".tsv")) or Path(text).is_file()


def check_task(task) -> Task | str:
    """What a task argument is, checked without a model: a :class:`Task` (from a ``.jsonl`` /
    ``.tsv``
    file, read now) or a kit name; anything else gets one line (the nearest kit named)."""
    if isinstance(task, Task):
        return task
    if isinstance(task, (str, Path)):
        if is_task_file(task):
            return Task.from_file(task)
        if str(task) in KITS:
            return str(task)
        raise HeadscopeError(
            f"Unknown task kit '{task}'.{did_you_mean(str(task), KITS)} Use one of "
            f"{', '.join(KITS)}, or a .jsonl / .tsv file of pairs."
        )
    raise HeadscopeError(
        f"A task is a Task, a kit name ({', '.join(KITS)}) or a .jsonl / .tsv file, "
        f"not a {type(task).__name__}."
    )


def resolve_task(
    task,
    model,
    metric: str | None = None,
    n_pairs: int | None = None,
    seed: int = 0,
    templates: list[int] | None = None,
) -> Task:
    """A :class:`Task` from what a user passed: a Task, a kit name or a ``.jsonl`` / ``.tsv`` path.
    ``metric`` (None: the task's own) overrides the task's; ``n_pairs``, ``seed`` and
    ``templates`` shape a kit (a file's pairs are all read; :meth:`TokenizedTask.subset` cuts)."""
    checked = check_task(task)
    if isinstance(checked, str):
        if templates is not None and len(templates) == 0:
            templates = None
        return load_kit(checked, model, n_pairs or N_PAIRS, seed, metric or "logit_diff", templates)
    if templates:
        raise HeadscopeError(
            f"templates (--templates) choose a kit's templates; task '{checked.name}' is not a kit."
        )
    if metric is None or metric == checked.metric:
        return checked
    return Task(
        checked.name, checked.pairs, check_metric(metric), checked.prepend_bos, checked.provenance
    )


def tokenize_task(
    task,
    model,
    metric: str | None = None,
    n_pairs: int | None = None,
    seed: int = 0,
    templates: list[int] | tuple[int, ...] | None = None,
    draw: int | None = None,
) -> TokenizedTask:
    """What a user passed (a :class:`TokenizedTask`, a :class:`Task`, a kit name or a file) as
    token ids for ``model``, its provenance kept, cut to the first ``n_pairs`` pairs. A kit
    draws ``draw`` pairs (default ``n_pairs``, else the kit's default); ``metric`` overrides the
    task's."""
    if isinstance(task, TokenizedTask):
        tt = task.with_metric(metric)
    else:
        templates = list(templates) if templates is not None else None
        t = resolve_task(task, model, metric, draw or n_pairs, seed, templates)
        tt = t.tokenize(model)
    return tt.subset(n_pairs)


# ------------------------------------------------------------------------------ filling templates


def single_token_words(model, words) -> list[str]:
    """The words that are one token with a leading space for ``model``'s tokenizer (order kept)."""
    return [w for w in dict.fromkeys(words) if len(model.encode(" " + w)) == 1]


def fill(template: str, values: dict[str, str]) -> tuple[str, list[tuple[str, int]]]:
    """``template`` with each ``[SLOT]`` replaced by ``values[SLOT]``; also each slot occurrence
    and the character where its word starts, in order."""
    text, spans, last = "", [], 0
    for m in re.finditer(r"\[([A-Z]+)\]", template):
        text += template[last : m.start()]
        spans.append((m.group(1), len(text)))
        text += values[m.group(1)]
        last = m.end()
    return text + template[last:], spans


def _need(words: list[str], k: int, what: str, kit: str, model) -> list[str]:
    if len(words) < k:
        raise HeadscopeError(
            f"Kit '{kit}': only {len(words)} {what} are single tokens for {model.name}'s "
            "tokenizer, "
            f"{k} needed; this kit cannot be built for it."
        )
    return words


#: per kit: (word list key, how many distinct words a pair needs)
_SLOTS = {
    "ioi": [("names", 5), ("places", 1), ("objects", 1)],
    "capital": [],
    "pronoun": [("male", 1), ("female", 1)],
    "copy_name": [("first", 1), ("last", 2)],
}


def _usable_words(kit: str, data: dict, model) -> dict[str, list[str]]:
    """The kit's word lists, each filtered to single tokens for ``model``."""
    words = {
        key: _need(single_token_words(model, data[key]), k, key, kit, model)
        for key, k in _SLOTS[kit]
    }
    if kit == "capital":
        caps = data["capitals"]
        single = set(single_token_words(model, caps.values()))
        words["countries"] = _need(
            [c for c in single_token_words(model, caps) if caps[c] in single],
            2,
            "country/capital pairs",
            kit,
            model,
        )
    return words


def _order_of(name: str, data: dict, chosen: list[int], i: int) -> list[int]:
    """The templates pair ``i`` may use: IOI alternates BABA (even pairs) and ABBA (odd pairs)
    where the chosen templates have both; other kits any chosen template."""
    if name != "ioi":
        return chosen
    n_baba = len(data["templates"]["BABA"])
    same = [t for t in chosen if (t < n_baba) == (i % 2 == 0)]
    return same or chosen


def _templates(name: str, data: dict) -> list[str]:
    t = data["templates"]
    return t["BABA"] + t["ABBA"] if name == "ioi" else t


# ------------------------------------------------------------------------------ the kits


def _ioi(words, data, rng, i, template, t) -> Pair:
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


def _capital(words, data, rng, i, template, t) -> Pair:
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


def _pronoun(words, data, rng, i, template, t) -> Pair:
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


def _copy_name(words, data, rng, i, template, t) -> Pair:
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
