"""In-context learning task kits (docs/icl.md): input / output pairs, and the few-shot prompts
Todd et al. (2024, "Function vectors in large language models") build from them.

A kit is a JSON list of ``{"input", "output"}`` objects: the 14 bundled ones
(:data:`ICL_TASKS`, copied unchanged from Todd et al.'s repository;
``headscope/data/icl/SOURCES.json`` gives each file's commit, sha256 and licence) or a file of the
user's own. The prompt format is
theirs: a space in front of every input and output, ``Q:`` / ``A:`` prefixes, ``\\n`` after an
input and ``\\n\\n`` after an output, the query last and ending in ``A:``::

    Q: hot\\nA: cold\\n\\nQ: up\\nA: down\\n\\n ... Q: tall\\nA:

with the model's BOS token in front (as every headscope probe has it; Todd et al. prepend the
string ``<|endoftext|>`` for GPT-2, which is the same token). The split is theirs too
(scikit-learn's ``train_test_split`` twice with one seed, reproduced here without scikit-learn):
70% of the pairs train (the demonstrations), the rest split 30 / 70 into valid (the queries) and
test.

An answer is scored on its first token: the token that follows the prompt when the prompt and
``" " + output`` are tokenized together (Todd et al.'s ``get_answer_id``); the rest of a multi-token
answer is not scored. A pair is kept for a model when its input and output are not empty and that
first token is not whitespace alone (SmolLM2 writes ``" 1990"`` as ``" "`` then digits: a bare
space says nothing about the answer); the kept counts are reported per model.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from headscope.errors import HeadscopeError, did_you_mean

PREFIX_IN, PREFIX_OUT = "Q:", "A:"
SEP_IN, SEP_OUT = "\n", "\n\n"


@cache
def _sources() -> dict:
    folder = resources.files("headscope.data").joinpath("icl")
    return json.loads(folder.joinpath("SOURCES.json").read_text())


#: the bundled kits, by name (Todd et al.'s file names)
ICL_TASKS: tuple[str, ...] = tuple(sorted(_sources()["files"]))


@dataclass(frozen=True)
class IclTask:
    """A task's ``(input, output)`` pairs and where they came from."""

    name: str
    pairs: tuple[tuple[str, str], ...]
    provenance: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.pairs)


def icl_task(spec: str | Path) -> IclTask:
    """A bundled kit by name (:data:`ICL_TASKS`) or a JSON file of ``{"input", "output"}``
    objects; one line for anything else."""
    s = str(spec)
    if s in ICL_TASKS:
        info = _sources()
        text = resources.files("headscope.data").joinpath(f"icl/{s}.json").read_text()
        f = info["files"][s]
        prov = {
            "kit": s,
            "repository": info["repository"],
            "commit": info["commit"],
            "path": f["source_path"],
            "sha256": f["sha256"],
            "licence": info["licence"],
        }
        return IclTask(s, _pairs(json.loads(text), s), prov)
    path = Path(s)
    if not path.suffix == ".json" or not path.is_file():
        raise HeadscopeError(
            f"Unknown ICL task '{s}'.{did_you_mean(s, ICL_TASKS)} Use a bundled task "
            f'({", ".join(ICL_TASKS)}) or a JSON file of {{"input", "output"}} pairs.'
        )
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise HeadscopeError(f"{path} is not JSON: {exc}.") from None
    return IclTask(path.stem, _pairs(data, str(path)), {"file": str(path.resolve())})


def _pairs(data, where: str) -> tuple[tuple[str, str], ...]:
    ok = (
        isinstance(data, list)
        and data
        and all(
            isinstance(d, dict)
            and isinstance(d.get("input"), str)
            and isinstance(d.get("output"), str)
            for d in data
        )
    )
    if not ok:
        raise HeadscopeError(
            f'{where}: an ICL task is a JSON list of {{"input": str, "output": str}} objects '
            "(at least one)."
        )
    return tuple((d["input"], d["output"]) for d in data)


