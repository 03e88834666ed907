"""Model names: offline packages, aliases, hub repo ids, local folders, and the real hub path
exercised through a local Hugging Face cache (HF_HOME in a temp dir, HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from headscope.errors import HeadscopeError
from headscope.sources import PACKAGED, cached_snapshot, resolve
from tests.tiny_models import install_in_hub_cache

REPO = Path(__file__).resolve().parents[1]


def test_offline_and_alias_names_resolve():
    assert resolve("smollm2-135m").kind == "package"
    assert resolve("ALL-MINILM-L6-V2").packaged is PACKAGED["all-minilm-l6-v2"]
    src = resolve("gpt2-small")
    assert (src.kind, src.ref) == ("hub", "gpt2")
    assert resolve("pythia-70m").ref == "EleutherAI/pythia-70m"
    assert resolve("someorg/some-model").ref == "someorg/some-model"


def test_unknown_name_gets_did_you_mean():
    with pytest.raises(HeadscopeError, match="Did you mean: smollm2-135m") as exc:
        resolve("smolm2-135m")
    assert "\n" not in str(exc.value)
    with pytest.raises(HeadscopeError, match="gpt2-small"):
        resolve("gpt2-smal")


def test_local_folder(tmp_path):
    with pytest.raises(HeadscopeError, match="no config.json"):
        resolve(str(tmp_path))
    with pytest.raises(HeadscopeError, match="No such model folder"):
        resolve(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text("{}")
    assert resolve(str(tmp_path)).kind == "local"


def test_cached_snapshot_reads_the_hub_layout(tmp_path, monkeypatch, tiny_gpt2_dir):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert cached_snapshot("gpt2") is None
    install_in_hub_cache(tiny_gpt2_dir, tmp_path)
    assert (cached_snapshot("gpt2") / "config.json").is_file()
    assert cached_snapshot("openai-community/gpt2") is not None


def _cli(args, hf_home: Path, cwd: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "headscope", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_gpt2_small_scans_from_a_local_hub_cache(tmp_path, tiny_gpt2_dir):
    """The code path a user with internet takes, minus the download: `headscope scan gpt2-small`."""
    hf_home = tmp_path / "hf"
    install_in_hub_cache(tiny_gpt2_dir, hf_home)
    out = tmp_path / "run"
    proc = _cli(["scan", "gpt2-small", "--out", str(out), "--n-prompts", "4", "--repeat-len", "8",
                 "--quiet", "--no-figures"], hf_home, tmp_path)
    assert proc.returncode == 0, proc.stderr
    scores = pd.read_csv(out / "scores.csv")
    assert set(scores["model"]) == {"gpt2-small"}
    assert len(scores) == 8 * 2 * 4  # metrics x layers x heads of the tiny GPT-2
    import json

    meta = json.loads((out / "metadata.json").read_text())
    assert meta["source"]["source"] == "hf:gpt2" and meta["source"]["cached"] is True
    assert len(meta["source"]["weights_sha256"]) == 64


def test_gpt2_small_without_cache_or_network_is_one_sentence(tmp_path):
    proc = _cli(["scan", "gpt2-small", "--out", str(tmp_path / "run")], tmp_path / "empty", tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "not in the local Hugging Face cache" in lines[0]
    assert "smollm2-135m" in lines[0] and "all-minilm-l6-v2" in lines[0]
    assert not (tmp_path / "run").exists()


def test_revisions_resolve_and_refuse_what_has_none(tmp_path):
    src = resolve("pythia-70m@step1000")
    assert (src.kind, src.ref, src.revision) == ("hub", "EleutherAI/pythia-70m", "step1000")
    assert src.describe() == "hf:EleutherAI/pythia-70m@step1000"
    assert resolve("org/model@v1.0").revision == "v1.0"
    with pytest.raises(HeadscopeError, match="offline model, which has no revisions; drop '@v2'"):
        resolve("smollm2-135m@v2")
    with pytest.raises(HeadscopeError, match="is not NAME@REVISION"):
        resolve("gpt2@")
    with pytest.raises(HeadscopeError, match="Did you mean: gpt2-small"):
        resolve("gpt2-smal@main")
    folder = tmp_path / "ckpt@step5"  # a folder whose name has an '@' is a folder
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert resolve(str(folder)).kind == "local"


def test_a_training_checkpoint_by_revision_from_the_hub_cache(tmp_path):
    """`gpt2-small@step1000`: a branch of the hub cache (refs/step1000) holding a 3-layer checkpoint
    beside main's 2 layers; the scan, its metadata and its default --out say which one ran."""
    from tests.tiny_models import make_tiny_gpt2

    hf_home = tmp_path / "hf"
    install_in_hub_cache(make_tiny_gpt2(tmp_path / "main"), hf_home, commit="a" * 40)
    install_in_hub_cache(make_tiny_gpt2(tmp_path / "step", n_layer=3), hf_home, commit="b" * 40, ref="step1000")
    proc = _cli(["scan", "gpt2-small@step1000", "--n-prompts", "2", "--repeat-len", "4", "--quiet", "--no-figures",
                 "--metrics", "induction"], hf_home, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "runs" / "gpt2-small-step1000"
    assert pd.read_csv(out / "scores.csv")["layer"].max() == 2  # three layers: the step1000 checkpoint
    import json

    meta = json.loads((out / "metadata.json").read_text())
    assert meta["source"]["revision"] == "step1000" and meta["source"]["snapshot"] == "b" * 40
    proc = _cli(["scan", "gpt2-small@nope", "--out", str(tmp_path / "x")], hf_home, tmp_path)
    assert proc.returncode == 2 and "at revision 'nope'" in proc.stderr and not (tmp_path / "x").exists()
