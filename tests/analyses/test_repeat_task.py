"""The repeat task: the answer is the token after the earlier copy, only the clean prompt has it."""

from __future__ import annotations

import pytest

from headscope.errors import HeadscopeError
from lib.repeat_task import repeat_task


def test_the_pairs_hold_an_induction_answer_only_in_the_clean_prompt(tiny_gqa_llama):
    model = tiny_gqa_llama
    tt = repeat_task(model, n_pairs=6, length=8, prefix=3, seed=1)
    assert len(tt) == 6 and tt.lengths == [1 + 8 + 3] * 6
    for i in range(6):
        c, k = tt.clean[i], tt.corrupt[i]
        first, second = c[1:9], c[9:]
        assert second == first[:3] and k[9:] == second  # the second copy is the same in both
        assert not set(k[1:9]) & set(first)  # the corrupt first copy shares no token
        assert tt.answer[i] == first[3] == c[tt.positions["KEY"][i]]
        assert c[tt.positions["MATCH"][i]] == c[tt.positions["END"][i]]
        assert tt.wrong[i] not in first and tt.wrong[i] not in k
        assert len(set(first)) == 8
    assert repeat_task(model, 6, 8, 3, seed=1).clean == tt.clean  # seeded


def test_bad_shapes_are_refused(tiny_gqa_llama):
    with pytest.raises(HeadscopeError, match="prefix must be 1..7"):
        repeat_task(tiny_gqa_llama, 2, length=8, prefix=8)
