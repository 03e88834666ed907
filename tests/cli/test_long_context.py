"""Long-context heads: the prose corpus, the long and needle probes, streaming and retrieval on every
engine, and the KV plan's restricted runs (kernel against masks), memory counting and CLI refusals.

The long prose corpus downloads once from PyPI (``brotli==1.2.1`` sdist, 7.4 MB) into the cache.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import headscope
from headscope.cli.main import main
from headscope.apps import conformance as conf

LONG = ["sink", "streaming", "retrieval", "retrieval_soft"]


@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama with grouped-query attention (4 query heads, 2 KV heads), 256 positions."""
    fam = next(f for f in conf.FAMILIES if f.model_type == "llama")
    hf, tok = conf.tiny_model(fam)
    return headscope.load_model(hf, tok, name="tiny-llama")

# ------------------------------------------------------------------------------ the KV plan



def test_scan_cli_long_context_refusals(tmp_path):
    runner = CliRunner()
    out = tmp_path / "x"
    for args, msg in [(["--long-context", "--seq-len", "64", "--window", "64"], "keep every key"),
                      (["--sinks", "2"], "add --long-context"),
                      (["--long-context", "--needle-tokens", "0"], "needle_tokens")]:
        r = runner.invoke(main, ["scan", "smollm2-135m", "--out", str(out), *args])
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and msg in lines[0], (args, r.output)
        assert not out.exists()
