"""What a report notebook's prose may claim: every number it quotes is one its *cited* outputs show.

Checked on the notebooks as saved (executed in full, outputs kept), by reading their JSON. The
prose is cut into sentences (a table row, a list item and a heading each count as one); each
sentence is checked against the outputs of the cells it cites, and only those:

* a sentence cites cells by their execution count, as Jupyter shows it (``In [12]``): ``[out 12]``,
  ``[out 12, 14]`` or ``[out 12-14]``, anywhere in the sentence;
* a sentence that cites nothing is checked against the code cell right above its markdown cell
  (the nearest earlier code cell);
* every decimal number (``0.872``, ``-10.9``, ``3.2``) must match a number those outputs print,
  rounded to the decimals the prose gives; a percentage with decimals (``12.5%``) may match a share
  (``0.125``) or a percentage;
* every head name (``L18H6``) must appear in those outputs;
* a citation of a cell that does not exist, or that printed nothing, is itself a problem.

Integers are not checked (layer counts, sequence counts, years and the like are too many to tell
apart from claims), nor is a model's name ("Llama 3.1 8B"). A number that comes from elsewhere (a
paper, the corpus) goes in a code cell that prints it, so the prose can cite it. LaTeX (``$...$``)
is not a claim.
"""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from pathlib import Path

DECIMAL = re.compile(
    r"(?<![\w.])[-−]?\d[\d,]*\.\d+(?![\d.]*\w)"
)  # 0.872, -10.9, 49,152.5; not v1.2.3
PERCENT = re.compile(r"(?<![\w.])(\d+\.\d+)%")
HEAD = re.compile(r"\bL\d+H\d+\b")
NUMBER = re.compile(r"[-−]?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?")
#: A model's name with its version and size ("Llama 3.1 8B") is no claim.
MODEL_NAME = re.compile(r"\b[A-Z][A-Za-z]*[ -]\d+(?:\.\d+)+[ -]\d+(?:\.\d+)?[BMK]\b")
CITE = re.compile(r"\[out\s+(\d+(?:\s*[-–]\s*\d+)?(?:\s*,\s*\d+(?:\s*[-–]\s*\d+)?)*)\]")
#: Abbreviations whose full stop does not end a sentence.
_ABBREV = re.compile(r"(?:\bet al|\be\.g|\bi\.e|\bvs|\bcf|\bFig|\bSec|\bEq|\bapprox|\bca)\.$")
_END = re.compile(r"(?<=[.!?])[)*_\"']*\s+(?=[A-Z*_(\[`\"'0-9−-])")


def _text(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def cell_output(cell: dict) -> str:
    """Every text one executed code cell showed: streams, plain-text, HTML and markdown results."""
    parts = []
    for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
        if out.get("output_type") == "stream":
            parts.append(_text({"source": out.get("text", "")}))
        for key in ("text/plain", "text/html", "text/markdown"):
            if key in out.get("data", {}):
                parts.append(_text({"source": out["data"][key]}))
    return "\n".join(parts)


def outputs_text(nb: dict) -> str:
    """Every text any executed code cell of the notebook showed."""
    return "\n".join(cell_output(c) for c in nb["cells"])


def sentences(markdown: str) -> list[str]:
    """The markdown cut into sentences: a table row, a list item or a heading is one unit; a
    paragraph is cut after ``.``, ``!`` or ``?`` followed by a space and a capital, a digit or
    markup (not after "et al.", "e.g.", "vs." and the like)."""
    units, para = [], []

    def flush():
        if para:
            units.extend(_split(" ".join(para)))
            para.clear()

    for line in markdown.splitlines():
        s = line.strip()
        if not s:
            flush()
        elif s.startswith(("|", "#")) or re.match(r"^([-*+]|\d+\.)\s", s):
            flush()
            if s.startswith("|"):
                units.append(s)
            else:
                para.append(s)
        else:
            para.append(s)
    flush()
    return [u for u in units if u.strip()]


def _split(paragraph: str) -> list[str]:
    out, start = [], 0
    for m in _END.finditer(paragraph):
        if _ABBREV.search(paragraph[start : m.start()]):
            continue
        out.append(paragraph[start : m.start()])
        start = m.end()
    out.append(paragraph[start:])
    return out


def cited(sentence: str) -> list[int] | None:
    """The execution counts a sentence cites (None: it cites nothing).

    >>> cited("0.87 [out 4] and 0.12 [out 6-8, 10]")
    [4, 6, 7, 8, 10]
    """
    found = []
    for m in CITE.finditer(sentence):
        for part in m.group(1).split(","):
            ends = [int(x) for x in re.split(r"[-–]", part)]
            found.extend(range(ends[0], ends[-1] + 1))
    return found or None


def _value(s: str) -> Decimal | None:
    try:
        return Decimal(s.replace(",", "").replace("−", "-"))
    except ArithmeticError:
        return None


def _rounds_to(x: Decimal, claim: Decimal, places: int) -> bool:
    q = Decimal(1).scaleb(-places)
    return (
        any(x.quantize(q, rounding=r) == claim for r in (ROUND_HALF_UP, ROUND_HALF_EVEN))
        or x == claim
    )


def _numbers(text: str) -> list[Decimal]:
    return [v for v in (_value(m) for m in NUMBER.findall(text)) if v is not None and v.is_finite()]


def unsupported_claims(nb: dict) -> list[str]:
    """Each number and head name of the prose that the outputs its sentence cites (or the code cell
    above) do not show, and each citation of a cell that does not exist (empty: all supported)."""
    by_count = {
        c.get("execution_count"): cell_output(c)
        for c in nb["cells"]
        if c.get("cell_type") == "code" and c.get("execution_count") is not None
    }
    problems = []
    above: str | None = None  # the output of the nearest code cell so far
    above_name = "no code cell above"
    for i, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") == "code":
            above = cell_output(cell)
            above_name = f"the cell above (In [{cell.get('execution_count')}])"
            continue
        if cell.get("cell_type") != "markdown":
            continue
        for sentence in sentences(
            re.sub(r"\$[^$]*\$", "", _text(cell))
        ):  # LaTeX formulas are not claims
            refs = cited(sentence)
            if refs is not None:
                missing = [r for r in refs if r not in by_count]
                for r in missing:
                    problems.append(f"cell {i}: cites [out {r}], which no executed cell has")
                shown = "\n".join(by_count[r] for r in refs if r in by_count)
                where = "[out " + ", ".join(str(r) for r in refs) + "]"
            else:
                shown, where = above or "", above_name
            claims = MODEL_NAME.sub("", CITE.sub("", sentence))
            values = _numbers(shown)
            heads = set(HEAD.findall(shown))
            for name in sorted(set(HEAD.findall(claims)) - heads):
                problems.append(f"cell {i}: {name} does not appear in {where}")
            for m in DECIMAL.finditer(claims):
                claim = _value(m.group())
                places = len(m.group().split(".")[1])
                if claim is None or any(_rounds_to(abs(v), abs(claim), places) for v in values):
                    continue
                pct = PERCENT.match(claims, m.start())
                if pct and any(_rounds_to(abs(v) * 100, abs(claim), places) for v in values):
                    continue
                problems.append(f"cell {i}: {m.group()} matches no number in {where}")
    return problems


def check(path: str | Path) -> list[str]:
    nb = json.loads(Path(path).read_text())
    return unsupported_claims(nb)


if __name__ == "__main__":
    import sys

    bad = 0
    for p in sys.argv[1:]:
        for line in check(p):
            print(f"{p}: {line}")
            bad += 1
    sys.exit(1 if bad else 0)
