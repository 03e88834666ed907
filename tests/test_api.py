"""The public surface: every name in ``headscope.__all__`` resolves, and submodules never shadow it."""

import importlib
import pkgutil

import headscope


def test_every_export_resolves_and_is_not_shadowed_by_a_submodule():
    for mod in pkgutil.walk_packages(headscope.__path__, "headscope."):
        if mod.name != "headscope.__main__":
            importlib.import_module(mod.name)
    for name in headscope.__all__:
        obj = getattr(headscope, name)
        assert obj is not None
        assert type(obj).__name__ != "module", f"headscope.{name} is a module, not the API object"
    assert callable(headscope.scan) and callable(headscope.load_model)


def test_score_pattern_on_a_user_pattern():
    import torch

    A = torch.tensor([[1.0, 0, 0], [1, 0, 0], [0, 1, 0]])[None, None]
    assert headscope.score_pattern(A, "previous_token", causal=True).item() == 1.0
    assert headscope.score_pattern(A[0], "sink", causal=True, lengths=[2]).item() == 1.0
    ids = torch.tensor([[5, 7, 9]])
    sep = headscope.score_pattern(A, "separator", causal=True, token_ids=ids, separator_id=7)
    # q=1 and q=2 see the separator at k=1; q=1 puts 0 on it, q=2 puts 1: mean 0.5
    assert sep.item() == 0.5
