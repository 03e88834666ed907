"""ICL task kits (headscope.probes.icl): the bundled files are the ones recorded, the split is
scikit-learn's, the prompts are Todd et al.'s format, answers are scored on their first token in
context, and what cannot be scored is refused or left out in one line."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import numpy as np
import pytest

from headscope.errors import HeadscopeError
from headscope.probes import icl


def test_every_bundled_kit_is_the_file_recorded():
    folder = resources.files("headscope.data").joinpath("icl")
    sources = json.loads(folder.joinpath("SOURCES.json").read_text())
    assert len(icl.ICL_TASKS) >= 12 and set(icl.ICL_TASKS) == set(sources["files"])
    assert "MIT" in sources["licence"] and len(sources["commit"]) == 40
    assert "Eric Todd" in folder.joinpath("LICENSE-function_vectors.txt").read_text()
    for name, f in sources["files"].items():
        data = folder.joinpath(f["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"], name
        assert len(json.loads(data)) == f["pairs"] == len(icl.icl_task(name))


def test_the_split_is_scikit_learns():
    """train_test_split(test_size=0.3, random_state=42) twice, as Todd et al. split: indices
    taken from scikit-learn 1.x on 197 rows (country-capital's size)."""
    s = icl.split(197, seed=42)
    assert (len(s["train"]), len(s["valid"]), len(s["test"])) == (137, 18, 42)
    assert s["valid"][:8].tolist() == [140, 186, 56, 124, 60, 118, 24, 35]
    assert s["test"][:5].tolist() == [5, 155, 97, 190, 132]
    together = np.sort(np.concatenate(list(s.values())))
    assert together.tolist() == list(range(197))


def test_the_prompt_is_todd_et_als_format():
    text = icl.prompt_text([("hot", "cold"), ("up", "down")], "tall")
    assert text == "Q: hot\nA: cold\n\nQ: up\nA: down\n\nQ: tall\nA:"
    assert icl.prompt_text([], "tall") == "Q: tall\nA:"


def test_prompts_answers_and_shuffles(smollm2):
    task = icl.icl_task("country-capital")
    clean = icl.build_prompts(smollm2, task, 4, "clean", shots=5, seed=3)
    shuffled = icl.build_prompts(smollm2, task, 4, "shuffled", shots=5, seed=3)
    valid = set(icl.split(len(task))["valid"].tolist())
    train = set(icl.split(len(task))["train"].tolist())
    for p in range(4):
        assert clean.ids[p][0] == smollm2.bos_id
        assert clean.query[p] in valid and set(clean.demos[p]) <= train
        x, y = task.pairs[clean.query[p]]
        # the answer token is the one after the prompt when prompt and answer are read together
        whole = smollm2.encode(smollm2.tokenizer.decode(clean.ids[p][1:]) + " " + y)
        assert whole[len(clean.ids[p]) - 1] == clean.answer[p]
        assert smollm2.tokenizer.decode([clean.answer[p]]).strip() in y
        # shuffled: the demonstrations' inputs in order, their outputs permuted among them
        text = smollm2.tokenizer.decode(shuffled.ids[p][1:])
        ins = [line[3:] for line in text.split("\n") if line.startswith("Q: ")]
        outs = [line[3:] for line in text.split("\n") if line.startswith("A: ")]
        assert ins[:-1] == [task.pairs[d][0] for d in shuffled.demos[p]]
        assert sorted(outs) == sorted(task.pairs[d][1] for d in shuffled.demos[p])
    assert shuffled.demos[0] == clean.demos[0]  # the same seed draws the same first prompt
    zero = icl.build_prompts(smollm2, task, 2, "zero_shot", seed=0)
    assert smollm2.tokenizer.decode(zero.ids[0][1:]).count("Q:") == 1


def test_answers_whose_first_token_is_a_bare_space_are_left_out(smollm2):
    """SmolLM2 writes ' 7' as ' ' then '7': next_item keeps its word answers only."""
    task = icl.icl_task("next_item")
    ok = icl.usable(smollm2, task)
    dropped = [task.pairs[i][1] for i in np.flatnonzero(~ok)]
    assert dropped and all(y.strip()[0].isdigit() for y in dropped)
    assert ok.sum() == len(task) - len(dropped)


def test_bad_files_are_refused_in_one_line(tmp_path):
    for content, says in (
        ("[]", "JSON list"),
        ('[{"input": "a"}]', "JSON list"),
        ("{", "is not JSON"),
    ):
        f = tmp_path / "t.json"
        f.write_text(content)
        with pytest.raises(HeadscopeError, match=says):
            icl.icl_task(f)
    with pytest.raises(HeadscopeError, match="Did you mean: antonym"):
        icl.icl_task("antonyms")
