"""The Triton prototype (``benchmarks/triton_stats.py``, kept beside the benchmarks, outside the
package): the same statistics as a hand-written softmax, from per-row accumulators. Runs where
Triton is installed: on CUDA, or on the CPU under ``TRITON_INTERPRET=1`` (slow, small shapes). CI
has no Triton: skipped there, with the reason.

    PYTHONPATH=.:/path/to/triton-site TRITON_INTERPRET=1 pytest tests/engines/test_triton_stats.py
"""

from __future__ import annotations

import os

import pytest
import torch

from benchmarks import triton_stats as ts
from headscope.engines import flex
from headscope.engines import flex_stats as fs
from headscope.engines.extract import score_probe
from headscope.metrics import REGISTRY
from tests.engines.test_flex import TOL, _case, softmax64

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    ts.triton_reason(DEVICE) is not None,
    reason=f"{ts.triton_reason(DEVICE)} (set TRITON_INTERPRET=1 with Triton installed)",
)


@pytest.fixture(autouse=True, scope="module")
def _interpreter_numpy_shim():
    """Triton 3.6's interpreter takes int() of a one-element array for a scalar used as a loop
    bound,
    which NumPy >= 2.4 refuses; give it the element. Interpreter only; compiled kernels are
    untouched."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    from triton.runtime import interpreter as it

    orig = it._patch_lang_tensor

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    it._patch_lang_tensor = patched
    yield
    it._patch_lang_tensor = orig


# bf16 matmuls are wrong in Triton 3.6's interpreter (NumPy has no bfloat16); fp16 stands for half
# precision there
HALF = torch.bfloat16 if DEVICE.type == "cuda" else torch.float16


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_triton_statistics_equal_a_hand_written_softmax(causal, dtype):
    q, k, v, m, flags, targets, scale = (
        x.to(DEVICE) if isinstance(x, torch.Tensor) else x
        for x in _case(dtype=dtype, causal=causal)
    )
    flags = {n: f.to(DEVICE) for n, f in flags.items()}
    band = (3, 10)
    vis = fs.Visibility(q.shape[2], k.shape[2], causal, m[:, 0], DEVICE)
    out, st = ts.triton_layer_stats(q, k, v, vis, scale, fs.StatsRequest(flags, band, targets))
    tri = torch.ones(150, 150, dtype=torch.bool, device=DEVICE).tril()
    visible = m & (tri if causal else True)
    A, s = softmax64(q, k, visible, scale)  # [b, h, q, k], from the same (half-precision) values
    seen = visible.any(-1).expand(A.shape[:3])
    torch.testing.assert_close(st.entropy, -torch.special.xlogy(A, A).sum(-1), atol=TOL, rtol=0)
    torch.testing.assert_close(
        st.lse, torch.where(seen, torch.logsumexp(s, -1), float("-inf")), atol=TOL, rtol=0
    )
    for name, f in flags.items():
        torch.testing.assert_close(
            st.masses[name], (A * f[:, None, None, :].double()).sum(-1), atol=TOL, rtol=0
        )
    qi = torch.arange(150, device=DEVICE)[:, None]
    ki = torch.arange(150, device=DEVICE)[None, :]
    in_band = (ki < band[0]) | ((qi - ki < band[1]) & (ki <= qi))
    torch.testing.assert_close(st.band[1], (A * in_band).sum(-1), atol=TOL, rtol=0)
    # the output: weights rounded to the value dtype, as flash does
    want = A @ v.double().repeat_interleave(3, 1)
    torch.testing.assert_close(
        out.double(), want, atol=TOL if dtype == torch.float32 else 4e-3, rtol=0
    )
    assert out.dtype == dtype and out.shape == (2, 6, 150, 12)
    assert torch.equal(st.argmax[0][:, [20, 77, 149]], A[0][:, [20, 77, 149]].argmax(-1))


def test_the_triton_route_scans_a_tiny_model_like_the_blocked_engine():
    """The engine with the Triton statistics plugged in, on a tiny Llama (grouped-query attention,
    padded batches): every text and repeat metric equal to the blocked engine."""
    import headscope
    from tests.oracles import conformance as conf

    family = next(f for f in conf.FAMILIES if f.model_type == "llama")
    hf, tok = conf.tiny_model(family)
    model = headscope.load_model(hf.to(DEVICE), tok, name="tiny-llama")
    engine = flex.FlexEngine(stats=ts.triton_layer_stats)
    for probe in conf.probes_for(model):
        metrics = [mt for mt in REGISTRY.values() if mt.probe == probe.name]
        batches = headscope.engines.extract.plan_batches(probe, 3)
        want = score_probe(model, probe, metrics, batch_size=3, engine="blocked")
        sums = headscope.engines.extract.Sums(model, probe, metrics)
        for index in batches:
            sums.add(headscope.engines.extract.score_batch(model, probe, metrics, index, engine))
        got = sums.result()
        for name in want:
            torch.testing.assert_close(
                got[name].score, want[name].score, atol=TOL, rtol=0, equal_nan=True
            )
