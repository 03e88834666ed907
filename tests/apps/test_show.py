"""One head's pattern on one text: extraction, figure, offline HTML, head parsing."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from headscope.apps.show import default_out_path, head_pattern, parse_head, write_views
from headscope.errors import HeadscopeError
from headscope.report.figures import pattern_figure
from headscope.report.pattern_page import pattern_html
from headscope.result import HeadPattern, display_token, model_slug

TEXT = "The river bank flooded after the storm."


def reference_pattern(model, ids: list[int], layer: int) -> np.ndarray:
    """The layer's full ``[head, query, key]`` pattern straight from ``run_patterns``."""
    kept = {}

    def grab(_layer, pattern):  # [1, head, query, key]
        kept["p"] = pattern[0].float().cpu().numpy().copy()

    tokens = torch.tensor([ids])
    model.run_patterns(tokens, torch.ones_like(tokens, dtype=torch.bool), grab, layers=[layer])
    return kept["p"]


def html_data(page: str) -> dict:
    blob = re.search(
        r'<script type="application/json" id="hs-data">(.*?)</script>', page, re.S
    ).group(1)
    return json.loads(blob)


# ------------------------------------------------------------------------------ parsing and names


def test_parse_head_forms():
    assert parse_head("3.2", 30, 9) == (3, 2)
    assert parse_head("L3H2", 30, 9) == (3, 2)
    assert parse_head(" l29h8 ", 30, 9) == (29, 8)
    assert parse_head("0.0") == (0, 0)  # form only, no range known yet


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("3-2", "Head '3-2' is not LAYER.HEAD; write it like 3.2 (layers 0..29, heads 0..8)."),
        ("three", "Head 'three' is not LAYER.HEAD; write it like 0.0 (layers 0..29, heads 0..8)."),
        (
            "30.1",
            "Head '30.1' is out of range: the model has layers 0..29, heads 0..8; nearest valid: "
            "29.1.",
        ),
        (
            "3.9",
            "Head '3.9' is out of range: the model has layers 0..29, heads 0..8; nearest valid: "
            "3.8.",
        ),
        ("-1.2", "Head '-1.2' is not LAYER.HEAD; write it like 1.2 (layers 0..29, heads 0..8)."),
    ],
)
def test_parse_head_errors_name_the_valid_range(spec, expected):
    with pytest.raises(HeadscopeError) as exc:
        parse_head(spec, 30, 9)
    assert str(exc.value) == expected


def test_parse_head_form_error_without_model():
    with pytest.raises(HeadscopeError, match=r"write it like 3\.2 \(0-based layer, then head\)"):
        parse_head("3-2")


def test_names():
    assert model_slug("HuggingFaceTB/SmolLM2-135M") == "SmolLM2-135M"
    assert str(default_out_path("smollm2-135m", 17, 4)) == "smollm2-135m-L17H4.png"
    assert display_token(" bank") == "␣bank"
    assert display_token("a\nb\t") == "a↵b\\t"
    assert display_token("") == "∅"


# ------------------------------------------------------------------------------ extraction


def test_head_pattern_is_the_run_patterns_pattern(tiny_gpt2):
    ids = tiny_gpt2.wrap(tiny_gpt2.encode(TEXT))
    hp = head_pattern(tiny_gpt2, TEXT, 1, 2)
    ref = reference_pattern(tiny_gpt2, ids, 1)  # [head, query, key]
    assert hp.token_ids == ids and hp.token_ids[0] == tiny_gpt2.bos_id
    assert hp.tokens == [display_token(s) for s in tiny_gpt2.str_tokens(ids)]
    np.testing.assert_array_equal(hp.pattern, ref[2])
    assert not np.allclose(hp.pattern, ref[1])  # really head 2, not another head
    np.testing.assert_allclose(hp.pattern.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(hp.pattern, 1) == 0)  # causal: no query sees a later key
    assert hp.causal and hp.head_name == "L1H2"


