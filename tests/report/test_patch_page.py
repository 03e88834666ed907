"""report.html of a patching run: self-contained, drawn from the tables alone; the baseline and the
top heads with their intervals; the other estimator beside; a scan's pattern scores beside
effects."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from headscope.files import HTML_GENERATOR, is_ours
from headscope.report.patch_page import patch_page_html
from tests.report.test_patching import _rows

META = {
    "model": "tiny",
    "task": "ioi",
    "n_pairs": 5,
    "metric": "logit_diff",
    "n_layers": 3,
    "n_heads": 4,
    "n_kv_heads": 2,
    "source": {"kind": "package", "weights_sha256": "ab" * 32},
    "task_provenance": {"source": "kit", "kit": "ioi", "seed": 0},
    "seed": 0,
    "timings": {"exact_s": 1.5},
    "versions": {"headscope": "0.1.0"},
}


@pytest.fixture(scope="module")
def tables():
    table = pd.DataFrame(
        _rows(
            "z",
            "END",
            "denoising",
            "exact",
            value=lambda la, h: 0.8 if (la, h) == (2, 3) else 0.02 * h,
        )
        + _rows(
            "z",
            "END",
            "denoising",
            "attribution",
            value=lambda la, h: 0.6 if (la, h) == (2, 3) else 0.0,
        )
        + _rows("k", "all", "noising", "exact", "group", 2)
    )
    baseline = pd.DataFrame(
        [
            {
                "task": "ioi",
                "prompt": "clean",
                "metric": "logit_diff",
                "mean": 5.25,
                "ci_low": 4.5,
                "ci_high": 6.0,
                "share_correct": 1.0,
                "n_pairs": 5,
            },
            {
                "task": "ioi",
                "prompt": "corrupt",
                "metric": "logit_diff",
                "mean": 0.125,
                "ci_low": -0.5,
                "ci_high": 0.75,
                "share_correct": 0.6,
                "n_pairs": 5,
            },
            {
                "task": "ioi",
                "prompt": "clean - corrupt",
                "metric": "logit_diff",
                "mean": 5.125,
                "ci_low": 4.0,
                "ci_high": 6.25,
                "share_correct": float("nan"),
                "n_pairs": 5,
            },
        ]
    )
    dla = pd.DataFrame(
        [
            {
                "task": "ioi",
                "prompt": p,
                "layer": la,
                "head": h,
                "head_name": f"L{la}H{h}",
                "dla": 2.5 if (la, h) == (2, 3) else 0.0,
                "ci_low": 2.0,
                "ci_high": 3.0,
                "n_pairs": 5,
            }
            for p in ("clean", "corrupt")
            for la in range(3)
            for h in range(4)
        ]
    )
    pattern = pd.DataFrame(
        [
            {
                "metric": m,
                "layer": la,
                "head": h,
                "head_name": f"L{la}H{h}",
                "score": 0.875 if (m, la, h) == ("induction", 2, 3) else 0.0,
            }
            for m in ("induction", "sink")
            for la in range(3)
            for h in range(4)
        ]
    )
    return table, baseline, dla, pattern


def _cells(page: str, head: str) -> list[str]:
    """The cells of the first table row that starts with ``head``."""
    row = re.search(rf"<tr><td>{head}</td>(.*?)</tr>", page).group(1)
    return re.findall(r"<td[^>]*>(.*?)</td>", row)


def test_the_baseline_and_top_heads_with_intervals(tables):
    table, baseline, dla, _ = tables
    page = patch_page_html(table, baseline, dla, META, figures=False)
    assert (
        HTML_GENERATOR in page
        and "[4.500, 6.000]" in page
        and "5.250" in page
        and "[4.000, 6.250]" in page
    )
    cells = _cells(
        page, "L2H3"
    )  # the top z head: exact effect, interval, change, interval, attribution beside
    assert cells[:2] == ["0.800", "[0.700, 0.900]"] and cells[4:6] == ["0.600", "[0.500, 0.700]"]
    assert cells[6] == "2.500"  # its DLA
    assert "L0KV1" in page and "kv_mode group" in page
    assert "ab" * 32 in page and "kit: ioi" in page
    assert "This page was built without figures" in page


def test_pattern_scores_beside_each_heads_effect(tables, tmp_path):
    table, baseline, dla, pattern = tables
    page = patch_page_html(table, baseline, dla, META, pattern, figures=True)
    assert "<th>induction</th>" in page and "<th>sink</th>" in page
    cells = _cells(page, "L2H3")
    assert cells[-2:] == ["0.875", "0.000"]
    assert page.count("data:image/png;base64,") == 3  # z at END, k at all, the DLA heatmap
    assert not re.search(
        r'(src|href)="(?!data:|#)', page
    )  # nothing fetched: only data URIs and anchors
    path = tmp_path / "report.html"
    path.write_text(page)
    assert is_ours(path)
