"""report.html: one self-contained page per run, rebuilt from the saved files alone; the notebook
summary of a scan result; ``headscope report``'s refusals; and the page in a real headless
browser."""

from __future__ import annotations

import re
import shutil
import subprocess

import click
import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.image import imread

import headscope
from headscope.apps.redraw import rebuild_report
from headscope.cli.main import _Group
from headscope.cli.report import report
from headscope.report.html import report_html, summary_html
from headscope.rundir.store import REPORT, load_run


def _urls(page: str) -> list[str]:
    return re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', page)


def test_every_run_directory_has_its_page_and_metadata_lists_it(runs):
    for run in runs.values():
        assert (run / REPORT).is_file()
        assert REPORT in load_run(run).metadata["files"]


def test_the_page_is_self_contained_and_shows_the_run(runs):
    page = (runs["gpt2"] / REPORT).read_text()
    run = load_run(runs["gpt2"])
    assert (
        page.startswith("<!DOCTYPE html>") and '<meta name="generator" content="headscope">' in page
    )
    # scripts inline only
    assert "<script src" not in page and "@import" not in page and "url(" not in page
    urls = _urls(page)
    assert urls and all(u.startswith(("data:image/png;base64,", "#m-", "#views")) for u in urls), (
        urls
    )
    for metric in run.scores["metric"].unique():  # a section per behaviour, linked from the top
        assert f'id="m-{metric}"' in page and f'href="#m-{metric}"' in page
    measured = run.scores.groupby("metric")["score"].apply(lambda s: s.notna().any()).sum()
    # a heatmap per measured behaviour + the threshold sweep
    assert page.count("data:image/png") == measured + 1
    top = headscope.top_heads(run.scores, "previous_token", 1).iloc[0]
    assert f"<td>{top.head_name}</td>" in page and f"{top.score:.3f}" in page
    assert f"[{top.ci_low:.3f}, {top.ci_high:.3f}]" in page  # the interval beside the score
    assert f"<h1>headscope scan: {run.model_name}</h1>" in page


def test_a_causal_model_page_says_why_next_token_is_nan(runs):
    page = (runs["gpt2"] / REPORT).read_text()
    section = page[page.index('id="m-next_token"') : page.index('id="m-sink"')]
    assert "NaN for every head" in section and "causal" in section and "<img" not in section


def test_a_run_without_figures_gets_a_page_of_tables(runs):
    page = (runs["bert"] / REPORT).read_text()
    assert "data:image" not in page and "built without figures" in page and "<table>" in page


def test_rebuilding_needs_no_model_and_gives_the_same_page(runs, tmp_path, no_model):
    for run in runs.values():
        again = rebuild_report(run, tmp_path / f"{run.name}.html")
        assert again.read_bytes() == (run / REPORT).read_bytes()
    assert rebuild_report(runs["gpt2"]) == runs["gpt2"] / REPORT  # in place, its own page replaced


def test_page_text_is_escaped():
    import pandas as pd

    from headscope.result import ScanResult

    scores = pd.DataFrame(
        {
            "model": "<b>m</b>",
            "metric": "sink",
            "probe": "text",
            "layer": [0],
            "head": [0],
            "head_name": ["L0H0"],
            "score": [0.9],
            "chance": [0.1],
            "n": [3],
            "label": ["sink head"],
        }
    )
    page = report_html(ScanResult("<script>x</script>", scores, probes=[]), figures=False)
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page


def test_a_scan_result_shows_itself_as_html_in_a_notebook(tiny_gpt2):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    headscope._register_notebook_display()
    result = headscope.scan(
        tiny_gpt2, headscope.default_probes(tiny_gpt2, n_prompts=2, repeat_len=4)
    )
    data, _ = shell.display_formatter.format(result)
    assert data["text/html"] == summary_html(result)
    assert "previous_token" in data["text/html"] and "ScanResult(" not in data["text/html"]


# ------------------------------------------------------------------------------ the command


@pytest.fixture(scope="module")
def cli():
    group = click.group(cls=_Group)(lambda: None)
    group.add_command(report)
    return group