def test_head_pattern_encoder(tiny_bert):
    hp = head_pattern(tiny_bert, TEXT, 0, 3)
    ids = tiny_bert.wrap(tiny_bert.encode(TEXT))
    assert hp.token_ids == ids and hp.tokens[0] == "[CLS]" and hp.tokens[-1] == "[SEP]"
    np.testing.assert_array_equal(hp.pattern, reference_pattern(tiny_bert, ids, 0)[3])
    assert not hp.causal and np.triu(hp.pattern, 1).sum() > 0.1  # bidirectional


def test_head_pattern_bad_input(tiny_gpt2):
    with pytest.raises(HeadscopeError, match="no tokens"):
        head_pattern(tiny_gpt2, "", 0, 0)
    with pytest.raises(HeadscopeError, match=r"longer than the model's context \(128\)"):
        head_pattern(tiny_gpt2, "the river bank " * 80, 0, 0)
    with pytest.raises(HeadscopeError, match=r"layers 0\.\.1, heads 0\.\.3; nearest valid: 1\.3"):
        head_pattern(tiny_gpt2, TEXT, 2, 7)


# ------------------------------------------------------------------------------ figure and html


def test_pattern_figure_draws_the_pattern(tiny_gpt2):
    hp = head_pattern(tiny_gpt2, TEXT, 0, 1)
    fig = pattern_figure(hp)
    ax = fig.axes[0]
    image = ax.images[0]
    np.testing.assert_array_equal(np.asarray(image.get_array()), hp.pattern)  # rows = queries
    assert image.get_clim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.get_xticklabels()] == hp.tokens  # keys
    assert [t.get_text() for t in ax.get_yticklabels()] == hp.tokens  # queries
    assert ax.get_xlabel() == "key" and ax.get_ylabel() == "query"
    assert hp.model in ax.get_title() and "L0H1" in ax.get_title()


def test_html_is_self_contained_and_holds_the_pattern(tiny_gpt2):
    hp = head_pattern(tiny_gpt2, TEXT, 1, 0)
    page = pattern_html(hp)
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)  # nothing fetched
    data = html_data(page)
    assert data["tokens"] == hp.tokens and data["token_ids"] == hp.token_ids
    np.testing.assert_allclose(np.array(data["pattern"]), hp.pattern, atol=1e-6)
    assert (data["layer"], data["head"]) == (1, 0)
    assert "mouseover" in page and "weight" in page  # the hover readout


def test_html_survives_hostile_tokens():
    tokens = ["</script><b>x", "&amp;", '"q"']
    hp = HeadPattern(
        model="m<1>",
        layer=0,
        head=0,
        text="<i>t</i>",
        token_ids=[1, 2, 3],
        tokens=tokens,
        pattern=np.tril(np.full((3, 3), 1 / 3, dtype=np.float32)),
        causal=True,
    )
    page = pattern_html(hp)
    assert page.count("</script>") == 2  # the data block's and the code block's, nothing else
    assert html_data(page)["tokens"] == tokens
    assert "<i>t</i>" not in page and "m&lt;1&gt;" in page


