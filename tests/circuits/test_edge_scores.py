"""Edge attribution and exact edge patching against closed forms and independent oracles:

* EAP is the derivative of exact edge patching (central differences, float64);
* EAP-IG with one step is denoising EAP with the sign of noising; its Riemann-sum error against
  its integral shrinks as the steps grow;
* every family the graph knows: EAP is the derivative of exact edge patching (each norm's
  gradient is taken by hand); the circuit of every edge is the clean run bit for bit, the
  circuit of none the corrupt run;
* on a tiny GPT-2, EAP equals transformer-lens 4.3's ``attribution_patch`` at edge granularity
  (its position-resolved edges summed over positions) and a circuit's recovered share equals its
  ``faithfulness``;
* exact edge patching equals a plain-transformers recomputation (``tests/oracles/edge_oracle.py``)
  on a tiny GPT-2 and a tiny grouped-query Llama;
* cutting every edge out of one head is patching that head's output, exactly, where heads'
  writes add up (Llama); under Gemma 3's norm on the attention output it is not, and the test
  says by how much.
"""

from __future__ import annotations

import copy

import pytest
import torch

import headscope
from headscope.circuits import edge_circuits as ec
from headscope.circuits import edge_scores as es
from headscope.circuits.edge_graph import FAMILIES, anatomy, graph_of
from headscope.circuits.edge_runs import Cut, EdgeForward, writer_major
from headscope.effects.patching import Request, exact_patching, make_batches, read_rows
from headscope.errors import HeadscopeError
from tests.oracles import conformance as conf
from tests.oracles import edge_oracle
from tests.patch_helpers import random_task


def _batch(model, n_pairs=3, length=8, seed=0):
    tt = random_task(model, n_pairs=n_pairs, length=length, seed=seed)
    return make_batches(tt, n_pairs, model.pad_id)


def _all_edges(model):
    w, r = graph_of(model).edges()
    return list(zip(w.tolist(), r.tolist(), strict=True))


def _is_the_derivative(model, batches, scores, edges, t=1e-5, **how):
    """``scores`` ``[pair, writer, reader]`` at ``edges`` equal the central difference of exact
    edge patching (``how``: direction, position, kv_mode), to 1e-8; the edges move the metric."""
    args = (model, batches, 3, "logit_diff", edges)
    fd = (es.exact_edges(*args, t=t, **how) - es.exact_edges(*args, t=-t, **how)) / (2 * t)
    w, r = zip(*edges, strict=True)
    assert fd.abs().max() > 1e-3  # the check has teeth
    torch.testing.assert_close(scores[:, list(w), list(r)], fd, atol=1e-8, rtol=0)


@pytest.fixture(scope="module")
def gpt2_64(tiny_gpt2):
    hf = copy.deepcopy(tiny_gpt2.hf).double()
    return headscope.load_model(hf, tiny_gpt2.tokenizer, name="tiny-gpt2-f64")


@pytest.mark.parametrize("which", ["gpt2_64", "tiny_gqa_llama64"])
@pytest.mark.parametrize("direction", ["noising", "denoising"])
def test_eap_is_the_derivative_of_exact_edge_patching(which, direction, request):
    model = request.getfixturevalue(which)
    batches = _batch(model)
    edges = _all_edges(model)
    g = graph_of(model)
    eap = es.attribution(model, batches, 3, "logit_diff", "eap", direction)
    assert eap[:, ~g.valid].isnan().all() and not eap[:, g.valid].isnan().any()
    _is_the_derivative(model, batches, eap, edges, direction=direction)


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_position_resolved_edges_add_up_and_eap_is_their_derivative(method, tiny_gqa_llama64):
    model = tiny_gqa_llama64
    tt = random_task(model, n_pairs=3, length=8, seed=2)  # named position X: a changed token
    batches = make_batches(tt, 3, model.pad_id)
    at = {str(p): None for p in range(8)} | {"X": None}
    pooled = es.attribution(model, batches, 3, "logit_diff", method, at=at)
    g = graph_of(model)
    every = sum(at[str(p)] for p in range(8))
    torch.testing.assert_close(every[:, g.valid], pooled[:, g.valid], atol=1e-10, rtol=0)
    x = torch.tensor(tt.positions["X"])  # each pair's X, one position per pair
    by_index = torch.stack([at[str(int(x[i]))][i] for i in range(3)])
    torch.testing.assert_close(at["X"][:, g.valid], by_index[:, g.valid], atol=0, rtol=0)
    if method != "eap":
        return
    _is_the_derivative(model, batches, at["X"], _all_edges(model)[::7], position="X")


