"""Tasks: built in code or read from JSONL / TSV, tokenized for a model, every refusal one line."""

from __future__ import annotations

import json

import pytest

from headscope.errors import HeadscopeError
from headscope.probes.kits import load_kit, resolve_task
from headscope.probes.tasks import END, Pair, Task, TokenizedTask, check_metric


@pytest.fixture(scope="module")
def words(tiny_gpt2):
    """Words that are one token with a leading space for the tiny tokenizer, longest first."""
    out = []
    for i in range(len(tiny_gpt2.tokenizer)):
        w = tiny_gpt2.decode_one(i)
        if w.startswith(" ") and w[1:].isalpha() and tiny_gpt2.encode(w) == [i]:
            out.append(w[1:])
    assert len(out) >= 6
    return sorted(out, key=len, reverse=True)


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_from_pairs_tokenizes_with_bos_and_named_positions(tiny_gpt2, words):
    a, b, c = words[:3]
    clean, corrupt = f"the {a} and the {b}", f"the {c} and the {b}"
    task = Task.from_pairs([(clean, corrupt, " " + a, " " + c, {"A": {"char": 4}, "B": -1})])
    tt = task.tokenize(tiny_gpt2)
    ids = tt.clean[0]
    assert ids[0] == tiny_gpt2.bos_id and ids[1:] == tiny_gpt2.encode(clean)
    assert tiny_gpt2.decode_one(ids[tt.positions["A"][0]]) == " " + a
    assert tt.positions["B"] == [len(ids) - 1] == tt.positions[END]
    assert tt.answer == tiny_gpt2.encode(" " + a) and tt.metric == "logit_diff"
    no_bos = Task.from_pairs([(clean, corrupt, " " + a, " " + c)], prepend_bos=False).tokenize(
        tiny_gpt2
    )
    assert no_bos.clean[0] == ids[1:]


def test_refusals_are_one_line_each(tiny_gpt2, words):
    a, b = words[:2]
    long_ = f"the {a} {a} {a}"
    with pytest.raises(HeadscopeError) as e:  # names the pair and both lengths
        Task.from_pairs(
            [(f"the {a}", f"the {a}", " " + a, " " + b), (f"the {a}", long_, " " + a, " " + b)]
        ).tokenize(tiny_gpt2)
    n1, n2 = 1 + len(tiny_gpt2.encode(f"the {a}")), 1 + len(tiny_gpt2.encode(long_))
    assert "Pair 1" in _one_line(e) and f"({n1} and {n2} tokens" in str(e.value)
    with pytest.raises(HeadscopeError) as e:  # shows the tokenization
        Task.from_pairs([(f"the {a}", f"the {b}", f" {a}{b}zq", " " + b)]).tokenize(tiny_gpt2)
    pieces = [tiny_gpt2.decode_one(t) for t in tiny_gpt2.encode(f" {a}{b}zq")]
    assert (
        "Pair 0" in _one_line(e) and str(pieces) in str(e.value) and "single token" in str(e.value)
    )
    with pytest.raises(HeadscopeError) as e:
        Task.from_pairs([(f"the {a}", f"the {b}", " " + a, " " + a)]).tokenize(tiny_gpt2)
    assert "same token" in _one_line(e)
    with pytest.raises(HeadscopeError) as e:
        Task.from_pairs([])
    assert "no pairs" in _one_line(e)
    with pytest.raises(HeadscopeError) as e:
        Task.from_pairs([(f"the {a}", f"the {b}", " " + a, " " + b, {"P": 99})]).tokenize(tiny_gpt2)
    assert "position 'P'" in _one_line(e)
    with pytest.raises(HeadscopeError) as e:
        TokenizedTask("t", [[1, 2]], [[1, 2, 3]], [4], [5], {})
    assert "different lengths" in _one_line(e)


def test_unknown_kit_and_metric_suggest_the_nearest(tiny_gpt2):
    with pytest.raises(HeadscopeError) as e:
        load_kit("ioj", tiny_gpt2)
    assert "Did you mean: ioi?" in _one_line(e) and "copy_name" in str(e.value)
    with pytest.raises(HeadscopeError) as e:
        resolve_task("capitol", tiny_gpt2)
    assert "Did you mean: capital?" in _one_line(e)
    with pytest.raises(HeadscopeError) as e:
        check_metric("logit_dif")
    assert "Did you mean: logit_diff?" in _one_line(e)
    with pytest.raises(HeadscopeError) as e:
        Task.from_pairs([("a", "b", " a", " b")], metric="probs")
    assert "Did you mean: prob?" in _one_line(e)


def test_a_kit_the_tokenizer_cannot_fill_says_so(tiny_gpt2):
    with pytest.raises(HeadscopeError) as e:
        load_kit("ioi", tiny_gpt2)
    assert "single tokens" in _one_line(e)


def test_encoders_and_models_without_lm_head_are_refused(tiny_bert, tiny_gpt2):
    from transformers import GPT2Model

    import headscope

    with pytest.raises(HeadscopeError) as e:
        Task.from_pairs([("a b", "a c", " a", " b")]).tokenize(tiny_bert)
    assert "encoder" in _one_line(e)
    bare = headscope.load_model(
        GPT2Model(tiny_gpt2.hf.config).eval(), tiny_gpt2.tokenizer, name="no-head"
    )
    with pytest.raises(HeadscopeError) as e:
        Task.from_pairs([("a b", "a c", " a", " b")]).tokenize(bare)
    assert "no LM head" in _one_line(e)


def test_jsonl_and_tsv_files(tmp_path, tiny_gpt2, words):
    a, b, c = words[:3]
    rows = [
        {
            "clean": f"the {a} and {b}",
            "corrupt": f"the {c} and {b}",
            "answer": " " + a,
            "wrong": " " + c,
            "positions": {"A": 2},
        }
    ] * 2
    jl = tmp_path / "mine.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    tsv = tmp_path / "mine.tsv"
    tsv.write_text(
        "clean\tcorrupt\tanswer\twrong\tpos:A\n"
        + "".join(f"{r['clean']}\t{r['corrupt']}\t{r['answer']}\t{r['wrong']}\t2\n" for r in rows)
    )
    for path in (jl, tsv):
        task = resolve_task(str(path), tiny_gpt2)
        assert task.name == "mine" and task.pairs[0].answer == " " + a  # the leading space is kept
        assert task.provenance["path"] == str(path.absolute())
        tt = task.tokenize(tiny_gpt2)
        assert tt.positions["A"] == [2, 2] and len(tt) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"clean": "x"}\n')
    with pytest.raises(HeadscopeError) as e:
        Task.from_file(bad)
    assert "line 1" in _one_line(e) and "corrupt" in str(e.value)
    bad.write_text("not json\n")
    with pytest.raises(HeadscopeError) as e:
        Task.from_file(bad)
    assert "not JSON" in _one_line(e)
    nohead = tmp_path / "x.tsv"
    nohead.write_text("a\tb\n")
    with pytest.raises(HeadscopeError) as e:
        Task.from_file(nohead)
    assert "header" in _one_line(e)
    with pytest.raises(HeadscopeError) as e:
        Task.from_file(tmp_path / "missing.jsonl")
    assert "does not exist" in _one_line(e)


def test_pairs_as_dicts_and_pair_objects():
    t = Task.from_pairs(
        [{"clean": "a", "corrupt": "b", "answer": " x", "wrong": " y"}, Pair("a", "b", " x", " y")]
    )
    assert t.pairs[0] == t.pairs[1]
    with pytest.raises(HeadscopeError):
        Task.from_pairs([("a", "b")])