def split(n: int, seed: int = 42, test_size: float = 0.3) -> dict[str, np.ndarray]:
    """Todd et al.'s split of ``n`` pairs (``split_icl_dataset``): ``train_test_split(test_size,
    random_state=seed)`` gives train and the rest, the same again on the rest gives test and valid
    (scikit-learn's ShuffleSplit order: a seeded permutation, test first).

    >>> {k: len(v) for k, v in split(100).items()}
    {'train': 70, 'valid': 9, 'test': 21}
    """

    def tts(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n_test = math.ceil(test_size * len(idx))
        perm = np.random.RandomState(seed).permutation(len(idx))
        return idx[perm[n_test:]], idx[perm[:n_test]]  # (train, test)

    train, rest = tts(np.arange(n))
    test, valid = tts(rest)
    return {"train": train, "valid": valid, "test": test}


def prompt_text(demos: list[tuple[str, str]], query: str) -> str:
    """Todd et al.'s prompt: each demonstration ``Q: x\\nA: y\\n\\n``, then ``Q: query\\nA:``."""
    out = "".join(f"{PREFIX_IN} {x}{SEP_IN}{PREFIX_OUT} {y}{SEP_OUT}" for x, y in demos)
    return f"{out}{PREFIX_IN} {query}{SEP_IN}{PREFIX_OUT}"


def answer_token(model, prompt_ids: list[int], text: str, answer: str) -> int | None:
    """The first token of ``" " + answer`` after the prompt (``text``, tokenized as
    ``prompt_ids`` after any BOS), as the model's tokenizer writes the two together; None when
    that token is whitespace alone."""
    whole = model.encode(text + " " + answer)
    body = prompt_ids[1:] if prompt_ids[:1] == [model.bos_id] else prompt_ids
    tok = whole[len(body)] if whole[: len(body)] == body and len(whole) > len(body) else None
    if tok is None:  # the prompt's last token merged with the answer: the answer's own first token
        own = model.encode(" " + answer)
        tok = own[0] if own else None
    if tok is None or not model.tokenizer.decode([tok]).strip():
        return None
    return tok


@dataclass
class IclPrompts:
    """One task's prompts for one model: token ids (BOS first), each prompt's answer token,
    and which pairs made it (``query``: the query pair, ``demos``: the demonstrations, as
    written; their outputs shuffled among them where ``kind`` is ``shuffled``)."""

    task: str
    kind: str  # "clean" | "shuffled" | "zero_shot"
    ids: list[list[int]]
    answer: list[int]
    query: list[int]
    demos: list[list[int]]

    def __len__(self) -> int:
        return len(self.ids)


KINDS = ("clean", "shuffled", "zero_shot")


def usable(model, task: IclTask) -> np.ndarray:
    """The pairs a model can score (``bool [pairs]``): input and output not empty, the answer's
    first token (after ``A:``) not whitespace alone."""
    ok = np.zeros(len(task), dtype=bool)
    for i, (x, y) in enumerate(task.pairs):
        if x.strip() and y.strip():
            text = prompt_text([], x)
            ok[i] = answer_token(model, model.encode(text), text, y) is not None
    return ok


def build_prompts(
    model,
    task: IclTask,
    n: int,
    kind: str = "clean",
    shots: int = 10,
    seed: int = 0,
    queries: np.ndarray | None = None,
    keep: np.ndarray | None = None,
    in_order: bool = False,
) -> IclPrompts:
    """``n`` prompts of ``task`` for ``model``: for each, ``shots`` demonstrations drawn without
    replacement from the train split and one query drawn from ``queries`` (default: the valid
    split; ``in_order``: the first ``n`` queries, one prompt each), with a numpy generator seeded
    ``seed``; ``kind``: ``clean``, ``shuffled`` (the demonstrations' outputs permuted among them,
    as Todd et al.'s corrupted prompts) or ``zero_shot`` (the query alone). Only pairs in
    ``keep`` (default: :func:`usable`) are used."""
    if kind not in KINDS:
        raise HeadscopeError(f"Unknown prompt kind '{kind}'; use {', '.join(KINDS)}.")
    keep = usable(model, task) if keep is None else keep
    if not keep.any():
        raise HeadscopeError(
            f"Task {task.name}: no pair has an answer {model.name}'s tokenizer can score on its "
            "first token (each is empty, or its first token is whitespace alone)."
        )
    parts = split(len(task))
    train = parts["train"][keep[parts["train"]]]
    pool = parts["valid"] if queries is None else np.asarray(queries)
    pool = pool[keep[pool]]
    if len(train) < shots or not len(pool):
        raise HeadscopeError(
            f"Task {task.name} keeps {len(train)} training pairs and {len(pool)} queries for "
            f"{model.name}; {shots} shots need at least {shots} and 1."
        )
    rng = np.random.default_rng(seed)
    out = IclPrompts(task.name, kind, [], [], [], [])
    if in_order:
        n = min(n, len(pool))
    for t in range(n):
        demos = rng.choice(train, shots, replace=False) if kind != "zero_shot" else train[:0]
        q = int(pool[t]) if in_order else int(rng.choice(pool))
        outputs = [task.pairs[d][1] for d in demos]
        if kind == "shuffled":
            outputs = [outputs[p] for p in rng.permutation(len(outputs))]
        text = prompt_text(
            [(task.pairs[d][0], y) for d, y in zip(demos, outputs, strict=True)], task.pairs[q][0]
        )
        ids = [model.bos_id, *model.encode(text)]
        tok = answer_token(model, ids, text, task.pairs[q][1])
        if tok is None:  # usable() checked the pair alone; in context it still must hold
            raise HeadscopeError(
                f"Task {task.name}: the answer {task.pairs[q][1]!r} has no first token to score "
                f"after this prompt for {model.name}."
            )
        out.ids.append(ids)
        out.answer.append(tok)
        out.query.append(q)
        out.demos.append([int(d) for d in demos])
    return out