def test_eap_ig_one_step_and_its_riemann_sum(tiny_gqa_llama64):
    model = tiny_gqa_llama64
    batches = _batch(model)
    args = (model, batches, 3, "logit_diff")
    g = graph_of(model).valid
    one = es.attribution(*args, "eap-ig", "noising", steps=1)
    # one step: the gradient at the corrupt embeddings, i.e. denoising EAP, noising's sign
    den = es.attribution(*args, "eap", "denoising")
    torch.testing.assert_close(one[:, g], -den[:, g], atol=1e-12, rtol=0)
    # the left Riemann sum converges to its integral like 1/steps
    ref = es.attribution(*args, "eap-ig", "noising", steps=256)[:, g]
    err = [
        (es.attribution(*args, "eap-ig", "noising", steps=m)[:, g] - ref).abs().max().item()
        for m in (1, 2, 4, 8, 16)
    ]
    assert all(a > b for a, b in zip(err, err[1:], strict=False)), err
    assert err[-1] < err[0] / 6, err
    # denoising: the same integral, the other sign
    den_ig = es.attribution(*args, "eap-ig", "denoising", steps=4)
    torch.testing.assert_close(
        den_ig[:, g], -es.attribution(*args, "eap-ig", "noising", steps=4)[:, g]
    )


@pytest.mark.parametrize(
    "family", [f for f in conf.FAMILIES if f.model_type in FAMILIES], ids=lambda f: f.model_type
)
@pytest.mark.parametrize("kv_mode", ["group", "head"])
def test_every_edge_is_the_clean_run_and_no_edge_the_corrupt_run(family, kv_mode):
    hf, tok = conf.tiny_model(family)
    model = headscope.load_model(hf, tok, name=f"tiny-{family.model_type}")
    batches = _batch(model, length=9)
    clean = {
        s: es.record(model, batches[0], s, "logit_diff")[1].double() for s in ("clean", "corrupt")
    }
    valid = graph_of(model, kv_mode).valid
    full, empty = ec.circuit_metrics(
        model, batches, 3, "logit_diff", [valid.clone(), torch.zeros_like(valid)], kv_mode=kv_mode
    )
    assert torch.equal(full, clean["clean"])  # nothing cut: the model's own forward
    torch.testing.assert_close(empty, clean["corrupt"], atol=2e-5, rtol=0)
    assert (clean["clean"] - clean["corrupt"]).abs().max() > 1e-3


@pytest.mark.parametrize(
    "family", [f for f in conf.FAMILIES if f.model_type in FAMILIES], ids=lambda f: f.model_type
)
def test_eap_is_the_derivative_of_exact_edge_patching_in_every_family(family, monkeypatch):
    """Every norm the gradients are taken back through by hand (RMS, Gemma's 1 + w, GPT-2's and
    OLMo's layer norms), against central differences of exact edge patching in float64."""
    softmax = torch.nn.functional.softmax  # eager attention's float32 softmax, in float64

    def softmax64(x, dim=None, dtype=None, **kw):
        return softmax(x, dim=dim, dtype=torch.float64 if x.dtype == torch.float64 else dtype, **kw)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax64)
    hf, tok = conf.tiny_model(family)
    hf = hf.double()
    for mod in hf.modules():  # the norms that compute in float32 whatever their input, in float64
        name = type(mod).__name__
        if "RMSNorm" in name:
            eps = getattr(mod, "eps", getattr(mod, "variance_epsilon", None))
            off = 1.0 if name.startswith("Gemma") else 0.0
            mod.forward = lambda x, mod=mod, eps=eps, off=off: (
                (mod.weight + off) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            )
        elif name == "OlmoLayerNorm":
            mod.forward = lambda x, mod=mod: torch.nn.functional.layer_norm(
                x, mod.normalized_shape, None, None, 1e-5
            )
    model = headscope.load_model(hf, tok, name=f"tiny-{family.model_type}-f64")
    batches = _batch(model, length=9)
    edges = _all_edges(model)
    eap = es.attribution(model, batches, 3, "logit_diff", "eap")
    t = 1e-5
    up = es.exact_edges(model, batches, 3, "logit_diff", edges, t=t)
    down = es.exact_edges(model, batches, 3, "logit_diff", edges, t=-t)
    fd = (up - down) / (2 * t)
    w, r = zip(*edges, strict=True)
    assert fd.abs().max() > 1e-3
    torch.testing.assert_close(eap[:, list(w), list(r)], fd, atol=1e-7, rtol=0)


