"""``headscope.circuit`` on tiny models: the IOI classes found in turn from the saved numbers, the
run directory written whole and read back, the page drawn from the files alone."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from headscope.apps.circuit import circuit
from headscope.apps.circuit_run import load_circuit, save_circuit
from headscope.circuits.classes import ClassRules, classify
from headscope.probes.tasks import TokenizedTask
from tests.patch_helpers import random_task


def _ioi_like(model, n=6):
    """A random task with IOI's named positions (IO, S1, S2; END is added)."""
    tt = random_task(model, n_pairs=n, length=10, n_changed=3, seed=2)
    pos = {"IO": [2] * n, "S1": [3] * n, "S2": [6] * n}
    return TokenizedTask("ioi-like", tt.clean, tt.corrupt, tt.answer, tt.wrong, pos)


def _evidence(model, value=1.0):
    L, H = model.n_layers, model.n_heads
    return pd.DataFrame(
        {
            "layer": np.repeat(np.arange(L), H),
            "head": np.tile(np.arange(H), L),
            "induction": value,
            "duplicate_token": 0.0,
            "previous_token": value,
            "copying": value,
            "copy_suppression": 0.0,
        }
    )


@pytest.fixture(scope="module")
def ioi_run(tiny_gqa_llama):
    model = tiny_gqa_llama
    tt = _ioi_like(model)
    # loose rules, so that every class step runs on a random model
    rules = dict(direct=0.0, attention=0.0, copying=0.0, path=0.0, pattern=0.0)
    return (
        model,
        tt,
        circuit(model, tt, evidence=_evidence(model), bootstrap=100, n_null=4, top_k=3, **rules),
    )


def test_each_class_is_found_from_the_saved_numbers_of_the_one_before(ioi_run):
    model, tt, r = ioi_run
    path, classes = r.path, r.classes.set_index("head_name")
    exact = path[path["estimator"] == "exact"]
    receivers = set(exact["receiver"])
    assert "logits" in receivers and "name_mover.q@END" in receivers
    # the group's effect is the evidence column, for every sender below the group
    for group, col in (
        ("name_mover.q@END", "path_to_name_movers_q"),
        ("s_inhibition.v@S2", "path_to_s_inhibition_v"),
        ("induction.k@S1+1", "path_to_induction_k"),
    ):
        sub = exact[exact["receiver"] == group].set_index("sender")
        if sub.empty:
            assert classes[col].isna().all(), group
            continue
        np.testing.assert_allclose(classes.loc[sub.index, col], sub["effect"], rtol=1e-12)
    direct = exact[exact["receiver"] == "logits"].set_index("sender")
    np.testing.assert_allclose(classes.loc[direct.index, "direct_effect"], direct["effect"])
    again = classify(classes.reset_index(), ClassRules(0.0, 0.0, 0.0, 0.0, 0.0))
    assert list(again["class"]) == list(r.classes["class"])  # the classes follow from the table
    assert (classes["class"] != "").any()
    # attribution beside every exact path
    est = path[path["estimator"] == "attribution"]
    assert len(est) == len(exact)


def test_the_evidence_the_rules_read_carries_intervals_over_pairs(ioi_run):
    from headscope.circuits.evidence import attention_between
    from headscope.effects.patching import make_batches
    from headscope.uncertainty import bootstrap

    model, tt, r = ioi_run
    classes = r.classes.set_index("head_name")
    exact = r.path[r.path["estimator"] == "exact"]
    # each class-deciding path effect: the path table's interval of the same row
    for group, col in (
        ("name_mover.q@END", "path_to_name_movers_q"),
        ("s_inhibition.v@S2", "path_to_s_inhibition_v"),
        ("induction.k@S1+1", "path_to_induction_k"),
    ):
        sub = exact[exact["receiver"] == group].set_index("sender")
        if sub.empty:
            continue
        got = classes.loc[sub.index]
        np.testing.assert_allclose(got[f"{col}_ci_low"], sub["ci_low"], rtol=1e-12)
        np.testing.assert_allclose(got[f"{col}_ci_high"], sub["ci_high"], rtol=1e-12)
        assert (got[f"{col}_ci_low"] <= got[col] + 1e-12).all()
        assert (got[col] <= got[f"{col}_ci_high"] + 1e-12).all()
    # END -> IO: resampled by pair, with the run's bootstrap settings (100 draws, seed 0)
    tokens = r.tokens
    per_pair = attention_between(
        model, make_batches(tokens, 32, model.pad_id), len(tokens.clean), "END", "IO"
    )
    b = bootstrap(per_pair, torch.ones(per_pair.shape[0], dtype=torch.float64), resamples=100)
    layer, head = classes["layer"].to_numpy(), classes["head"].to_numpy()
    np.testing.assert_allclose(classes["end_to_io"], per_pair.mean(0).numpy()[layer, head])
    np.testing.assert_allclose(classes["end_to_io_ci_low"], b.ci_low.numpy()[layer, head])
    np.testing.assert_allclose(classes["end_to_io_ci_high"], b.ci_high.numpy()[layer, head])
    assert (classes["end_to_io_ci_high"] > classes["end_to_io_ci_low"]).any()  # not points


def test_agreement_ranks_composition_against_path_effects(ioi_run):
    _, _, r = ioi_run
    a = r.agreement.set_index("receiver")
    singles = r.path[(r.path["estimator"] == "exact") & (r.path["receiver_head"] >= 0)]
    assert set(a.index) == set(singles["receiver"])
    assert ((a["spearman"] >= -1) & (a["spearman"] <= 1)).all()
    assert (a["top_k"] <= a["n_senders"]).all()
    assert {"kind", "overlap_chance", "p_overlap"} <= set(a.columns)


def test_the_run_directory_round_trips_and_its_page_is_drawn(ioi_run, tmp_path):
    _, tt, r = ioi_run
    out = save_circuit(r, tmp_path / "run")
    names = {p.name for p in out.iterdir()}
    assert {
        "path.csv",
        "composition.csv",
        "agreement.csv",
        "classes.csv",
        "evidence.csv",
        "baseline.csv",
        "tokens.jsonl",
        "metadata.json",
        "report.html",
        "circuit.png",
    } <= names
    back = load_circuit(out)
    pd.testing.assert_frame_equal(
        back.path[["sender", "receiver", "estimator"]], r.path[["sender", "receiver", "estimator"]]
    )
    np.testing.assert_allclose(back.path["effect"], r.path["effect"], rtol=1e-6)
    assert back.tokens.clean == tt.clean and back.metadata["run_format"] == "headscope-circuit/1"
    page = (out / "report.html").read_text()
    assert "<svg" in page and "name_mover" in page
    assert (
        back.metadata["cost"]["full_forwards"]
        < back.metadata["cost"]["one_at_a_time_full_forwards"]
    )


def test_explicit_receivers_and_senders(tiny_gqa_llama):
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=4)
    r = circuit(
        model,
        tt,
        receivers="logits,L2H1.k@X",
        senders="L0H0,L1H2",
        attribution="none",
        composition=False,
        bootstrap=0,
    )
    assert set(r.path["receiver"]) == {"logits", "L2H1.k@X"}
    assert set(r.path["sender"]) == {"L0H0", "L1H2"} and set(r.path["estimator"]) == {"exact"}
    assert r.classes is None and r.agreement is None
    assert torch.isfinite(torch.tensor(r.path["effect"].to_numpy())).all()
