"""Patching figures are drawn from the tables alone: layer x head heatmaps (KV heads for group-mode
k/v), the per-position grid labelled with tokens, the DLA heatmap, and every file of a run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headscope.report.patching import (
    dla_heatmap,
    effect_heatmap,
    figure_name,
    figure_slices,
    position_grid,
    save_patch_figures,
)

LAYERS, HEADS, KV = 3, 4, 2


def _rows(activation, position, direction, estimator, kv_mode="head", units=HEADS, value=None):
    rng = np.random.default_rng(len(activation) + len(position))
    out = []
    for layer in range(LAYERS):
        for u in range(units):
            e = value(layer, u) if value is not None else float(rng.uniform(-0.3, 1.2))
            kv = kv_mode == "group"
            out.append(
                {
                    "task": "t",
                    "activation": activation,
                    "position": position,
                    "direction": direction,
                    "layer": layer,
                    "head": u,
                    "head_name": f"L{layer}{'KV' if kv else 'H'}{u}",
                    "effect": e,
                    "ci_low": e - 0.1,
                    "ci_high": e + 0.1,
                    "estimator": estimator,
                    "kv_mode": kv_mode,
                    "query_heads": str(u),
                    "delta": e,
                    "delta_ci_low": e - 0.1,
                    "delta_ci_high": e + 0.1,
                    "m_patched": e,
                    "n_pairs": 5,
                }
            )
    return out


@pytest.fixture(scope="module")
def table():
    rows = (
        _rows(
            "z", "all", "denoising", "exact", value=lambda la, h: 0.9 if (la, h) == (2, 1) else 0.01
        )
        + _rows("z", "all", "denoising", "attribution")
        + _rows("v", "END", "noising", "exact", "group", KV)
        + _rows("v", "END", "noising", "exact", "head")
    )
    for p in range(4):
        rows += _rows(
            "z",
            str(p),
            "denoising",
            "exact",
            value=lambda la, h, p=p: 0.5 if (la, h, p) == (1, 2, 3) else 0.0,
        )
    return pd.DataFrame(rows)


def test_a_heatmap_per_slice_with_its_estimator(table):
    fig = effect_heatmap(table, "z", "all", "denoising")
    ax = fig.axes[0]
    assert "exact" in ax.get_title() and "n = 5 pairs" in ax.get_title()
    img = ax.get_images()[0].get_array()
    assert img.shape == (LAYERS, HEADS) and img[2, 1] == pytest.approx(
        0.9
    )  # layer 0 at the top: row = layer
    # only strong cells are written (each value once as text, once more as its halo's stroke)
    assert [t.get_text() for t in ax.texts if not t.get_path_effects()] == ["0.90"]
    est = effect_heatmap(table, "z", "all", "denoising", estimator="attribution").axes[0]
    assert "estimate (attribution)" in est.get_title()
    assert est.get_images()[0].get_array().max() <= 1.0  # clipped to the -1..1 range in colour
    assert any(
        t.get_text() == "1.19" or float(t.get_text()) > 1 for t in est.texts
    )  # the value is written
    assert "0 = carries nothing" in fig.axes[1].get_ylabel()


def test_kv_heads_have_their_own_axis_and_modes_are_not_mixed(table):
    fig = effect_heatmap(table, "v", "END", "noising", kv_mode="group")
    assert "KV head" in fig.axes[0].get_xlabel() and fig.axes[0].get_images()[
        0
    ].get_array().shape == (LAYERS, KV)
    assert "kv_mode=group" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="kv_mode"):
        effect_heatmap(table, "v", "END", "noising")
    with pytest.raises(ValueError, match="No rows"):
        effect_heatmap(table, "q", "all", "denoising")


def test_position_grid_has_the_top_heads_by_position_with_their_tokens(table):
    fig = position_grid(table, "z", "denoising", tokens=["<s>", " When", " Mary", " and"], top=3)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()][0] == "L1H2"
    assert [t.get_text() for t in ax.get_xticklabels()][3] == "3\n' and'"
    assert ax.get_images()[0].get_array().shape == (3, 4)


def test_dla_heatmap_is_symmetric_around_zero():
    dla = pd.DataFrame(
        [
            {
                "task": "t",
                "prompt": "clean",
                "layer": la,
                "head": h,
                "head_name": f"L{la}H{h}",
                "dla": float(la - h),
                "ci_low": 0.0,
                "ci_high": 0.0,
                "n_pairs": 5,
            }
            for la in range(LAYERS)
            for h in range(HEADS)
        ]
    )
    im = dla_heatmap(dla).axes[0].get_images()[0]
    assert im.get_clim() == (-3.0, 3.0)


def test_every_figure_of_a_run(table, tmp_path):
    names = save_patch_figures(table, None, tmp_path, model="m", tokens=["a", "b", "c", "d"])
    assert sorted(names) == sorted(p.name for p in tmp_path.iterdir())
    assert {
        "z-all-denoising-exact.png",
        "z-all-denoising-attribution.png",
        "v-group-END-noising-exact.png",
        "v-head-END-noising-exact.png",
        "z-by-position-denoising-exact.png",
    } == set(names)
    assert len(figure_slices(table)) == 4
    assert (
        figure_name(
            {
                "activation": "q",
                "kv_mode": "head",
                "position": "S2",
                "direction": "noising",
                "estimator": "exact",
            }
        )
        == "q-S2-noising-exact.png"
    )


def test_the_report_modules_load_no_compute_module():
    import subprocess
    import sys

    code = (
        "import sys; import headscope.report.patching, headscope.report.patch_page; "
        "print('\\n'.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert [
        m
        for m in loaded
        if m.startswith(("headscope.effects", "headscope.models", "headscope.engines", "torch"))
    ] == []