def _tl_index(g, node):
    if node.kind == "embed":
        return 0
    if node.kind == "attn_head_out":
        return g.head_writer(node.layer, node.head)
    if node.kind == "mlp_out":
        return g.mlp_writer(node.layer)
    if node.kind == "logits":
        return g.logits_reader
    if node.kind == "mlp_in":
        return g.mlp_reader(node.layer)
    slot = {"q_input": 0, "k_input": g.n_heads, "v_input": g.n_heads + g.n_kv}[node.kind]
    return g.attn_reader(node.layer, slot + node.head)


def test_eap_and_faithfulness_equal_transformer_lens(tiny_gpt2):
    ap = pytest.importorskip("transformer_lens.tools.analysis.attribution_patching")
    model = tiny_gpt2
    (batch,) = _batch(model, n_pairs=2, length=7, seed=3)
    g = graph_of(model)
    at = {str(p): None for p in range(7)}  # every position by its token index
    ours = es.attribution(model, [batch], 2, "logit_diff", "eap", "denoising", at=at).mean(0)
    tl = torch.zeros(g.n_writers, g.n_readers, dtype=torch.float64)
    tl_at = torch.zeros(7, g.n_writers, g.n_readers, dtype=torch.float64)
    results = []
    for i in range(2):

        def metric(logits, i=i):
            return logits[0, -1, batch.answer[i]] - logits[0, -1, batch.wrong[i]]

        res = ap.attribution_patch(
            model.bridge,
            batch.clean[i : i + 1],
            batch.corrupt[i : i + 1],
            metric,
            ap.EdgeAttributionConfig(granularity="edge"),
        )
        results.append((metric, res))
        for (u, v), s in res.edge_scores.items():  # per position: ours pools positions
            tl[_tl_index(g, u), _tl_index(g, v)] += s / 2
            assert u.position == v.position  # an edge lives at one position of the stream
            tl_at[u.position, _tl_index(g, u), _tl_index(g, v)] += s / 2
    valid = g.valid
    assert tl[valid].abs().max() > 1e-3
    torch.testing.assert_close(ours[valid], tl[valid], atol=1e-5, rtol=0)
    for p in range(7):  # position-resolved edges: its edges at each position
        torch.testing.assert_close(at[str(p)].mean(0)[valid], tl_at[p][valid], atol=1e-5, rtol=0)
    # writer nodes: the sum of their edges, as transformer-lens aggregates them
    nodes: dict[int, float] = {}
    for n, s in results[0][1].node_scores.items():  # per position, pooled like the edges
        nodes[_tl_index(g, n)] = nodes.get(_tl_index(g, n), 0.0) + s
    one = es.attribution(model, [batch], 2, "logit_diff", "eap", "denoising")[0]
    for w, s in nodes.items():
        assert one[w].nansum().item() == pytest.approx(s, abs=1e-5)
    # a fixed circuit (the top 25 edges): the share of the gap it recovers
    circuit = ec.top_edges(ours, valid, 25)
    metric, res = results[0]
    tl_circuit = [(u, v) for (u, v) in res.edge_scores if circuit[_tl_index(g, u), _tl_index(g, v)]]
    assert len(tl_circuit) == 25 * batch.clean.shape[1]
    first = make_batches(random_task(model, 2, 7, seed=3), 2, model.pad_id)[0]
    m = ec.circuit_metrics(
        model, [first], 2, "logit_diff", [torch.zeros_like(valid), valid.clone(), circuit]
    )[:, 0]  # rows: empty, full, the circuit; pair 0
    faith = ap.faithfulness(model.bridge, batch.clean[:1], batch.corrupt[:1], metric, tl_circuit)
    assert faith.full_metric == pytest.approx(m[1].item(), abs=1e-5)
    assert faith.corrupt_metric == pytest.approx(m[0].item(), abs=1e-5)
    tl_metric = faith.corrupt_metric + faith.recovered * (faith.full_metric - faith.corrupt_metric)
    assert tl_metric == pytest.approx(m[2].item(), abs=1e-5)