def _invoke(cli, *args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _one_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headscope: error: "), result.stderr
    return lines[0]


def test_report_command_writes_the_page(cli, runs, tmp_path, no_model):
    result = _invoke(cli, "report", runs["gpt2"], "--out", tmp_path / "page.html")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(tmp_path / "page.html")
    assert (tmp_path / "page.html").read_bytes() == (runs["gpt2"] / REPORT).read_bytes()


def test_report_refusals_leave_nothing_behind(cli, runs, tmp_path):
    assert "is not a headscope run directory" in _one_line(_invoke(cli, "report", tmp_path))
    assert "does not exist" in _one_line(_invoke(cli, "report", tmp_path / "nope"))
    mine = tmp_path / "notes.html"
    mine.write_text("<html>my notes</html>")
    assert "headscope did not write" in _one_line(
        _invoke(cli, "report", runs["gpt2"], "--out", mine)
    )
    assert mine.read_text() == "<html>my notes</html>"
    assert "must name an .html file" in _one_line(
        _invoke(cli, "report", runs["gpt2"], "--out", tmp_path / "x.png")
    )
    assert "does not exist" in _one_line(
        _invoke(cli, "report", runs["gpt2"], "--out", tmp_path / "no" / "x.html")
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.html"]


def test_report_to_an_unwritable_place_is_one_line(cli, runs, tmp_path, monkeypatch):
    def denied(path, write):  # what the OS says for a read-only folder (root would not be refused)
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("headscope.apps.redraw.write_atomic", denied)
    line = _one_line(_invoke(cli, "report", runs["gpt2"], "--out", tmp_path / "x.html"))
    assert line.endswith(
        f"Cannot write '{tmp_path / 'x.html'}' (Permission denied); choose another --out."
    )
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ a real browser


def test_the_page_opens_in_headless_chromium(runs, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip(
            "chromium is not installed (Debian: apt-get install chromium), so the page was "
            "not opened "
            "in a real browser; the static checks above still ran"
        )
    page = runs["gpt2"] / REPORT
    shot = tmp_path / "shot.png"
    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-background-networking",
        "--enable-logging=stderr",
        "--v=0",
    ]
    dom = subprocess.run(
        flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "headscope scan:" in dom.stdout and 'id="m-induction"' in dom.stdout  # loaded and parsed
    assert "CONSOLE" not in dom.stderr and "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    assert not [u for u in _urls(dom.stdout) if u.startswith(("http:", "https:", "//"))]
    n_heads = len(load_run(runs["gpt2"]).views["heads"])
    # the script drew both views
    assert len(re.findall(r"<button[^>]*>L\d+H\d+", dom.stdout)) == 2 * n_heads
    assert re.search(r'<td[^>]*style="background: rgb', dom.stdout)  # and painted their cells
    run = subprocess.run(
        flags + [f"--screenshot={shot}", "--window-size=1100,1400", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    pixels = imread(shot)[..., :3]
    ink = (pixels.mean(-1) < 0.9).mean()  # share of pixels that are not (near) white
    assert ink > 0.02 and pixels.std() > 0.05, f"the screenshot looks blank (ink {ink:.3f})"


def test_the_layer_view_runs_in_headless_chromium(tiny_gpt2, tmp_path):
    from headscope.apps.show import layer_patterns
    from headscope.report.pattern_page import layer_html

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip(
            "chromium is not installed (Debian: apt-get install chromium), so the layer "
            "view's script was "
            "not run in a real browser"
        )
    page = tmp_path / "layer.html"
    page.write_text(
        layer_html(layer_patterns(tiny_gpt2, "The river bank flooded.", 1)), encoding="utf-8"
    )
    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--enable-logging=stderr",
        "--v=0",
    ]
    dom = subprocess.run(
        flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr, dom.stderr[-2000:]
    buttons = re.findall(r"<button[^>]*>(L\d+H\d+)</button>", dom.stdout)
    assert buttons == ["L1H0", "L1H1", "L1H2", "L1H3"]  # the script ran and drew a button per head
    assert (
        'class="sel"' in dom.stdout
        and len(re.findall(r'<td class="c"[^>]*background: rgb', dom.stdout)) > 0
    )
    assert not [u for u in _urls(dom.stdout) if u.startswith(("http:", "https:", "//"))]
    from headscope.apps.show import head_pattern
    from headscope.report.pattern_page import pattern_html

    page.write_text(
        pattern_html(head_pattern(tiny_gpt2, "The river bank flooded.", 1, 2)), encoding="utf-8"
    )
    dom = subprocess.run(
        flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0 and "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    assert "<button" not in dom.stdout  # one head: no head bar
    # the one-head page still paints
    assert len(re.findall(r'<td class="c"[^>]*background: rgb', dom.stdout)) > 0


def test_the_scan_keeps_the_top_heads_patterns_and_the_page_shows_them(runs, tiny_gpt2):
    import torch

    from headscope.scanner.examples import pick_heads

    run = load_run(runs["gpt2"])
    heads, examples = run.views["heads"], run.views["examples"]
    assert heads == pick_heads(run.scores) and 1 <= len(heads) <= 8
    # the positional null is a control: no view
    assert [ex["probe"] for ex in examples] == ["text", "repeat"]
    for ex in examples:
        assert ex["pattern"].shape == (len(heads), len(ex["token_ids"]), len(ex["token_ids"]))
        assert (
            ex["token_ids"]
            == next(p for p in run.probes if p.name == ex["probe"]).sequences[0][:128]
        )
        ids = torch.tensor([ex["token_ids"]])
        # the blocked engine's pattern == transformer-lens' hook_pattern
        for i, (layer, head) in enumerate(heads):
            got = {}
            tiny_gpt2.run_patterns(
                ids,
                torch.ones_like(ids, dtype=torch.bool),
                lambda _l, p, got=got, head=head: got.setdefault("p", p[0, head].float().numpy()),
                layers=[layer],
            )
            np.testing.assert_allclose(ex["pattern"][i], got["p"], atol=1e-5)
        np.testing.assert_allclose(ex["pattern"].sum(-1), 1.0, atol=1e-5)  # rows of a softmax
    page = (runs["gpt2"] / REPORT).read_text()
    assert (
        'id="hs-views"' in page and 'id="hs-view-1"' in page and "repeat probe, sequence 0" in page
    )


def test_pick_heads_takes_the_strongest_of_each_labelled_behaviour():
    import pandas as pd

    from headscope.scanner.examples import pick_heads

    rows = [
        ("sink", 0, 0, 0.9),
        ("sink", 1, 1, 0.95),
        ("entropy", 0, 1, 0.2),
        ("entropy", 1, 0, 0.1),
        ("induction", 1, 1, 0.7),
        ("next_token", 0, 0, float("nan")),
        ("next_token", 1, 1, float("nan")),
    ]
    scores = pd.DataFrame(rows, columns=["metric", "layer", "head", "score"])
    # sink L1H1; entropy: the lowest, L1H0; induction: L1H1 again
    assert pick_heads(scores) == [(1, 1), (1, 0)]
    assert pick_heads(scores, k=1) == [(1, 1)]


# ------------------------------------------------------------------------------ robustness


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_bert"])
def test_example_patterns_assemble_blocks_exactly(fixture, request, monkeypatch):
    import torch

    from headscope.scanner.examples import example_patterns

    model = request.getfixturevalue(fixture)
    # 16-row blocks: causal blocks end early
    monkeypatch.setattr("headscope.engines.blocked.BLOCK_BYTES", 1)
    probe = headscope.repeat_probe(model, 30, n_sequences=1)  # 61-63 tokens: four blocks
    heads = [(0, 1), (1, 3), (1, 0)]
    ex = example_patterns(model, [probe], heads)[0]
    ids = torch.tensor([ex["token_ids"]])
    for i, (layer, head) in enumerate(heads):  # against transformer-lens' hook_pattern
        got = {}
        model.run_patterns(
            ids,
            torch.ones_like(ids, dtype=torch.bool),
            lambda _l, p, got=got, head=head: got.setdefault("p", p[0, head].float().numpy()),
            layers=[layer],
        )
        np.testing.assert_allclose(ex["pattern"][i], got["p"], atol=1e-5)


def test_a_failed_page_never_loses_the_run(tiny_gpt2, tmp_path, monkeypatch):
    from headscope.rundir.store import foreign_entries

    def broken(*_a, **_k):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr("headscope.report.html.report_html", broken)
    result = headscope.scan(
        tiny_gpt2, headscope.default_probes(tiny_gpt2, n_prompts=2, repeat_len=4)
    )
    run = headscope.save_run(result, tmp_path / "run", figures=False)
    meta = load_run(run).metadata
    assert not (run / REPORT).exists() and REPORT not in meta["files"]
    assert (
        meta["report_skipped"] == "report.html: RuntimeError: drawing failed"
        and foreign_entries(run) == []
    )


def test_a_metric_name_that_cannot_name_a_file_is_refused_before_any_work(tiny_gpt2):
    from dataclasses import replace

    from headscope.errors import HeadscopeError
    from headscope.metrics import get_metric

    with pytest.raises(
        HeadscopeError,
        match=r"Metric name 'my sink' is not allowed: .* e\.g\. "
        r"'my_sink'",
    ):
        headscope.scan(
            tiny_gpt2,
            headscope.default_probes(tiny_gpt2, n_prompts=2, repeat_len=4),
            metrics=[replace(get_metric("sink"), name="my sink")],
        )


def test_damaged_side_files(runs, tmp_path):
    from headscope.errors import HeadscopeError

    run = tmp_path / "run"
    shutil.copytree(runs["gpt2"], run)
    (run / "views.npz").write_bytes((run / "views.npz").read_bytes()[:100])
    assert load_run(run).views == {}  # a page without views, not a crash
    (run / "per_sequence.npz").write_bytes(b"")
    with pytest.raises(
        HeadscopeError,
        match=r"per_sequence.npz' cannot be read \(EOFError\); "
        r"rerun the scan",
    ):
        load_run(run)


def test_a_page_of_the_users_own_in_a_run_directory_is_never_replaced(cli, runs, tmp_path):
    from headscope.rundir.store import foreign_entries

    run = tmp_path / "run"
    shutil.copytree(runs["gpt2"], run)
    (run / REPORT).write_text("<html>my own notes</html>")
    assert foreign_entries(run) == [REPORT]  # so scan --force refuses the folder
    assert "headscope did not write" in _one_line(_invoke(cli, "report", run))
    assert (run / REPORT).read_text() == "<html>my own notes</html>"
    before = (runs["gpt2"] / REPORT).read_bytes()
    line = _one_line(_invoke(cli, "report", runs["bert"], "--out", runs["gpt2"] / REPORT))
    assert "is inside another run directory" in line
    assert (runs["gpt2"] / REPORT).read_bytes() == before  # gpt2's page is still gpt2's


def test_a_text_holding_a_placeholder_stays_text(tiny_gpt2):
    from headscope.apps.show import head_pattern
    from headscope.report.pattern_page import pattern_html

    page = pattern_html(head_pattern(tiny_gpt2, "say __DATA__ and __TITLE__", 0, 0))
    assert "<code>say __DATA__ and __TITLE__</code>" in page and page.count('id="hs-data"') == 1


def test_the_notebook_summary_counts_controls_apart(tiny_gpt2):
    result = headscope.scan(
        tiny_gpt2, headscope.default_probes(tiny_gpt2, n_prompts=2, repeat_len=4)
    )
    assert "4 sequences (+ 2 positional-null controls)" in summary_html(result)


def test_effects_stand_beside_every_behaviours_top_heads(tiny_gpt2):
    from headscope.effects.heads import EffectSettings

    result = headscope.scan(
        tiny_gpt2,
        headscope.default_probes(tiny_gpt2, n_prompts=2, repeat_len=4),
        effects=EffectSettings(mode="both", n_sequences=2),
    )
    effects = [
        m for m in result.scores["metric"].unique() if m.startswith(("effect_", "attribution_"))
    ]
    assert "effect_repeat_loss" in effects and "attribution_repeat_loss" in effects
    page = report_html(result, figures=False)
    section = page[page.index('id="m-induction"') : page.index('id="m-duplicate_token"')]
    header = re.search(r"<thead>(.*?)</thead>", section).group(1)
    assert all(f"<th>{e}</th>" in header for e in effects)
    top = headscope.top_heads(result.scores, "induction", 1).iloc[0]
    row = re.search(rf"<tr><td>{top.head_name}</td>(.*?)</tr>", section).group(1)
    value = result.scores.query("metric == 'effect_repeat_loss' and head_name == @top.head_name")[
        "score"
    ].iloc[0]
    assert f"{value:.3f}" in row  # the head's own exact effect, in its row
