"""``--device-map`` / ``load_model(device_map=...)``: a model bigger than one device, placed by
accelerate.

This machine has no GPU, so a split across GPUs cannot be made here. What can be forced on a CPU is
the same mechanism at its hardest: ``max_memory`` so small that accelerate keeps the embeddings and
the first block on the CPU and offloads the rest to disk, its hooks bringing each offloaded block's
weights in for every forward (their parameters stay on the meta device). The scores must be the
unsplit model's. Cross-GPU placement itself (layers on cuda:0 and cuda:1, the blocked engine moving
each layer's query/key to the metrics' device) is not exercised here.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

import headscope
from headscope.cli.main import main
from headscope.errors import HeadscopeError
from headscope.models.loading import parse_max_memory
from tests.tiny_models import make_tiny_gpt2

pytest.importorskip("accelerate")
# bytes: embeddings + block 0 stay on the CPU, blocks 1-3 and ln_f go to disk
SPLIT = {"cpu": 200_000}


@pytest.fixture(scope="module")
def four_layer_dir(tmp_path_factory):
    return make_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2-4l"), n_layer=4)


@pytest.fixture(scope="module")
def split(four_layer_dir, tmp_path_factory):
    return headscope.load_model(
        str(four_layer_dir),
        device_map="auto",
        max_memory=SPLIT,
        offload_folder=tmp_path_factory.mktemp("offload"),
    )


def _scores(model, engine):
    probes = headscope.default_probes(model, n_prompts=4, repeat_len=8)
    return headscope.scan(
        model, probes, bootstrap=0, examples=False, engine=engine, batch_size=2
    ).scores


def test_the_model_really_is_split_and_offloaded(split):
    placed = set(split.device_map.values())
    assert placed == {"cpu", "disk"}, split.device_map
    assert (
        split.device_map["transformer.h.0"] == "cpu"
        and split.device_map["transformer.h.3"] == "disk"
    )
    offloaded = [n for n, p in split.hf.named_parameters() if p.device.type == "meta"]
    assert any(n.startswith("transformer.h.3.") for n in offloaded)
    assert split.device == torch.device("cpu")
    assert split.n_params == headscope.load_model(str(split.source.ref)).n_params


@pytest.mark.parametrize("engine", ["blocked", "fused", "flex"])
def test_scores_equal_the_unsplit_models(four_layer_dir, split, engine):
    """A model split by accelerate (blocks 1-3 offloaded to disk) scores as the whole model does, on
    every engine that reads the attention call (flex: the CUDA engine's statistics, eager here)."""
    if engine == "flex":
        from headscope.engines.flex_stats import flex_reason

        if flex_reason():
            pytest.skip(flex_reason())
    if engine == "fused":
        from headscope.engines import kernel

        if not kernel.available():
            pytest.skip(kernel.unavailable_reason())
    whole = _scores(headscope.load_model(str(four_layer_dir)), engine)
    parts = _scores(split, engine)
    assert len(whole) == len(parts) > 0
    pd.testing.assert_frame_equal(whole.drop(columns="score"), parts.drop(columns="score"))
    assert (whole["score"] - parts["score"]).abs().max() <= 1e-6


def test_the_offload_folder_headscope_made_goes_with_the_model(
    four_layer_dir, tmp_path, monkeypatch
):
    import gc
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes its folders
    model = headscope.load_model(str(four_layer_dir), device_map="auto", max_memory=SPLIT)
    made = list(tmp_path.glob("headscope-offload-*"))
    # (safetensors weights are read in place, so it may stay empty)
    assert len(made) == 1 and made[0].is_dir()
    assert set(model.device_map.values()) == {"cpu", "disk"}
    del model
    gc.collect()
    assert not made[0].exists()


def test_an_offload_folder_the_caller_gave_is_never_removed(four_layer_dir, tmp_path):
    import gc

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    model = headscope.load_model(
        str(four_layer_dir), device_map="auto", max_memory=SPLIT, offload_folder=mine
    )
    assert set(model.device_map.values()) == {"cpu", "disk"}
    del model
    gc.collect()
    assert (mine / "notes.txt").read_text() == "keep me"


def test_the_hooks_engine_is_refused_in_one_line(split):
    with pytest.raises(
        HeadscopeError,
        match="hooks engine cannot run here: a --device-map model "
        "has no "
        "transformer-lens bridge.*use --engine",
    ):
        headscope.scan(
            split, headscope.default_probes(split, n_prompts=2, repeat_len=4), engine="hooks"
        )


def test_bad_maps_are_refused_before_loading(four_layer_dir):
    with pytest.raises(HeadscopeError, match="Unknown device map 'everywhere'"):
        headscope.load_model(str(four_layer_dir), device_map="everywhere")
    with pytest.raises(HeadscopeError, match="both place the model"):
        headscope.load_model(str(four_layer_dir), device="cpu", device_map="auto")
    with pytest.raises(HeadscopeError, match="goes with a device map"):
        headscope.load_model(str(four_layer_dir), max_memory={"cpu": 10})
    assert parse_max_memory("0=1.5GiB, cpu=200KB") == {0: 1610612736, "cpu": 200_000}
    for bad in ("cpu", "cpu=lots", "gpu0=1GB", "=1GB"):
        with pytest.raises(HeadscopeError, match="--max-memory"):
            parse_max_memory(bad)


FAST = [
    "--n-prompts",
    "2",
    "--repeat-len",
    "6",
    "--bootstrap",
    "0",
    "--no-figures",
    "--quiet",
    "--batch-size",
    "2",
]


def test_cli_device_map_scan_matches_the_plain_scan(tmp_path, four_layer_dir):
    plain, mapped = tmp_path / "plain", tmp_path / "mapped"
    res = CliRunner().invoke(main, ["scan", str(four_layer_dir), "--out", str(plain), *FAST])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(
        main,
        [
            "scan",
            str(four_layer_dir),
            "--out",
            str(mapped),
            *FAST,
            "--device-map",
            "auto",
            "--max-memory",
            "cpu=200KB",
        ],
    )
    assert res.exit_code == 0, res.output
    a, b = pd.read_csv(plain / "scores.csv"), pd.read_csv(mapped / "scores.csv")
    assert (a["score"] - b["score"]).abs().max() <= 1e-6
    import json

    meta = json.loads((mapped / "metadata.json").read_text())
    assert set(meta["device_map"].values()) == {"cpu", "disk"}


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--device-map", "everywhere"], "Unknown device map 'everywhere'; use auto, balanced"),
        (["--device-map", "auto", "--max-memory", "cpu:1GB"], "is not DEVICE=SIZE"),
        (["--max-memory", "cpu=1GB"], "goes with a device map"),
        (["--device-map", "auto", "--ray"], "--device-map with --ray is not supported"),
        (["--device-map", "auto", "--effects"], "--effects with --device-map is not supported"),
    ],
)
def test_cli_bad_device_maps_exit_2_with_one_line(tmp_path, four_layer_dir, args, expect):
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main, ["scan", str(four_layer_dir), "--out", str(out), "--quiet", *args]
    )
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headscope: error:") and expect in lines[0], (
        res.stderr
    )
    assert not out.exists()
