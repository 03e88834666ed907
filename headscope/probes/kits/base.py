"""What every task kit shares: the kit type and its registry, drawing a kit's pairs, filling its
templates for one tokenizer, and reading a task a user names.

Every word a slot takes is kept only if it is a single token *with its leading space* for that
tokenizer (slots never start a prompt), so a clean prompt and its corrupt twin always tokenize to
the same length, and every pair of one template has the same length too (``positions="each"``
needs that: pass ``templates=[i]``). Pairs are drawn with ``random.Random(seed)``: a template,
then the words.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from headscope.errors import HeadscopeError, did_you_mean
from headscope.probes.tasks import Task, TokenizedTask, check_metric

DATA = Path(__file__).resolve().parents[2] / "data" / "tasks"
N_PAIRS = 64


@dataclass(frozen=True)
class Kit:
    """One task kit: its data file ``headscope/data/tasks/<name>.json`` and how a pair is built.

    ``build(words, data, rng, i, template, t) -> Pair`` makes pair ``i`` from template ``t``
    (``words``: the data's word lists filtered to single tokens); ``slots``: ``(word list key,
    distinct words one pair needs)``; ``summary``: clean prompt -> answer, the corruption, the
    named positions (the docs' table and the ``--task`` help read it). ``templates(data)``,
    ``order(data, chosen, i)`` (the templates pair ``i`` may use) and ``words(data, model)`` (word
    lists beyond ``slots``) default to a plain list of templates, any of them, none."""

    name: str
    build: Callable
    slots: tuple[tuple[str, int], ...]
    summary: tuple[str, str, str]  # clean prompt -> answer; corrupt prompt, wrong; positions
    templates: Callable[[dict], list[str]] = lambda data: data["templates"]
    order: Callable[[dict, list[int], int], list[int]] = lambda data, chosen, i: chosen
    words: Callable | None = None


#: The kits by name, in the order they are listed (:func:`register`; the built-ins are
#: registered in :mod:`headscope.probes.kits`, one line each).
KITS: dict[str, Kit] = {}


def register(kit: Kit) -> Kit:
    """Add ``kit`` to :data:`KITS`; a name already taken is refused."""
    if kit.name in KITS:
        raise HeadscopeError(f"Task kit '{kit.name}' is already registered.")
    KITS[kit.name] = kit
    return kit


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
    all_templates = KITS[name].templates(data)
    chosen = list(range(len(all_templates))) if templates is None else list(templates)
    if not chosen or any(not 0 <= t < len(all_templates) for t in chosen):
        raise HeadscopeError(
            f"Kit '{name}' has templates 0..{len(all_templates) - 1}; got {templates}."
        )
    rng = random.Random(seed)
    kit = KITS[name]
    words = _usable_words(kit, data, model)
    pairs = []
    for i in range(n_pairs):
        t = rng.choice(kit.order(data, chosen, i))
        pairs.append(kit.build(words, data, rng, i, all_templates[t], t))
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
    ``.tsv`` file, read now) or a kit name; anything else gets one line (the nearest kit named)."""
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


def held_out_task(
    task,
    model,
    ranked: TokenizedTask,
    n: int,
    metric: str | None = None,
    seed: int = 0,
    templates: list[int] | tuple[int, ...] | None = None,
) -> TokenizedTask:
    """``n`` pairs of ``task`` none of whose clean prompts is among ``ranked``'s, for measuring
    on data that did not choose what is measured. A kit draws them with seed ``seed + 1``
    (twice as many as needed, the first ``n`` new ones kept); a file or a tokenized task gives the
    ``n`` pairs after ``ranked``'s. One line when there are not ``n`` such pairs."""
    seen = {tuple(c) for c in ranked.clean}
    if isinstance(task, TokenizedTask) or not isinstance(check_task(task), str):
        pool = tokenize_task(task, model, metric)
        start, where = len(ranked), "after the ranking's"
    else:
        pool = tokenize_task(task, model, metric, None, seed + 1, templates, draw=2 * n + len(seen))
        start, where = 0, f"drawn with seed {seed + 1}"
    fresh = [i for i in range(start, len(pool)) if tuple(pool.clean[i]) not in seen][:n]
    if len(fresh) < n:
        raise HeadscopeError(
            f"Task '{ranked.name}' has {len(fresh)} pairs {where} that the ranking did not use, "
            f"{n} asked (--held-out); ask for at most {len(fresh)}, or give a file with more pairs."
        )
    return pool.select(fresh)


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


def need(words: list[str], k: int, what: str, kit: str, model) -> list[str]:
    """``words`` when there are at least ``k``, else one line: the kit cannot be built."""
    if len(words) < k:
        raise HeadscopeError(
            f"Kit '{kit}': only {len(words)} {what} are single tokens for {model.name}'s "
            f"tokenizer, {k} needed; this kit cannot be built for it."
        )
    return words


def _usable_words(kit: Kit, data: dict, model) -> dict[str, list[str]]:
    """The kit's word lists, each filtered to single tokens for ``model``."""
    words = {
        key: need(single_token_words(model, data[key]), k, key, kit.name, model)
        for key, k in kit.slots
    }
    if kit.words is not None:
        words.update(kit.words(data, model))
    return words
