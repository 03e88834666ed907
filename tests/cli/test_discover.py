"""``headscope discover`` as a user meets it: a run directory whose tables hold what the functions
compute, its summary, and one line (exit 2, nothing left behind) for every bad input."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

import headscope
from headscope.apps.discover import load_discovery
from headscope.apps.settings import DiscoverSettings
from headscope.circuits import edge_circuits as ec
from headscope.circuits import edge_scores as es
from headscope.circuits.edge_graph import graph_of
from headscope.cli.main import main
from headscope.effects.patch_attribution import qk_fixed
from headscope.effects.patching import Request, exact_patching, make_batches
from headscope.probes.kits import tokenize_task
from tests.conftest import write_task

FAST = ["--bootstrap", "50", "--n-random", "2", "--sizes", "6", "--exact", "10", "--quiet"]


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_writes_a_discovery_run_whose_tables_are_the_functions(tmp_path, tiny_gpt2_dir, good_task):
    out = tmp_path / "run"
    res = run("discover", str(tiny_gpt2_dir), "--task", good_task, "--out", str(out), *FAST)
    assert res.exit_code == 0, res.output
    names = {p.name for p in out.iterdir()}
    assert {"edges.csv", "nodes.csv", "curve.csv", "agreement.csv", "circuit.json"} <= names
    assert {"baseline.csv", "tokens.jsonl", "metadata.json", "report.html"} <= names
    assert {"curve.png", "circuit.png"} <= names
    assert "top edges by eap_ig" in res.stdout and "CPR" in res.stdout
    model = headscope.load_model(str(tiny_gpt2_dir))
    g = graph_of(model)
    edges = pd.read_csv(out / "edges.csv")
    assert len(edges) == g.n_edges and edges["edge"].is_unique
    # the saved scores are the functions' on the same pairs (noising, every pair one batch)
    tt = tokenize_task(good_task, model, None, None, 0, None)
    batches = make_batches(tt, 32, model.pad_id)
    eap = es.attribution(model, batches, len(tt), "logit_diff", "eap").mean(0)
    w, r = g.edges()
    assert edges["eap"].to_numpy() == pytest.approx(eap[w, r].numpy(), abs=1e-9)
    exact = edges[edges["exact"].notna()]
    assert 10 <= len(exact) <= 20  # the top 10 by each score, merged
    pick = [g.edge_index(e) for e in exact["edge"]]
    want = es.exact_edges(model, batches, len(tt), "logit_diff", pick).mean(0)
    assert exact["exact"].to_numpy() == pytest.approx(want.numpy(), abs=1e-9)
    curve = pd.read_csv(out / "curve.csv")
    assert len(curve) == 6 * 3 and curve["share"].max() == 1.0
    assert curve[curve["share"] == 1.0]["f"].to_numpy() == pytest.approx(1.0)
    circuit = json.loads((out / "circuit.json").read_text())
    assert circuit["n_edges"] == round(0.01 * g.n_edges) or circuit["n_edges"] == 1
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["run_format"] == "headscope-discover/1" and len(meta["random_cpr"]) == 2
    assert meta["cpr"][1] <= meta["cpr"][0] <= meta["cpr"][2]
    back = load_discovery(out)
    assert back.circuit == circuit and len(back.edges) == g.n_edges
    # readers: in-edge sums, AtP* of every query and key, the top 10 of them patched exactly
    readers = pd.read_csv(out / "readers.csv").set_index("reader")
    assert len(readers) == g.n_readers
    sums = es.attribution(model, batches, len(tt), "logit_diff", "eap").mean(0).nansum(0)
    assert readers["eap"].to_numpy() == pytest.approx(sums.numpy(), abs=1e-9)
    qk = qk_fixed(model, batches, len(tt), "logit_diff")
    assert readers.loc["L1H2.q", "atp_qk"] == pytest.approx(qk["q"][:, 1, 2].mean().item())
    assert readers.loc["L0KV1.k", "atp"] == pytest.approx(qk["atp_k"][:, 0, 1].mean().item())
    measured = readers[readers["exact"].notna()]
    assert len(measured) == 10 and set(measured["kind"]) <= {"q", "k"}
    top = readers["atp_qk"].abs().sort_values(ascending=False).index[:10]
    assert set(measured.index) == set(top)
    name = measured.index[0]
    kind, mode = ("q", "head") if name.endswith(".q") else ("k", "group")
    la, unit = (int(x) for x in name[1:].split(".")[0].split("H" if kind == "q" else "KV"))
    base: dict = {}
    req = Request("noising", kind, mode, ("all",), ((la, unit),))
    got = exact_patching(model, batches, len(tt), "logit_diff", [req], baseline=base)
    want = (got[("noising", kind, mode, "all", la, unit)] - base["clean"]).mean().item()
    assert measured.loc[name, "exact"] == pytest.approx(want, abs=1e-9)
    assert "AtP* (QK fix)" in (out / "report.html").read_text()


def test_named_edges_are_patched_exactly(tmp_path, tiny_gpt2_dir, good_task):
    out = tmp_path / "run"
    res = run(
        "discover", str(tiny_gpt2_dir), "--task", good_task, "--out", str(out), "--no-figures",
        "--methods", "eap", "--exact", "0", "--edges", "L0H1->L1H2.q,MLP0->logits", *FAST[:-3],
        "--quiet",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    edges = pd.read_csv(out / "edges.csv").set_index("edge")
    assert edges["exact"].notna().sum() == 2
    assert "eap_ig" not in edges.columns
    assert edges.loc[["L0H1->L1H2.q", "MLP0->logits"], "exact"].notna().all()


def test_held_out_pairs_measure_the_curve_and_the_circuit(tmp_path, tiny_gpt2_dir, good_task):
    out = tmp_path / "run"
    res = run(
        "discover", str(tiny_gpt2_dir), "--task", good_task, "--out", str(out), "--no-figures",
        "--methods", "eap", "--n-pairs", "2", "--held-out", "2", *FAST,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    model = headscope.load_model(str(tiny_gpt2_dir))
    every = tokenize_task(good_task, model, None, None, 0, None)
    back = load_discovery(out)
    assert back.tokens.clean == every.clean[:2] and back.held_out.clean == every.clean[2:]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["curve_on"] == "held-out pairs" and meta["curve_pairs"] == 2
    assert "held-out pairs" in (out / "report.html").read_text()
    # the circuit's f: its metric on the held-out pairs, between their empty and full circuits
    g = graph_of(model)
    ranked = make_batches(every.subset(2), 32, model.pad_id)
    held = make_batches(every.select([2, 3]), 32, model.pad_id)
    eap = es.attribution(model, ranked, 2, "logit_diff", "eap").mean(0)
    k = json.loads((out / "circuit.json").read_text())["n_edges"]
    circuits = [torch.zeros_like(g.valid), g.valid.clone(), ec.top_edges(eap, g.valid, k)]
    m = ec.circuit_metrics(model, held, 2, "logit_diff", circuits).mean(1)
    f = ((m[2] - m[0]) / (m[1] - m[0])).item()
    assert back.circuit["faithfulness"] == pytest.approx(f, abs=1e-9)


def test_edges_at_named_positions(tmp_path, tiny_gpt2_dir, good_task):
    out = tmp_path / "run"
    res = run(
        "discover", str(tiny_gpt2_dir), "--task", good_task, "--out", str(out), "--no-figures",
        "--methods", "eap", "--positions", "A,END", *FAST,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    model = headscope.load_model(str(tiny_gpt2_dir))
    g = graph_of(model)
    tt = tokenize_task(good_task, model, None, None, 0, None)
    batches = make_batches(tt, 32, model.pad_id)
    at = {"A": None, "END": None}
    es.attribution(model, batches, len(tt), "logit_diff", "eap", at=at)
    table = pd.read_csv(out / "edges_at.csv")
    assert len(table) == 2 * g.n_edges and set(table["position"]) == {"A", "END"}
    w, r = g.edges()
    for pos in ("A", "END"):
        rows = table[table["position"] == pos]
        assert rows["eap"].to_numpy() == pytest.approx(at[pos].mean(0)[w, r].numpy(), abs=1e-9)
        measured = rows[rows["exact"].notna()]
        assert len(measured) == 10
        pick = [g.edge_index(e) for e in measured["edge"]]
        want = es.exact_edges(model, batches, len(tt), "logit_diff", pick, position=pos).mean(0)
        assert measured["exact"].to_numpy() == pytest.approx(want.numpy(), abs=1e-9)
    assert len(load_discovery(out).edges_at) == 2 * g.n_edges
    assert "Edges at named positions" in (out / "report.html").read_text()


def test_keys_and_values_per_query_head(tmp_path, tiny_gemma3_dir, good_task):
    out = tmp_path / "run"
    res = run(
        "discover", str(tiny_gemma3_dir), "--task", good_task, "--out", str(out),
        "--methods", "eap", "--kv-mode", "head", "--circuit-share", "0.2", *FAST,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    model = headscope.load_model(str(tiny_gemma3_dir))
    g = graph_of(model, "head")
    edges = pd.read_csv(out / "edges.csv")
    assert len(edges) == g.n_edges > graph_of(model).n_edges
    assert {"L1H3.k", "L1H0.v"} <= set(edges["reader"]) and not edges["reader"].str.contains(
        "KV"
    ).any()
    tt = tokenize_task(good_task, model, None, None, 0, None)
    batches = make_batches(tt, 32, model.pad_id)
    eap = es.attribution(model, batches, len(tt), "logit_diff", "eap", kv_mode="head").mean(0)
    w, r = g.edges()
    assert edges["eap"].to_numpy() == pytest.approx(eap[w, r].numpy(), abs=1e-9)
    readers = pd.read_csv(out / "readers.csv").set_index("reader")
    qk = qk_fixed(model, batches, len(tt), "logit_diff")
    assert readers.loc["L1H3.k", "atp_qk"] == pytest.approx(qk["k_head"][:, 1, 3].mean().item())
    assert json.loads((out / "metadata.json").read_text())["kv_mode"] == "head"
    assert (out / "circuit.png").is_file()  # per-query-head keys and values placed in the diagram


def test_help_lists_every_setting():
    res = run("discover", "--help")
    assert res.exit_code == 0
    for f in dataclasses.fields(DiscoverSettings):
        assert "--" + f.name.replace("_", "-") in res.output, f.name


def _refused(res, *words):
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith("headscope: error:"), line
    for w in words:
        assert w in line, (w, line)


@pytest.mark.parametrize(
    "case",
    ["method", "size", "share", "below", "unknown", "lengths", "encoder", "exists", "held", "pos"],
)
def test_bad_input_exits_2_with_one_line_and_leaves_nothing(
    case, tmp_path, tiny_gpt2_dir, tiny_bert_dir, words, good_task
):
    a, b = words[:2]
    out = tmp_path / "run"
    model, task, extra, expect = str(tiny_gpt2_dir), good_task, [], []
    if case == "method":
        extra, expect = ["--methods", "acdc"], ["Unknown methods (--methods) 'acdc'", "eap-ig"]
    elif case == "size":
        extra, expect = ["--smallest", "1.5"], ["share of the edges in (0, 1]"]
    elif case == "share":
        extra, expect = ["--circuit-share", "0"], ["share of the edges in (0, 1]"]
    elif case == "below":
        extra, expect = ["--edges", "L1H0->L0H2.q"], ["L0H2.q does not read L1H0"]
    elif case == "unknown":
        extra, expect = ["--edges", "L0H9->logits"], ["No writer 'L0H9'"]
    elif case == "lengths":
        task = write_task(
            tmp_path / "t.jsonl",
            [{"clean": f"the {a}", "corrupt": f"the {a} {a} {a}", "answer": " " + a,
              "wrong": " " + b}],
        )  # fmt: skip
        expect = ["Pair 0", "different lengths"]
    elif case == "held":
        extra = ["--n-pairs", "3", "--held-out", "2"]
        expect = ["has 1 pairs after the ranking's", "ask for at most 1"]
    elif case == "pos":
        extra, expect = ["--positions", "END,NOPE"], ["No position 'NOPE'", "it has A, END"]
    elif case == "encoder":
        model, expect = str(tiny_bert_dir), ["encoder"]
    elif case == "exists":
        out.mkdir()
        (out / "mine.txt").write_text("keep me")
        expect = ["already exists"]
    res = run("discover", model, "--task", task, "--out", str(out), *extra, *FAST)
    _refused(res, *expect)
    if case == "exists":
        assert (out / "mine.txt").read_text() == "keep me" and len(list(out.iterdir())) == 1
    else:
        assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_scan_beside_puts_its_pattern_scores_beside_the_head_nodes(
    tmp_path, tiny_gpt2_dir, good_task, runs
):
    out = tmp_path / "run"
    res = run(
        "discover", str(tiny_gpt2_dir), "--task", good_task, "--out", str(out), "--no-figures",
        "--methods", "eap", "--scan", str(runs["gpt2"]), *FAST,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    nodes = pd.read_csv(out / "nodes.csv").set_index("node")
    scan = pd.read_csv(runs["gpt2"] / "scores.csv")
    want = scan[scan["metric"] == "induction"].set_index("head_name")["score"]
    assert nodes.loc[want.index, "induction"].to_numpy() == pytest.approx(want.to_numpy())
    assert pd.isna(nodes.loc["embed", "induction"]) and pd.isna(nodes.loc["MLP0", "induction"])
    assert json.loads((out / "metadata.json").read_text())["scan"]["model"]
