"""Built-in kits: data files with provenance; pairs filled in for a real tokenizer, single-token
words, named positions on the right tokens, the ABC corruption, seeded."""

from __future__ import annotations

import json

import pytest

from headscope.probes.kits import DATA, KITS, kit_data, load_kit


def test_every_kit_has_a_data_file_with_provenance():
    assert sorted(p.stem for p in DATA.glob("*.json")) == sorted(KITS)
    for kit in KITS:
        data = json.loads((DATA / f"{kit}.json").read_text())
        assert data["kit"] == kit and data["provenance"]["what"]
        assert data["provenance"].get("source") or data["provenance"].get("copied_from")
    ioi = kit_data("ioi")
    assert len(ioi["templates"]["BABA"]) == len(ioi["templates"]["ABBA"]) == 15
    for baba, abba in zip(ioi["templates"]["BABA"], ioi["templates"]["ABBA"], strict=True):
        assert baba.index("[B]") < baba.index("[A]") and abba.index("[A]") < abba.index("[B]")
        assert baba.endswith(" [A]") and abba.endswith(" [A]") and baba.count("[B]") == 2


@pytest.mark.real
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_ioi_pairs(name, request):
    model = request.getfixturevalue(name)
    task = load_kit("ioi", model, n_pairs=12, seed=3)
    tt = task.tokenize(model)
    for i, pair in enumerate(task.pairs):
        io, s = pair.info["IO"], pair.info["S"]
        dec = lambda p, i=i: model.decode_one(tt.clean[i][tt.positions[p][i]])  # noqa: E731
        assert dec("IO") == " " + io and dec("S1") == " " + s and dec("S2") == " " + s
        assert tt.answer[i] == model.encode(" " + io)[0] and tt.wrong[i] == model.encode(" " + s)[0]
        order = pair.info["order"]
        assert order == ("BABA" if i % 2 == 0 else "ABBA")
        io_p, s1, s2 = tt.positions["IO"][i], tt.positions["S1"][i], tt.positions["S2"][i]
        assert (s1 < io_p) == (order == "BABA") and s2 > max(io_p, s1)
        # ABC: only the three name positions differ, and they hold three other names
        diff = [
            p for p, (a, b) in enumerate(zip(tt.clean[i], tt.corrupt[i], strict=True)) if a != b
        ]
        assert diff == sorted([io_p, s1, s2])
        new = {model.decode_one(tt.corrupt[i][p]).strip() for p in diff}
        assert len(new) == 3 and not new & {io, s}
    assert load_kit("ioi", model, n_pairs=12, seed=3) == task  # seeded
    assert load_kit("ioi", model, n_pairs=12, seed=4) != task
    one = load_kit("ioi", model, n_pairs=6, templates=[2]).tokenize(model)
    assert (
        len(set(one.lengths)) == 1
    )  # one template, one length (places and objects are single tokens)


@pytest.mark.real
def test_other_kits_put_their_positions_on_their_words(smollm2):
    m = smollm2
    for kit, slots in (
        ("capital", {"COUNTRY": "country"}),
        ("pronoun", {"NAME": "name"}),
        ("copy_name", {"FIRST": "first", "LAST": "last", "FIRST2": "first"}),
    ):
        task = load_kit(kit, m, n_pairs=6, seed=0)
        tt = task.tokenize(m)
        for i, pair in enumerate(task.pairs):
            for pos, key in slots.items():
                assert m.decode_one(tt.clean[i][tt.positions[pos][i]]) == " " + pair.info[key], (
                    kit,
                    pos,
                )
        if kit == "pronoun":
            assert {m.decode_one(a) for a in tt.answer} == {" he", " she"}


@pytest.mark.real
def test_held_out_pairs_share_no_clean_prompt_with_the_ranking(smollm2):
    from headscope.probes.kits import held_out_task, tokenize_task

    ranked = tokenize_task("ioi", smollm2, None, 32, 0)
    held = held_out_task("ioi", smollm2, ranked, 24, None, 0)
    assert len(held) == 24 and not {tuple(c) for c in held.clean} & {tuple(c) for c in ranked.clean}
    assert held.clean[:4] == tokenize_task("ioi", smollm2, None, 4, 1).clean  # seed + 1, in order
    assert held_out_task("ioi", smollm2, ranked, 24, None, 0).clean == held.clean  # seeded