def _oracle_reader(g, r):
    if r == g.logits_reader:
        return ("logits",)
    la, slot = divmod(r, g.attn_readers + 1)
    if slot == g.attn_readers:
        return ("mlp", la)
    if slot < g.n_heads:
        return ("q", la, slot)
    s = slot - g.n_heads
    return ("k" if s < g.n_kv else "v", la, s % g.n_kv)


def _oracle_writer(g, w):
    if w == 0:
        return ("embed",)
    la, h = divmod(w - 1, g.n_heads + 1)
    return ("mlp", la) if h == g.n_heads else ("head", la, h)


def check_against_oracle(model, edges, n_pairs=2, length=8):
    (batch,) = _batch(model, n_pairs=n_pairs, length=length, seed=1)
    g = graph_of(model)
    got = es.exact_edges(model, [batch], n_pairs, "logit_diff", edges)
    named = [(_oracle_writer(g, w), _oracle_reader(g, r)) for w, r in edges]
    want = edge_oracle.edge_effects(
        model.hf, batch.clean, batch.corrupt, batch.answer, batch.wrong, named, model.d_head
    )
    for j, w in enumerate(want):
        torch.testing.assert_close(got[:, j], w.cpu(), atol=2e-5, rtol=1e-4)
    assert got.abs().max() > 1e-3


@pytest.mark.parametrize("which", ["tiny_gpt2", "tiny_gqa_llama"])
def test_exact_edge_patching_equals_a_plain_transformers_oracle(which, request):
    model = request.getfixturevalue(which)
    check_against_oracle(model, _all_edges(model))


def test_cutting_a_heads_edges_is_patching_the_head_where_writes_add_up(
    tiny_gqa_llama64, tiny_gemma3_dir
):
    def both(model, head):
        batches = _batch(model)
        g = graph_of(model)
        keep = g.valid.clone()
        keep[g.head_writer(*head)] = False  # every edge out of the head cut
        edge = ec.circuit_metrics(model, batches, 3, "logit_diff", [keep])[0]
        req = Request("noising", "z", "group", ("all",), (head,))
        node = next(iter(exact_patching(model, batches, 3, "logit_diff", [req]).values()))
        return edge, node

    edge, node = both(tiny_gqa_llama64, (1, 2))
    torch.testing.assert_close(edge, node, atol=1e-10, rtol=0)
    # Gemma 3 normalises the attention output by its RMS: a head's write carries the scale of
    # the run it comes from, so its edges patched together are not its output patched through
    # the norm (the norm's scale recomputed); this is the size of that difference here
    gemma = headscope.load_model(str(tiny_gemma3_dir))
    edge, node = both(gemma, (1, 0))
    base = es.record(gemma, _batch(gemma)[0], "clean", "logit_diff")[1].double()
    gap = (node - base).abs().max()
    assert gap > 1e-4 and (edge - node).abs().max() > 1e-6


def test_bad_input_is_one_line(tiny_gqa_llama, tiny_bert):
    model = tiny_gqa_llama
    batches = _batch(model)
    with pytest.raises(HeadscopeError, match="Unknown method 'acdc'"):
        es.attribution(model, batches, 3, "logit_diff", "acdc")
    with pytest.raises(HeadscopeError, match="Unknown direction"):
        es.attribution(model, batches, 3, "logit_diff", "eap", "sideways")
    with pytest.raises(HeadscopeError, match="at least one step"):
        es.attribution(model, batches, 3, "logit_diff", "eap-ig", steps=0)
    with pytest.raises(HeadscopeError, match="reads only writers before it"):
        es.exact_edges(model, batches, 3, "logit_diff", [(graph_of(model).mlp_writer(2), 0)])
    with pytest.raises(HeadscopeError, match="share of the edges between 0 and 1"):
        ec.check_fraction(1.5)
    with pytest.raises(HeadscopeError, match="not a family the edge graph knows"):
        graph = es.anatomy(tiny_bert)  # noqa: F841


