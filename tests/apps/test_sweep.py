"""Sweeps: one run directory per job, one atlas holding every job, resume, retry, failures reported;
the same jobs on a real local Ray instance; bad specs refused in one line with nothing left."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from click.testing import CliRunner

from headscope.apps import sweep as sweep_mod
from headscope.apps.sweep import read_spec, run_sweep
from headscope.cli.main import main

SCAN = """
[scan]
n_prompts = 3
repeat_len = 6
batch_size = 2
bootstrap = 0
metrics = ["induction", "duplicate_token", "sink"]
"""


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, tiny_gpt2_dir, tiny_bert_dir):
    """Two training checkpoints of one run, a broken one (weights unreadable), and a spec over
    them."""
    root = tmp_path_factory.mktemp("sweep")
    for step in ("step-0000", "step-0010"):
        shutil.copytree(tiny_gpt2_dir, root / "ckpts" / step)
    shutil.copytree(tiny_gpt2_dir, root / "broken" / "step-0020")
    for weights in (root / "broken" / "step-0020").glob("*.safetensors"):
        weights.write_bytes(b"not weights")
    good = root / "good.toml"
    good.write_text(
        f'seeds = [0, 1]\nmodels = ["{tiny_bert_dir}"]\n'
        '[[checkpoints]]\nmodel = "tiny-run"\nglob = "ckpts/step-*"\n' + SCAN
    )
    bad = root / "with_broken.toml"
    bad.write_text(
        '[[checkpoints]]\nmodel = "tiny-run"\nfolders = ["ckpts/step-0000", '
        '"ckpts/step-0010", '
        '"broken/step-0020"]\n' + SCAN
    )
    return root


def test_spec_makes_every_job(ckpts):
    jobs = read_spec(ckpts / "good.toml")
    assert len(jobs) == 6  # (bert + 2 checkpoints) x 2 seeds
    steps = sorted({(j.model, j.step) for j in jobs if j.step is not None})
    assert steps == [("tiny-run", 0), ("tiny-run", 10)]
    assert len({j.id for j in jobs}) == 6


def test_sweep_writes_every_job_an_atlas_and_figures_and_resumes(ckpts, tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    res = run("sweep", ckpts / "good.toml", "--out", out, "--quiet")
    assert res.exit_code == 0, res.output
    assert "6 job(s): 6 done (0 already), 0 failed" in res.stdout
    atlas = pd.read_csv(out / "atlas.csv")
    assert set(atlas["status"]) == {"done"} and atlas["job"].nunique() == 6
    assert {"model", "checkpoint", "step", "seed", "source", "metric", "head_name", "score"} <= set(
        atlas.columns
    )
    assert sorted(atlas["step"].dropna().unique()) == [0, 10]
    assert pd.read_parquet(out / "atlas.parquet").shape == atlas.shape
    assert (out / "steps.png").stat().st_size > 0 and (out / "models.png").stat().st_size > 0
    one = atlas[atlas["job"] == atlas["job"].iloc[0]]
    run_dir = out / "runs" / one["job"].iloc[0]
    assert len(one) == len(pd.read_csv(run_dir / "scores.csv"))
    stamp = (run_dir / "metadata.json").stat().st_mtime_ns

    def never(*_a):
        raise AssertionError("a finished job ran again")

    monkeypatch.setattr(sweep_mod, "run_job", never)
    res = run("sweep", ckpts / "good.toml", "--out", out, "--quiet")
    assert res.exit_code == 0 and "6 done (6 already)" in res.stdout, res.output
    assert (run_dir / "metadata.json").stat().st_mtime_ns == stamp

    # the spec changed under a finished sweep: its old runs are never passed off as the new scans
    record = (out / "sweep.json").read_text()
    changed = ckpts / "changed.toml"
    changed.write_text(
        (ckpts / "good.toml").read_text().replace("repeat_len = 6", "repeat_len = 7")
    )
    res = run("sweep", changed, "--out", out, "--quiet")
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "was run with other settings (repeat_len 6 -> 7)" in lines[0] and "new --out" in lines[0]
    assert (out / "sweep.json").read_text() == record
    assert (run_dir / "metadata.json").stat().st_mtime_ns == stamp

    # a smaller spec reuses what it names; the jobs it leaves out stay reusable for a later spec
    fewer = ckpts / "fewer.toml"
    fewer.write_text((ckpts / "good.toml").read_text().split("[[checkpoints]]")[0] + SCAN)
    res = run("sweep", fewer, "--out", out, "--quiet")
    assert res.exit_code == 0 and "2 job(s): 2 done (2 already)" in res.stdout, res.output
    res = run("sweep", ckpts / "good.toml", "--out", out, "--quiet")
    assert res.exit_code == 0 and "6 done (6 already)" in res.stdout, res.output


def test_a_failed_job_is_retried_then_reported_never_dropped(ckpts, tmp_path, monkeypatch):
    calls = []
    real = sweep_mod.run_job

    def flaky(job, out_dir):  # step 0 fails once, then works
        calls.append(job.id)
        if job.step == 0 and calls.count(job.id) == 1:
            raise RuntimeError("transient")
        return real(job, out_dir)

    monkeypatch.setattr(sweep_mod, "run_job", flaky)
    done = run_sweep(ckpts / "with_broken.toml", tmp_path / "s")
    broken = [j for j in calls if "0020" in j]
    assert len(broken) == 2  # tried, retried
    assert list(done["failures"]) == broken[:1] and done["failures"][broken[0]]["attempts"] == 2
    atlas = done["atlas"]
    assert atlas["job"].nunique() == 3
    failed = atlas[atlas["status"] == "failed"]
    assert len(failed) == 1 and failed["step"].iloc[0] == 20 and failed["error"].iloc[0]
    assert (atlas[atlas["step"] == 0]["status"] == "done").all()  # retried and finished


def test_sweep_on_ray_matches_in_process_and_reports_failures(ray_session, ckpts, tmp_path):
    here, there = tmp_path / "here", tmp_path / "ray"
    run_sweep(ckpts / "with_broken.toml", here)
    res = run(
        "sweep", ckpts / "with_broken.toml", "--out", there, "--ray", "--workers", "2", "--quiet"
    )
    assert res.exit_code == 1, res.output
    assert "2 done (0 already), 1 failed" in res.stdout
    assert res.stderr.count("failed after 2 attempt(s)") == 1 and "0020" in res.stderr
    for job in ("tiny-run--step-0000--s0--seed0", "tiny-run--step-0010--s0--seed0"):
        assert (there / "runs" / job / "scores.csv").read_bytes() == (
            here / "runs" / job / "scores.csv"
        ).read_bytes()
    res = run(
        "sweep", ckpts / "with_broken.toml", "--out", there, "--ray", "--workers", "2", "--quiet"
    )
    assert res.exit_code == 1 and "2 done (2 already), 1 failed" in res.stdout


def test_bad_sweep_input_exits_2_with_one_line_and_nothing_left(ckpts, tmp_path):
    (tmp_path / "not_ckpt").mkdir()
    specs = {
        "malformed.toml": ("models = [", "not valid TOML"),
        "unknown.toml": ('modles = ["x"]', "unknown key 'modles'"),
        "empty.toml": ("seeds = [0]", "no models"),
        "notckpt.toml": (
            '[[checkpoints]]\nmodel = "m"\nfolders = ["not_ckpt"]',
            "has no config.json",
        ),
        "badscan.toml": (
            'models = ["smollm2-135m"]\n[scan]\nn_prompts = 0',
            "n_prompts (--n-prompts) must be at least 1",
        ),
    }
    out = tmp_path / "out"
    for name, (text, message) in specs.items():
        (tmp_path / name).write_text(text)
        res = run("sweep", tmp_path / name, "--out", out)
        assert res.exit_code == 2 and res.stderr.count("\n") == 1 and message in res.stderr, (
            name,
            res.output,
        )
        assert not out.exists()
    for extra, message in [
        (["--ray", "--workers", "0"], "must be at least 1"),
        (["--ray", "127.0.0.1:1"], "Cannot reach a Ray head"),
    ]:
        res = run("sweep", ckpts / "good.toml", "--out", out, *extra)
        assert res.exit_code == 2 and res.stderr.count("\n") == 1 and message in res.stderr, (
            res.output
        )
        assert not out.exists()
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "chapter1.tex").write_text("x")
    res = run("sweep", ckpts / "good.toml", "--out", tmp_path / "thesis")
    assert res.exit_code == 2 and "not a headscope sweep" in res.stderr


def test_hub_revisions_and_several_probe_settings(tmp_path):
    """Checkpoints named by hub revision (a local hub cache, offline: refs/step10 holds 2 layers,
    refs/step20 3) x two [[settings]]: every job in the atlas with its step and setting, the right
    snapshot behind each revision, and one pair of figures per setting."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.tiny_models import install_in_hub_cache, make_tiny_gpt2

    hf_home = tmp_path / "hf"
    install_in_hub_cache(
        make_tiny_gpt2(tmp_path / "a"),
        hf_home,
        repo_ids=("tiny-org/run",),
        commit="a" * 40,
        ref="step10",
    )
    install_in_hub_cache(
        make_tiny_gpt2(tmp_path / "b", n_layer=3),
        hf_home,
        repo_ids=("tiny-org/run",),
        commit="b" * 40,
        ref="step20",
    )
    spec = tmp_path / "revs.toml"
    spec.write_text(
        '[[checkpoints]]\nmodel = "tiny-org/run"\nrevisions = ["step10", "step20"]\n'
        + SCAN
        + "[[settings]]\nrepeat_len = 6\n[[settings]]\nrepeat_len = 8\n"
    )
    out = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_CACHE"}
    env.update(
        HF_HOME=str(hf_home),
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "headscope", "sweep", str(spec), "--out", str(out), "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "4 job(s): 4 done (0 already), 0 failed" in proc.stdout
    atlas = pd.read_csv(out / "atlas.csv")
    jobs = atlas.groupby("job").agg(
        step=("step", "first"), setting=("setting", "first"), layers=("layer", "max")
    )
    assert sorted(zip(jobs["step"], jobs["setting"], jobs["layers"], strict=True)) == [
        (10, 0, 1),
        (10, 1, 1),
        (20, 0, 2),
        (20, 1, 2),
    ]
    induction = atlas[atlas["metric"] == "induction"]
    # R of 6, then 8 tokens
    assert induction.groupby("setting")["n"].max().to_dict() == {0: 3 * 6, 1: 3 * 8}
    for job in jobs.index:
        meta = json.loads((out / "runs" / job / "metadata.json").read_text())
        assert meta["source"]["revision"] in ("step10", "step20")
    # one model: no models.png
    assert {p.name for p in out.glob("*.png")} == {"steps.png", "steps-s1.png"}


def test_the_shipped_example_spec_reads_as_written():
    """examples/sweep.toml (what the README and `headscope sweep --help` point to) names only the
    offline models and settings that exist: 2 models x 2 settings x 2 seeds."""
    from pathlib import Path

    spec = Path(__file__).resolve().parents[2] / "examples" / "sweep.toml"
    jobs = sweep_mod.read_spec(spec)
    assert len(jobs) == 8 and {j.model for j in jobs} == {"smollm2-135m", "all-minilm-l6-v2"}
    assert {j.scan_config().repeat_len for j in jobs} == {20, 40}
