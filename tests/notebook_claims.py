"""What a report notebook's prose may claim: every number it quotes is one its outputs show.

Checked on the notebooks as saved (executed in full, outputs kept), by reading their JSON:

* every decimal number in a markdown cell (``0.872``, ``-10.9``, ``3.2``) must match a number
  printed by some code cell of the same notebook, rounded to the decimals the prose gives;
* every head name in a markdown cell (``L18H6``) must appear in some output;
* a percentage with decimals (``12.5%``) must match an output share (``0.125``) or percentage.

Integers are not checked (layer counts, sequence counts, years and the like are too many to tell
apart from claims). A number that comes from elsewhere (a paper, the corpus) goes in a code cell
that prints it, so the prose can quote it.
"""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from pathlib import Path

DECIMAL = re.compile(r"(?<![\w.])[-−]?\d[\d,]*\.\d+(?![\d.]*\w)")  # 0.872, -10.9, 49,152.5; not v1.2.3
PERCENT = re.compile(r"(?<![\w.])(\d+\.\d+)%")
HEAD = re.compile(r"\bL\d+H\d+\b")
NUMBER = re.compile(r"[-−]?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?")


def _text(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def outputs_text(nb: dict) -> str:
    """Every text an executed code cell showed: streams, plain-text and HTML results."""
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if out.get("output_type") == "stream":
                parts.append(_text({"source": out.get("text", "")}))
            for key in ("text/plain", "text/html", "text/markdown"):
                if key in out.get("data", {}):
                    parts.append(_text({"source": out["data"][key]}))
    return "\n".join(parts)


def _value(s: str) -> Decimal | None:
    try:
        return Decimal(s.replace(",", "").replace("−", "-"))
    except ArithmeticError:
        return None


def _rounds_to(x: Decimal, claim: Decimal, places: int) -> bool:
    q = Decimal(1).scaleb(-places)
    return any(x.quantize(q, rounding=r) == claim for r in (ROUND_HALF_UP, ROUND_HALF_EVEN)) or x == claim


def unsupported_claims(nb: dict) -> list[str]:
    """The numbers and head names of the markdown cells that no output shows (empty: all supported)."""
    shown = outputs_text(nb)
    values = [v for v in (_value(m) for m in NUMBER.findall(shown)) if v is not None and v.is_finite()]
    heads = set(HEAD.findall(shown))
    problems = []
    for i, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "markdown":
            continue
        text = re.sub(r"\$[^$]*\$", "", _text(cell))  # LaTeX formulas are not claims
        for name in sorted(set(HEAD.findall(text)) - heads):
            problems.append(f"cell {i}: {name} appears in no output")
        for m in DECIMAL.finditer(text):
            claim = _value(m.group())
            places = len(m.group().split(".")[1])
            if claim is None or any(_rounds_to(abs(v), abs(claim), places) for v in values):
                continue
            pct = PERCENT.match(text, m.start())
            if pct and any(_rounds_to(abs(v) * 100, abs(claim), places) for v in values):
                continue
            problems.append(f"cell {i}: {m.group()} matches no number in any output")
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