def test_exact_edge_patching_equals_the_oracle_on_smollm2(smollm2):
    g = graph_of(smollm2)
    edges = [
        g.edge_index(name)
        for name in (
            "embed->L0H3.q",
            "L2H1->L9KV1.k",
            "L5H4->L20KV0.v",
            "MLP3->MLP4.in",
            "L6H2->MLP6.in",
            "L25H7->logits",
            "MLP29->logits",
        )
    ]
    check_against_oracle(smollm2, edges, n_pairs=2, length=10)


def test_saturation_equals_the_models_own_attention_weights():
    family = next(f for f in conf.FAMILIES if f.model_type == "llama")
    hf, tok = conf.tiny_model(family)
    model = headscope.load_model(hf, tok, name="tiny-llama-eager")
    batches = _batch(model, n_pairs=3, length=9)
    for threshold in (0.3, 0.5, 0.9):
        got = es.saturation(model, batches, "clean", threshold)
        with torch.no_grad():
            att = hf(input_ids=batches[0].clean, output_attentions=True).attentions
        want = torch.stack(
            [(a[:, :, 1:].amax(-1) > threshold).double().mean((0, 2)) for a in att]
        )  # [layer, head], queries 1.. (equal lengths: no padding)
        torch.testing.assert_close(got, want)
    assert (es.saturation(model, batches, "clean", 0.0) == 1).all()
    assert 0 < es.saturation(model, batches, "clean", 0.5).mean() < 1  # the check has teeth


# few kept (sparse, flipped), half (dense), few cut (sparse)
@pytest.mark.parametrize("kept", [0.02, 0.5, 0.98])
def test_cut_corrections_are_the_masked_sum_of_the_cut_rows(kept):
    from headscope.circuits.edge_runs import _corrections

    g = torch.Generator().manual_seed(0)
    w, n, cols = 40, 7, 12
    diff = torch.randn(w, cols, generator=g, dtype=torch.float64)
    diff = torch.cat([diff, diff.sum(0, keepdim=True)])  # the last row: the total
    cut = torch.rand(w, n, generator=g) > kept
    cut[:, 0], cut[:, 1] = True, False  # one reader with everything cut, one with nothing
    want = torch.stack([diff[:w][cut[:, i]].sum(0) for i in range(n)])
    torch.testing.assert_close(_corrections(cut, diff), want, atol=1e-12, rtol=0)


def test_faithfulness_curve_runs_the_full_and_empty_circuits_once(tiny_gqa_llama):
    model = tiny_gqa_llama
    batches = _batch(model)
    g = graph_of(model)
    scores = torch.randn(g.n_writers, g.n_readers, generator=torch.Generator().manual_seed(1))
    shares = [0.01, 0.2, 1.0]
    runs = []
    curve = ec.faithfulness_curve(
        model, batches, 3, "logit_diff", scores, shares, n_random=2, resamples=20,
        on_progress=runs.append,
    )  # fmt: skip
    assert len(runs) == ec.curve_runs(g.n_edges, shares, 2) == 2 + 2 * 3
    per = curve["metrics"]  # [draw, size, pair]: share 1 is the full circuit for every order
    for d in range(3):
        torch.testing.assert_close(per[d, -1], curve["m_full"], atol=0, rtol=0)
    want = ec.circuit_metrics(
        model, batches, 3, "logit_diff", [ec.top_edges(scores, g.valid, round(0.2 * g.n_edges))]
    )[0]
    torch.testing.assert_close(per[0, 1], want, atol=1e-12, rtol=0)


