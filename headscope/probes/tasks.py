"""A patching task: prompt pairs (clean, corrupt), an answer and a wrong token, the metric
(docs/patching.md).

A :class:`Task` holds text; :meth:`Task.tokenize` turns it into a :class:`TokenizedTask` for one
model's tokenizer and refuses, in one line each, what patching cannot use:

* a pair whose clean and corrupt prompts tokenize to different lengths (a patch at position p must
  mean the same position in both; the message names the pair and both lengths);
* an answer or wrong completion that is not exactly one token (the message shows the tokenization;
  write completions with their leading space, ``" Mary"``);
* an answer equal to the wrong token.

Prompts get the model's BOS token in front (``prepend_bos``, the default, as every headscope probe
does for decoders); the metric is read at the prompt's last token, which predicts the answer.

Named positions are token indices (counted with the BOS at 0), one set per pair, the same in the
clean and the corrupt prompt; ``END`` (the last token) is always there. In a file or in
``from_pairs`` a position is an ``int`` (a token index, negative counts from the end) or
``{"char": n}`` (the token that covers character ``n`` of the clean prompt).

Files: JSONL, one object a line ``{"clean", "corrupt", "answer", "wrong"[, "positions"]}``; or TSV
with a header row holding at least ``clean corrupt answer wrong`` (extra columns ``pos:NAME`` give
token indices). Fields are taken as written: a TSV answer keeps its leading space.

>>> task = Task.from_pairs([("When Mary and John went out, John gave it to",
...                          "When Anna and Bob went out, Tom gave it to", " Mary", " John")],
...                        name="mine")
>>> task.name, len(task), task.metric
('mine', 1, 'logit_diff')
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from headscope.errors import HeadscopeError, did_you_mean

METRICS = ("logit_diff", "prob", "loss")
END = "END"


def check_metric(metric: str) -> str:
    """``metric`` if it is known, else one line naming the known ones."""
    if metric not in METRICS:
        raise HeadscopeError(
            f"Unknown metric '{metric}'.{did_you_mean(metric, METRICS)} "
            f"Use one of {', '.join(METRICS)}."
        )
    return metric


@dataclass(frozen=True)
class Pair:
    """One prompt pair as text: the answer is what the clean prompt should be completed with."""

    clean: str
    corrupt: str
    answer: str
    wrong: str
    positions: Mapping[str, int | Mapping[str, int]] = field(default_factory=dict)
    info: Mapping[str, str] = field(
        default_factory=dict
    )  # e.g. the IOI names and template, for reading results


@dataclass(frozen=True)
class Task:
    """Prompt pairs and how they are scored; tokenized for a model by :meth:`tokenize`."""

    name: str
    pairs: tuple[Pair, ...]
    metric: str = "logit_diff"
    prepend_bos: bool = True
    #: where the pairs came from (a file path, a kit's data files and seed), for metadata.json
    provenance: Mapping = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.pairs)

    @classmethod
    def from_pairs(
        cls,
        pairs: Iterable,
        name: str = "custom",
        metric: str = "logit_diff",
        prepend_bos: bool = True,
        provenance: Mapping | None = None,
    ) -> Task:
        """A task built in code: ``pairs`` of :class:`Pair`, dicts with the file's keys, or tuples
        ``(clean, corrupt, answer, wrong[, positions])``."""
        out = []
        for i, p in enumerate(pairs):
            if isinstance(p, Pair):
                out.append(p)
            elif isinstance(p, Mapping):
                out.append(_pair_from_dict(p, f"pair {i}"))
            elif (
                isinstance(p, Sequence)
                and len(p) in (4, 5)
                and all(isinstance(s, str) for s in p[:4])
            ):
                out.append(Pair(*p[:4], positions=dict(p[4]) if len(p) == 5 else {}))
            else:
                raise HeadscopeError(
                    f"Pair {i} of task '{name}' is {type(p).__name__}; give a Pair, a dict with "
                    "clean/corrupt/answer/wrong, or a tuple (clean, corrupt, answer, wrong)."
                )
        if not out:
            raise HeadscopeError(
                f"Task '{name}' has no pairs; give at least one (clean, corrupt, answer, wrong)."
            )
        return cls(
            name,
            tuple(out),
            check_metric(metric),
            prepend_bos,
            dict(provenance or {"source": "in code"}),
        )

    @classmethod
    def from_file(
        cls, path: str | Path, metric: str = "logit_diff", prepend_bos: bool = True
    ) -> Task:
        """A task from a ``.jsonl`` or ``.tsv`` file (see the module docstring)."""
        path = Path(path)
        if not path.is_file():
            raise HeadscopeError(
                f"Task file '{path}' does not exist; give a .jsonl or .tsv file or a kit name."
            )
        if path.suffix == ".jsonl":
            pairs = []
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise HeadscopeError(
                        f"{path}, line {n}: not JSON ({exc.msg}); each line is one object "
                        '{"clean", "corrupt", "answer", "wrong"}.'
                    ) from None
                if not isinstance(row, dict):
                    raise HeadscopeError(
                        f"{path}, line {n}: a JSON {type(row).__name__}, not an object."
                    )
                pairs.append(_pair_from_dict(row, f"{path}, line {n}"))
        elif path.suffix == ".tsv":
            pairs = _tsv_pairs(path)
        else:
            raise HeadscopeError(
                f"Task file '{path}' is neither .jsonl nor .tsv; use one of those."
            )
        return cls.from_pairs(
            pairs,
            name=path.stem,
            metric=metric,
            prepend_bos=prepend_bos,
            provenance={"source": "file", "path": str(path.absolute())},
        )

    def tokenize(self, model) -> TokenizedTask:
        """Token ids of every pair for ``model`` (see the module docstring for what is refused)."""
        check_model(model)
        clean, corrupt, answer, wrong, positions = [], [], [], [], []
        for i, p in enumerate(self.pairs):
            c = ([model.bos_id] if self.prepend_bos else []) + model.encode(p.clean)
            k = ([model.bos_id] if self.prepend_bos else []) + model.encode(p.corrupt)
            if len(c) != len(k):
                raise HeadscopeError(
                    f"Pair {i} of task '{self.name}': clean and corrupt tokenize to different "
                    f"lengths ({len(c)} and {len(k)} tokens: {p.clean!r} / {p.corrupt!r}); "
                    "patching needs the same positions in both."
                )
            answer.append(_single_token(model, p.answer, "answer", i, self.name))
            wrong.append(_single_token(model, p.wrong, "wrong", i, self.name))
            if answer[-1] == wrong[-1]:
                raise HeadscopeError(
                    f"Pair {i} of task '{self.name}': answer and wrong are the same token "
                    f"({p.answer!r}, id {answer[-1]}); the metric compares two different tokens."
                )
            positions.append(_positions(model, p, len(c), self.prepend_bos, i, self.name))
            clean.append(c)
            corrupt.append(k)
        names = list(positions[0])
        for i, pos in enumerate(positions):
            if list(pos) != names:
                raise HeadscopeError(
                    f"Pair {i} of task '{self.name}' names positions {sorted(pos)}, pair 0 "
                    f"{sorted(names)}; every pair must name the same positions."
                )
        return TokenizedTask(
            self.name,
            clean,
            corrupt,
            answer,
            wrong,
            {n: [pos[n] for pos in positions] for n in names},
            self.metric,
            [dict(p.info) for p in self.pairs],
            dict(self.provenance),
        )


@dataclass
class TokenizedTask:
    """A task as token ids for one tokenizer: what the patching engines read.

    ``positions``: ``{name: [token index per pair]}``, ``END`` included. ``provenance``: where the
    pairs came from (a kit and its templates, a file and its sha256), as the run records it.
    """

    name: str
    clean: list[list[int]]
    corrupt: list[list[int]]
    answer: list[int]
    wrong: list[int]
    positions: dict[str, list[int]]
    metric: str = "logit_diff"
    info: list[dict] = field(default_factory=list)
    provenance: dict = field(default_factory=lambda: {"source": "tokenized in code"})

    def __post_init__(self) -> None:
        check_metric(self.metric)
        n = len(self.clean)
        if not n:
            raise HeadscopeError(f"Task '{self.name}' has no pairs.")
        if not len(self.corrupt) == len(self.answer) == len(self.wrong) == n:
            raise HeadscopeError(
                f"Task '{self.name}': {n} clean prompts but {len(self.corrupt)} corrupt, "
                f"{len(self.answer)} answers and {len(self.wrong)} wrong tokens."
            )
        for i, (c, k) in enumerate(zip(self.clean, self.corrupt, strict=True)):
            if len(c) != len(k):
                raise HeadscopeError(
                    f"Pair {i} of task '{self.name}': clean and corrupt have different lengths "
                    f"({len(c)} and {len(k)} tokens); patching needs the same positions in both."
                )
            if self.answer[i] == self.wrong[i]:
                raise HeadscopeError(
                    f"Pair {i} of task '{self.name}': answer and wrong are the same token "
                    f"(id {self.answer[i]}); the metric compares two different tokens."
                )
        self.positions = {k: [int(x) for x in v] for k, v in self.positions.items() if k != END}
        self.positions[END] = [len(c) - 1 for c in self.clean]
        for name, idx in self.positions.items():
            bad = [
                i
                for i, (p, c) in enumerate(zip(idx, self.clean, strict=True))
                if not 0 <= p < len(c)
            ]
            if len(idx) != n or bad:
                raise HeadscopeError(
                    f"Position '{name}' of task '{self.name}' is outside pair "
                    f"{bad[0] if bad else 0}; give one token index per pair, inside the prompt."
                )

    def __len__(self) -> int:
        return len(self.clean)

    @property
    def lengths(self) -> list[int]:
        return [len(c) for c in self.clean]

    def write_jsonl(self, path: str | Path) -> None:
        """``tokens.jsonl`` of a patching or circuit run: one line per pair (index, clean and
        corrupt ids, answer and wrong ids, named positions, and the pair's info when it has one)."""
        with Path(path).open("w") as f:
            for i in range(len(self)):
                rec = {
                    "index": i,
                    "clean": [int(t) for t in self.clean[i]],
                    "corrupt": [int(t) for t in self.corrupt[i]],
                    "answer": int(self.answer[i]),
                    "wrong": int(self.wrong[i]),
                    "positions": {k: int(v[i]) for k, v in self.positions.items()},
                }
                if self.info:
                    rec["info"] = self.info[i]
                f.write(json.dumps(rec) + "\n")

    @classmethod
    def read_jsonl(cls, path: str | Path, name: str, metric: str) -> TokenizedTask | None:
        """The task :meth:`write_jsonl` wrote (None for a file with no pairs)."""
        clean, corrupt, answer, wrong, positions, info = [], [], [], [], {}, []
        for line in Path(path).read_text().splitlines():
            rec = json.loads(line)
            clean.append(rec["clean"])
            corrupt.append(rec["corrupt"])
            answer.append(rec["answer"])
            wrong.append(rec["wrong"])
            info.append(rec.get("info", {}))
            for k, v in rec["positions"].items():
                positions.setdefault(k, []).append(v)
        if not clean:
            return None
        return cls(name, clean, corrupt, answer, wrong, positions, metric, info)

    def subset(self, n: int | None) -> TokenizedTask:
        """The first ``n`` pairs (all for None)."""
        if n is None or n >= len(self):
            return self
        return self.select(range(n))

    def select(self, index: Sequence[int]) -> TokenizedTask:
        """The pairs at ``index``, in that order (provenance kept)."""
        index = list(index)
        pick = lambda xs: [xs[i] for i in index]  # noqa: E731
        return TokenizedTask(
            self.name,
            pick(self.clean),
            pick(self.corrupt),
            pick(self.answer),
            pick(self.wrong),
            {k: pick(v) for k, v in self.positions.items()},
            self.metric,
            pick(self.info) if self.info else [],
            self.provenance,
        )

    def with_metric(self, metric: str | None) -> TokenizedTask:
        """The same pairs read with ``metric`` (None: as they are)."""
        return self if metric is None else replace(self, metric=metric)


def check_model(model) -> None:
    """One line for a model patching cannot read: an encoder, no LM head, attention off the seam."""
    if not model.causal:
        raise HeadscopeError(
            f"{model.name} is an encoder; patching reads the next-token logits at the last "
            "position, which needs a decoder with an LM head (e.g. smollm2-135m)."
        )
    if model.hf.get_output_embeddings() is None:
        raise HeadscopeError(
            f"{model.name} has no LM head (unembedding); load it as a *ForCausalLM / *LMHeadModel "
            "so the metric can read the answer's logit."
        )
    if not model.attention_interface:
        raise HeadscopeError(
            f"{model.name}: its attention does not go through transformers' attention interface, "
            "so heads cannot be patched; load it by name or folder."
        )


def _single_token(model, text: str, what: str, i: int, task: str) -> int:
    ids = model.encode(text)
    if len(ids) != 1:
        pieces = [model.decode_one(t) for t in ids]
        raise HeadscopeError(
            f"Pair {i} of task '{task}': the {what} {text!r} is {len(ids)} tokens for this "
            "tokenizer "
            f"({pieces}); it must be a single token (mind the leading space, e.g. ' Mary')."
        )
    return ids[0]


def _positions(model, pair: Pair, n: int, bos: bool, i: int, task: str) -> dict[str, int]:
    out = {}
    for name, where in pair.positions.items():
        if isinstance(where, Mapping) and set(where) == {"char"}:
            out[name] = char_to_token(model, pair.clean, int(where["char"])) + int(bos)
        elif isinstance(where, int) and not isinstance(where, bool) and -n <= where < n:
            out[name] = where % n
        else:
            raise HeadscopeError(
                f"Pair {i} of task '{task}': position '{name}' = {where!r}; give a token index "
                f'in -{n}..{n - 1} or {{"char": n}}, a character of the clean prompt.'
            )
    return out


def char_to_token(model, text: str, char: int) -> int:
    """The index (no BOS counted) of the token of ``model.encode(text)`` that covers character
    ``char``."""
    enc = model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    for t, (s, e) in enumerate(enc["offset_mapping"]):
        if s <= char < e:
            return t
    raise HeadscopeError(
        f"No token of {text!r} covers character {char}; give a character inside the prompt."
    )


def _pair_from_dict(row: Mapping, where: str) -> Pair:
    keys = ("clean", "corrupt", "answer", "wrong")
    missing = [k for k in keys if not isinstance(row.get(k), str)]
    if missing:
        raise HeadscopeError(
            f"{where}: no text for {', '.join(missing)}; each pair needs clean, corrupt, answer "
            "and wrong as strings."
        )
    return Pair(
        *(row[k] for k in keys),
        positions=dict(row.get("positions") or {}),
        info={k: str(v) for k, v in (row.get("info") or {}).items()},
    )


def _tsv_pairs(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows or not {"clean", "corrupt", "answer", "wrong"} <= set(rows[0]):
        raise HeadscopeError(
            f"{path}: the first row must be a header naming the columns clean, corrupt, answer, "
            "wrong (tab-separated)."
        )
    head = rows[0]
    out = []
    for n, r in enumerate(rows[1:], 2):
        if not any(r):
            continue
        if len(r) != len(head):
            raise HeadscopeError(f"{path}, line {n}: {len(r)} fields, the header has {len(head)}.")
        row = dict(zip(head, r, strict=True))
        pos = {}
        for col in head:
            if col.startswith("pos:"):
                try:
                    pos[col[4:]] = int(row[col])
                except ValueError:
                    raise HeadscopeError(
                        f"{path}, line {n}: {col} = {row[col]!r} is not a token index."
                    ) from None
        out.append({**row, "positions": pos})
    return out
