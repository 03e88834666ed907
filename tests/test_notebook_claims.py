"""The saved report notebooks: executed in full, without errors, and saying only what their outputs
show.

Reads the committed ``analyses/*.ipynb`` as JSON (no kernel, no model): the outputs are those of
the full run the prose was written from. The checker itself (``tests/notebook_claims.py``) is tested
on hand-built notebooks first, so that a test of the real notebooks passing means something.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.notebook_claims import (
    cited,
    outputs_text,
    sentences,
    unsupported_claims,
)

ANALYSES = Path(__file__).resolve().parent.parent / "analyses"
NOTEBOOKS = sorted(ANALYSES.glob("*.ipynb"))


def _nb(markdown: str, printed: str) -> dict:
    return {
        "cells": [
            {
                "cell_type": "code",
                "source": "print(...)",
                "execution_count": 1,
                "outputs": [{"output_type": "stream", "name": "stdout", "text": printed}],
            },
            {"cell_type": "markdown", "source": markdown},
        ]
    }


def _two_cells(markdown: str) -> dict:
    """Cell [1] prints the induction score, cell [2] a loss; the markdown follows cell [2]."""
    return {
        "cells": [
            {
                "cell_type": "code",
                "source": "print(score)",
                "execution_count": 1,
                "outputs": [
                    {"output_type": "stream", "name": "stdout", "text": "L18H6 induction 0.872\n"}
                ],
            },
            {
                "cell_type": "code",
                "source": "print(loss)",
                "execution_count": 2,
                "outputs": [
                    {"output_type": "stream", "name": "stdout", "text": "L16H0 loss change 5.958\n"}
                ],
            },
            {"cell_type": "markdown", "source": markdown},
        ]
    }


def _old_check(nb: dict) -> list[str]:
    """The check before issue 24: a decimal anywhere in any output was enough."""
    from decimal import Decimal

    from tests.notebook_claims import DECIMAL, NUMBER

    values = [
        Decimal(v.replace(",", "")) for v in NUMBER.findall(outputs_text(nb)) if v not in ("", ".")
    ]
    text = nb["cells"][-1]["source"]
    return [
        m.group()
        for m in DECIMAL.finditer(text)
        if not any(
            v.quantize(Decimal(1).scaleb(-len(m.group().split(".")[1]))) == Decimal(m.group())
            for v in values
        )
    ]


def test_a_planted_number_from_another_cell_fails_the_new_check_and_passed_the_old():
    """The planted claim: L16H0's loss change printed as L18H6's score. Both numbers are in the
    notebook, so the old check passed it; the sentence cites nothing and the cell above it printed
    neither 0.872's head nor 5.958 as a score of L18H6, so the new one fails it."""
    planted = _two_cells("Ablating L16H0 raises the loss by 5.958 nats, and L18H6 scores 5.958.")
    assert _old_check(planted) == []  # the old check: every decimal appears somewhere
    assert unsupported_claims(planted) == [
        "cell 2: L18H6 does not appear in the cell above (In [2])"
    ]
    wrong_cell = _two_cells("L18H6 scores 0.872 [out 2].")
    assert _old_check(wrong_cell) == []
    assert unsupported_claims(wrong_cell) == [
        "cell 2: L18H6 does not appear in [out 2]",
        "cell 2: 0.872 matches no number in [out 2]",
    ]


def test_a_sentence_is_checked_against_the_cells_it_cites_only():
    ok = _two_cells("L18H6 scores 0.872 [out 1]. Ablating L16H0 costs 5.958 nats.")
    assert unsupported_claims(ok) == []
    both = _two_cells("L18H6 scores 0.872 and ablating L16H0 costs 5.958 nats [out 1, 2].")
    assert unsupported_claims(both) == []
    # the citation of the first sentence does not carry over to the second
    leak = _two_cells("Ablating L16H0 costs 5.958 nats [out 2]. So L18H6 scores 0.872.")
    assert unsupported_claims(leak) == [
        "cell 2: L18H6 does not appear in the cell above (In [2])",
        "cell 2: 0.872 matches no number in the cell above (In [2])",
    ]


def test_a_citation_of_a_missing_cell_is_a_problem():
    assert unsupported_claims(_two_cells("It scores 0.872 [out 7].")) == [
        "cell 2: cites [out 7], which no executed cell has",
        "cell 2: 0.872 matches no number in [out 7]",
    ]


