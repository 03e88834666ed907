"""Fixtures of the circuit tests: a tiny random Llama (RMSNorm, no biases, grouped-query
attention)."""

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    from tests.tiny_models import tiny_llama

    model, tok = tiny_llama()
    with torch.no_grad():  # norms away from 1, so that a forgotten gain shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape) * 2 + 0.1)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_dir):
    import headscope

    return headscope.load_model(str(tiny_llama_dir))


@pytest.fixture(scope="session")
def tiny_gemma3_sharp(tmp_path_factory):
    """The tiny Gemma 3 with its norm weights randomised (Gemma reads them as 1 + w)."""
    from tests.tiny_models import make_tiny_gemma3

    path = make_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3-norms"))
    from transformers import Gemma3ForCausalLM

    model = Gemma3ForCausalLM.from_pretrained(path)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape) * 2 - 0.9)
    model.save_pretrained(path)
    import headscope

    return path, headscope.load_model(str(path))
