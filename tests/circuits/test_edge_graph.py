"""The edge graph's closed forms: counts, the staircase of who reads whom, names both ways, one
line for a bad name or a reader below its writer."""

from __future__ import annotations

import pytest

from headscope.circuits.edge_graph import EdgeGraph
from headscope.errors import HeadscopeError


def test_counts_and_the_staircase():
    g = EdgeGraph(n_layers=2, n_heads=3, n_kv=1)
    assert g.n_writers == 1 + 2 * 4 and g.attn_readers == 5 and g.n_readers == 2 * 6 + 1
    # layer 0's attention reads the embedding; its MLP also its 3 heads; layer 1 reads 5; logits 9
    per_reader = [1] * 5 + [4] + [5] * 5 + [8] + [9]
    assert g.writers_before().tolist() == per_reader
    assert g.n_edges == sum(per_reader) == int(g.valid.sum())
    w, r = g.edges()
    assert len(w) == g.n_edges and (w < g.writers_before()[r]).all()
    # SmolLM2-135M's graph (30 layers, 9 query heads on 3 KV heads)
    s = EdgeGraph(30, 9, 3)
    assert s.n_writers == 301 and s.n_readers == 30 * 16 + 1
    assert s.n_edges == sum(15 * (1 + 10 * la) + (10 + 10 * la) for la in range(30)) + 301


def test_names_round_trip():
    g = EdgeGraph(n_layers=3, n_heads=4, n_kv=2)
    for w in range(g.n_writers):
        assert g.writer_index(g.writer_name(w)) == w
    for r in range(g.n_readers):
        assert g.reader_index(g.reader_name(r)) == r
    assert g.writer_name(0) == "embed" and g.writer_name(g.mlp_writer(2)) == "MLP2"
    assert g.reader_name(g.attn_reader(1, 4 + 2 + 1)) == "L1KV1.v"
    assert g.edge_index("L0H3->L2KV0.k") == (g.head_writer(0, 3), g.attn_reader(2, 4))
    assert g.edge_index("L1H0->MLP1.in") == (g.head_writer(1, 0), g.mlp_reader(1))
    assert g.edge_name(*g.edge_index("MLP2->logits")) == "MLP2->logits"


@pytest.mark.parametrize(
    "name, match",
    [
        ("L1H0->L1H2.q", "does not read L1H0"),
        ("MLP1->MLP1.in", "does not read MLP1"),
        ("L0H9->logits", "No writer 'L0H9'"),
        ("embed->L3H0.q", "No reader 'L3H0.q'"),
        ("embed->L0KV2.k", "No reader"),
        ("L0H1 L1H0.q", "writer->reader"),
    ],
)
def test_bad_edges_are_one_line(name, match):
    with pytest.raises(HeadscopeError, match=match):
        EdgeGraph(n_layers=3, n_heads=4, n_kv=2).edge_index(name)
