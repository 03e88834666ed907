"""Sharded scans on a real local Ray instance: the plain scan's files, bit for bit; a killed actor
retried with the same result; every bad --ray/--workers input refused in one line, nothing left."""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import headscope
from headscope.cli.main import main
from headscope.engines.extract import score_probe
from headscope.errors import HeadscopeError
from headscope.metrics import REGISTRY
from headscope.scale.ray_scan import RayPool, check_address, require_ray
from headscope.scale.shard import ShardedScorer
from tests.scale.test_shard import assert_identical

FAST = ["--n-prompts", "6", "--repeat-len", "8", "--batch-size", "2", "--quiet", "--no-figures"]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_sharded_scan_writes_the_plain_scans_files(ray_session, tmp_path, tiny_gpt2_dir):
    plain, sharded = tmp_path / "plain", tmp_path / "sharded"
    assert run("scan", tiny_gpt2_dir, "--out", plain, *FAST).exit_code == 0
    res = run("scan", tiny_gpt2_dir, "--out", sharded, *FAST, "--ray", "--workers", "2")
    assert res.exit_code == 0, res.output
    for name in ("scores.csv", "tokens.jsonl", "controls.jsonl"):
        assert (sharded / name).read_bytes() == (plain / name).read_bytes(), name
    a, b = np.load(plain / "per_sequence.npz"), np.load(sharded / "per_sequence.npz")
    assert sorted(a.files) == sorted(b.files)
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
    meta = headscope.load_run(sharded).metadata
    assert meta["ray"] == {"address": "local", "workers": 2}


def test_a_killed_actor_is_retried_and_the_result_is_unchanged(
    ray_session, tiny_gpt2_dir, tiny_gpt2
):
    metrics = list(REGISTRY.values())
    probe = headscope.repeat_probe(tiny_gpt2, repeat_len=8, n_sequences=8)
    want = score_probe(tiny_gpt2, probe, metrics, batch_size=1)
    pool = RayPool(str(tiny_gpt2_dir), workers=2)
    try:
        before = pool.pids()
        killed = []

        def kill_once(_n):  # after the first batch, while the others are in flight
            if not killed:
                os.kill(before[0], signal.SIGKILL)
                killed.append(before[0])

        got = ShardedScorer(pool.run_batches)(
            tiny_gpt2, probe, metrics, batch_size=1, on_batch=kill_once
        )
        after = pool.pids()
    finally:
        pool.close()
    assert killed and after[0] != before[0] and after[1] == before[1]  # actor 0 was restarted
    assert_identical(got, want)


def test_bad_ray_options_exit_2_with_one_line_and_nothing_left(tmp_path, tiny_gpt2_dir):
    out = tmp_path / "out"
    cases = [
        (["--ray", "--workers", "0"], "workers (--workers) must be at least 1, got 0"),
        (["--workers", "2"], "--workers goes with --ray"),
        (["--ray", "127.0.0.1:1"], "Cannot reach a Ray head at 127.0.0.1:1"),
        (["--ray", "nowhere"], "must look like HOST:PORT"),
        (["--ray", "--effects"], "--effects runs in one process"),
    ]
    for extra, message in cases:
        res = run("scan", tiny_gpt2_dir, "--out", out, *FAST, *extra)
        assert res.exit_code == 2, (extra, res.output)
        assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
        assert not out.exists() and not list(tmp_path.iterdir())


def test_without_ray_installed_one_line_says_how(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(HeadscopeError, match=r'pip install -e "\.\[ray\]"'):
        require_ray()
    check_address(None)  # nothing to check for a local instance