def test_sentences_and_citations():
    assert sentences(
        "Olsson et al. (2022) saw 0.5. Then 0.6 [out 3].\n\n| a | 0.1 |\n- item 0.2"
    ) == ["Olsson et al. (2022) saw 0.5.", "Then 0.6 [out 3].", "| a | 0.1 |", "- item 0.2"]
    assert cited("no citation here") is None
    assert cited("0.5 [out 4] and [out 6-8, 10]") == [4, 6, 7, 8, 10]


def test_a_number_no_output_shows_is_reported():
    problems = unsupported_claims(_nb("Layer 0 puts 0.096 on [SEP].", "layer 0: 0.0731\n"))
    assert problems == ["cell 1: 0.096 matches no number in the cell above (In [1])"]


def test_a_number_is_matched_at_the_decimals_the_prose_gives():
    assert unsupported_claims(_nb("L18H6 scores 0.88 and 0.880.", "L18H6  0.87951\n")) == []
    assert unsupported_claims(_nb("It scores 0.87.", "0.87951\n")) == [
        "cell 1: 0.87 matches no number in the cell above (In [1])"
    ]


def test_signs_thousands_and_html_tables_count_as_outputs():
    nb = _nb(
        "A loss of −10.9 nats; 49,152.0 tokens; 0.25 in a table.", "loss -10.86 over 49,152.0\n"
    )
    nb["cells"][0]["outputs"].append(
        {"output_type": "execute_result", "data": {"text/html": "<td>0.250</td>"}}
    )
    assert unsupported_claims(nb) == []


def test_a_head_name_no_output_shows_is_reported():
    assert unsupported_claims(_nb("Top heads: L18H6 and L3H2.", "L18H6 0.880\n")) == [
        "cell 1: L3H2 does not appear in the cell above (In [1])"
    ]


def test_a_percentage_matches_a_printed_share_or_percentage():
    assert unsupported_claims(_nb("12.5% of heads", "share 0.125\n")) == []
    assert unsupported_claims(_nb("12.5% of heads", "12.5%\n")) == []
    assert unsupported_claims(_nb("13.5% of heads", "share 0.125\n")) == [
        "cell 1: 13.5 matches no number in the cell above (In [1])"
    ]


def test_latex_and_integers_are_not_claims():
    assert (
        unsupported_claims(
            _nb("With $\\sqrt{d_k} = 11.3$ and 64 sequences of 128 tokens.", "nothing\n")
        )
        == []
    )


def test_the_source_of_a_code_cell_is_not_an_output():
    nb = _nb("The threshold 0.35.", "done\n")
    nb["cells"][0]["source"] = "THRESHOLD = 0.35"
    assert unsupported_claims(nb) == ["cell 1: 0.35 matches no number in the cell above (In [1])"]


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks in {ANALYSES}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_saved_notebook_is_a_full_run_without_errors(path: Path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c.get("outputs") is not None for c in code)
    unexecuted = [
        i
        for i, c in enumerate(nb["cells"])
        if c["cell_type"] == "code" and c.get("execution_count") is None
    ]
    assert not unexecuted, f"{path.name}: code cells {unexecuted} were not executed"
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{path.name}: not executed top to bottom in one kernel: {counts}"
    )
    errors = [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, f"{path.name}: saved with an error output: {errors[0].get('ename')}"
    shown = outputs_text(nb)
    assert "full run" in shown or "FAST=False" in shown, (
        f"{path.name}: outputs do not say they are a full run"
    )
    assert "fast mode" not in shown and "FAST=True" not in shown, (
        f"{path.name}: saved from a fast-mode run"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_saved_notebook_prose_quotes_only_its_outputs(path: Path):
    nb = json.loads(path.read_text())
    problems = unsupported_claims(nb)
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_a_model_name_is_not_a_claim_but_a_version_alone_is():
    assert unsupported_claims(_nb("Llama 3.1 8B's cache.", "nothing\n")) == []
    assert unsupported_claims(_nb("Llama 3.1 has 8.5 of them.", "nothing\n")) == [
        "cell 1: 3.1 matches no number in the cell above (In [1])",
        "cell 1: 8.5 matches no number in the cell above (In [1])",
    ]