def test_write_views(tiny_gpt2, tmp_path):
    hp = head_pattern(tiny_gpt2, TEXT, 0, 0)
    paths = write_views(hp, tmp_path / "sub" / "head.png", html_view=True)
    assert paths == [tmp_path / "sub" / "head.png", tmp_path / "sub" / "head.html"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    np.testing.assert_allclose(html_data(paths[1].read_text())["pattern"], hp.pattern, atol=1e-6)
    with pytest.raises(
        HeadscopeError, match=r"must end in \.png, \.svg, \.pdf; e\.g\. .*head\.png"
    ):
        write_views(hp, tmp_path / "head.jpeg")


@pytest.mark.real
def test_smollm2_induction_head_on_repeated_text(smollm2):
    """SmolLM2's L17H4 attends from each repeated token to the token after its first copy."""
    text = " apple river seven cloud table orange window" * 2
    hp = head_pattern(smollm2, text, 17, 4)
    n = len(smollm2.encode(text)) // 2  # tokens per copy; position 0 is BOS
    assert len(hp.tokens) == 2 * n + 1 and hp.tokens[1] == "␣apple"
    induction = np.mean([hp.pattern[q, q - n + 1] for q in range(n + 1, 2 * n + 1)])
    chance = np.mean([1 / (q + 1) for q in range(n + 1, 2 * n + 1)])
    assert induction > 0.4 > 3 * chance
    np.testing.assert_allclose(hp.pattern.sum(-1), 1.0, atol=1e-4)


def small_pattern(n: int = 3, causal: bool = True) -> HeadPattern:
    pattern = (
        np.tril(np.ones((n, n), dtype=np.float32)) if causal else np.ones((n, n), dtype=np.float32)
    )
    pattern /= pattern.sum(-1, keepdims=True)
    return HeadPattern(
        model="org/m",
        layer=2,
        head=1,
        text="t",
        token_ids=list(range(n)),
        tokens=[f"t{i}" for i in range(n)],
        pattern=pattern,
        causal=causal,
    )


def test_pattern_figure_writes_weights_on_small_grids():
    hp = small_pattern(3)
    ax = pattern_figure(hp).axes[0]
    written = sorted((t.get_text(), tuple(t.get_position())) for t in ax.texts)
    # (key, query) positions of the non-zero weights of a causal uniform head
    assert written == sorted(
        [
            ("1.00", (0, 0)),
            ("0.50", (0, 1)),
            ("0.50", (1, 1)),
            ("0.33", (0, 2)),
            ("0.33", (1, 2)),
            ("0.33", (2, 2)),
        ]
    )
    assert (
        ax.get_title()
        == "org/m: L2H1 attention (causal: grey keys are hidden by the mask, 3 tokens)"
    )
    assert ax.images[0].origin == "upper"  # query 0 at the top


def test_pattern_figure_large_grid_has_no_weights_and_bidirectional_title():
    hp = small_pattern(17, causal=False)
    ax = pattern_figure(hp).axes[0]
    assert len(ax.texts) == 0  # more than 16 tokens: no numbers
    assert ax.get_title() == "org/m: L2H1 attention (bidirectional, 17 tokens)"
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), hp.pattern)


def test_pattern_figure_thins_labels_on_long_texts():
    ax = pattern_figure(small_pattern(301)).axes[0]
    assert list(ax.get_xticks()) == list(range(0, 301, 3))  # ceil(301 / 150) = 3
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == ["t0", "t3"]


def test_display_token_escapes_control_characters():
    assert display_token("\r\x01é") == "\\r\\x01é"
    assert display_token("  ") == "␣␣"


def test_parse_head_more_forms():
    assert parse_head("L 3 H 2", 4, 4) == (3, 2)
    assert parse_head("3 . 2") == (3, 2)
    with pytest.raises(
        HeadscopeError,
        match=r"^Head '3\.2\.1' is not LAYER\.HEAD; write it like "
        r"0\.0 ",
    ):
        parse_head("3.2.1")


@pytest.mark.parametrize("suffix", [".svg", ".pdf", ".PNG"])
def test_write_views_other_formats(tmp_path, suffix):
    (path,) = write_views(small_pattern(3), tmp_path / f"head{suffix}")
    head = path.read_bytes()[:8]
    assert head.startswith({".svg": b"<?xml", ".pdf": b"%PDF", ".PNG": b"\x89PNG"}[suffix])


def test_write_views_refuses_a_directory(tmp_path):
    (tmp_path / "fig.png").mkdir()
    with pytest.raises(
        HeadscopeError,
        match=r"^out \(--out\) '.*fig\.png' is a directory; give a "
        r"file name such as ",
    ):
        write_views(small_pattern(3), tmp_path / "fig.png")