def test_keys_and_values_per_query_head(tiny_gqa_llama64):
    """kv_mode="head": a key or value edge as one query head reads it. A KV head's edge is its
    query heads' edges together: EAP adds up over them, and cutting them all is cutting the
    group's edge; each is the derivative of its own exact patch; the model is left as it was."""
    model = tiny_gqa_llama64
    batches = _batch(model)
    grp, head = graph_of(model), graph_of(model, "head")
    assert head.group == 2 and head.n_kv == model.n_heads and head.n_edges > grp.n_edges
    eap_g = es.attribution(model, batches, 3, "logit_diff", "eap")
    eap_h = es.attribution(model, batches, 3, "logit_diff", "eap", kv_mode="head")
    pairs = []
    for r in range(grp.n_readers):
        name = grp.reader_name(r)
        if "KV" not in name:  # queries, MLPs, the logits: the same reader in both graphs
            torch.testing.assert_close(
                eap_h[:, :, head.reader_index(name)], eap_g[:, :, r], atol=1e-12, rtol=0,
                equal_nan=True,
            )  # fmt: skip
            continue
        la, kv, kind = int(name[1 : name.index("K")]), int(name.split("KV")[1][0]), name[-1]
        heads = [head.reader_index(f"L{la}H{h}.{kind}") for h in (2 * kv, 2 * kv + 1)]
        torch.testing.assert_close(
            eap_h[:, :, heads].sum(-1), eap_g[:, :, r], atol=1e-12, rtol=0, equal_nan=True
        )
        pairs.append((r, heads))
    assert len(pairs) == 2 * model.n_layers * model.n_kv_heads
    # cutting every query head's edge from one writer is cutting the KV head's edge
    w = head.head_writer(0, 1)
    r, heads = next((r, h) for r, h in pairs if grp.reader_layer(r) == 2)
    keep_g, keep_h = grp.valid.clone(), head.valid.clone()
    keep_g[w, r] = False
    keep_h[w, heads] = False
    m_g = ec.circuit_metrics(model, batches, 3, "logit_diff", [keep_g])
    m_h = ec.circuit_metrics(model, batches, 3, "logit_diff", [keep_h], kv_mode="head")
    torch.testing.assert_close(m_h, m_g, atol=1e-10, rtol=0)
    one = keep_h.clone()
    one[w, heads[1]] = True  # only the first query head reads the changed key
    m_one = ec.circuit_metrics(model, batches, 3, "logit_diff", [one], kv_mode="head")
    assert (m_one - m_g).abs().max() > 1e-6
    # EAP per query head is the derivative of its exact patch
    w, r = head.edges()
    kv = [
        (a, c)
        for a, c in zip(w.tolist(), r.tolist(), strict=True)
        if head.reader_name(c)[-2:] in (".k", ".v")
    ]
    _is_the_derivative(model, batches, eap_h, kv[::3], kv_mode="head")
    assert all(m.self_attn.num_key_value_groups == 2 for m in model.hf.model.layers)


def test_circuits_run_together_equal_each_run_alone(tiny_gqa_llama64):
    """One call reuses memory from circuit to circuit: what one circuit left there (a writer it
    cut, the next one does not) must not leak into the next."""
    model = tiny_gqa_llama64
    batches = _batch(model)
    g = graph_of(model)
    valid = g.valid
    spare = torch.zeros_like(valid)  # layer 0's heads, fed the clean embedding, feeding all
    spare[[g.head_writer(0, h) for h in range(model.n_heads)]] = True
    spare[0, g.attn_slice(0)] = True
    spare &= valid
    rand = valid & (torch.rand(valid.shape, generator=torch.Generator().manual_seed(3)) < 0.5)
    circuits = [torch.zeros_like(valid), spare, rand, torch.zeros_like(valid)]
    together = ec.circuit_metrics(model, batches, 3, "logit_diff", circuits)
    alone = torch.cat([ec.circuit_metrics(model, batches, 3, "logit_diff", [c]) for c in circuits])
    assert torch.equal(together, alone)
    assert (together[1] - together[0]).abs().max() > 1e-6
    # whatever the reused memory holds (here NaN), every row a circuit reads is its own
    (batch,) = batches
    repl = writer_major(es.record(model, batch, "corrupt", "logit_diff")[0])
    b, n = batch.clean.shape
    for i, c in enumerate(circuits):
        junk = torch.full((g.n_writers + 1, b * n * model.hf.config.hidden_size), torch.nan)
        ef = EdgeForward(model, anatomy(model), g, cut=Cut(valid & ~c, repl, junk.double()))
        with ef():
            hidden = model.run(batch.clean, batch.mask, output="hidden")
        m = read_rows(model, "logit_diff", hidden, batch, 1).double()
        # circuit_metrics takes the empty circuit from the corrupt run itself (what reading only
        # replacements gives, up to the rounding of stream - total)
        tol = 0 if c.any() else 1e-12
        torch.testing.assert_close(m, alone[i, batch.index], atol=tol, rtol=0)
    m_corrupt = es.record(model, batch, "corrupt", "logit_diff")[1].double()
    assert torch.equal(alone[0, batch.index], m_corrupt)
