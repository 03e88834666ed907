"""The IOI class rules on hand-made evidence: each head passes exactly the rule built for it, the
first class in order wins, an unmeasured number (NaN) never passes, thresholds are the settings'."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headscope.circuits.classes import CLASSES, ClassRules, classify, heads_of
from headscope.errors import HeadscopeError

NAN = np.nan


def _evidence():
    rows = [  # layer, head, direct, end_to_io, copying, nm_q, induction, dup, si_v, prev, ind_k
        (9, 0, 0.30, 0.50, 0.90, NAN, NAN, NAN, NAN, NAN, NAN),  # name mover
        (9, 1, -0.20, 0.40, 0.00, NAN, NAN, NAN, NAN, NAN, NAN),  # negative name mover
        (9, 2, 0.30, 0.05, 0.90, NAN, NAN, NAN, NAN, NAN, NAN),  # no: END attends elsewhere
        (7, 0, 0.01, 0.00, 0.00, 0.20, NAN, NAN, NAN, NAN, NAN),  # S-inhibition
        (5, 0, 0.00, 0.00, 0.00, 0.01, 0.80, 0.10, 0.10, NAN, NAN),  # induction
        (5, 1, 0.00, 0.00, 0.00, 0.01, 0.10, 0.70, 0.06, NAN, NAN),  # duplicate token
        (5, 2, 0.00, 0.00, 0.00, 0.01, 0.90, 0.10, 0.01, NAN, NAN),  # no: no path to S-inh.
        (3, 0, 0.00, 0.00, 0.00, 0.00, 0.00, 0.00, 0.00, 0.60, 0.30),  # previous token
        (3, 1, 0.00, 0.00, 0.00, 0.00, 0.00, 0.00, 0.00, 0.60, NAN),  # no: not measured
        (8, 0, 0.30, 0.50, 0.90, 0.40, NAN, NAN, NAN, NAN, NAN),  # both: name mover first
    ]
    cols = [
        "layer",
        "head",
        "direct_effect",
        "end_to_io",
        "copying",
        "path_to_name_movers_q",
        "induction",
        "duplicate_token",
        "path_to_s_inhibition_v",
        "previous_token",
        "path_to_induction_k",
    ]
    return pd.DataFrame(rows, columns=cols)


def test_each_head_gets_the_class_its_rule_was_built_for():
    got = classify(_evidence(), ClassRules()).set_index("head_name")
    want = {
        "L9H0": "name_mover",
        "L9H1": "negative_name_mover",
        "L9H2": "",
        "L7H0": "s_inhibition",
        "L5H0": "induction",
        "L5H1": "duplicate_token",
        "L5H2": "",
        "L3H0": "previous_token",
        "L3H1": "",
        "L8H0": "name_mover",
    }
    assert got["class"].to_dict() == want
    assert got.loc["L9H0", "rule"] == "direct_effect >= 0.05, end_to_io >= 0.1, copying >= 0.5"
    assert got.loc["L9H2", "rule"] == ""
    assert list(got.columns[:4]) == ["layer", "head", "class", "rule"]
    assert set(want.values()) - {""} == set(CLASSES)


def test_thresholds_and_the_classes_asked_for_are_respected():
    ev = _evidence()
    strict = classify(ev, ClassRules(direct=0.25, path=0.25)).set_index("head_name")["class"]
    assert strict["L9H1"] == "" and strict["L7H0"] == "" and strict["L9H0"] == "name_mover"
    only = classify(ev, ClassRules(), only=("name_mover",))
    assert heads_of(only, "name_mover") == [(8, 0), (9, 0)]
    assert set(only["class"]) == {"", "name_mover"}


def test_a_negative_threshold_is_refused():
    with pytest.raises(HeadscopeError, match="direct must be a number >= 0"):
        classify(_evidence(), ClassRules(direct=-1))
