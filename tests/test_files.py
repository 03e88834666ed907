"""Files written outside a run directory: replaced only when headscope wrote them, written whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.figure import Figure

import headscope
from headscope.errors import HeadscopeError
from headscope.files import HTML_GENERATOR, check_replaceable, is_ours, save_figure, write_atomic


def _figure() -> Figure:
    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    return fig


@pytest.mark.parametrize("suffix", ["png", "svg", "pdf"])
def test_figures_say_headscope_wrote_them(tmp_path, suffix):
    ours, theirs = tmp_path / f"ours.{suffix}", tmp_path / f"theirs.{suffix}"
    save_figure(_figure(), ours)
    _figure().savefig(theirs)  # plain matplotlib: its own Software/Creator
    assert is_ours(ours) and not is_ours(theirs)
    check_replaceable([ours, tmp_path / "missing.png"])
    with pytest.raises(
        HeadscopeError,
        match=rf"'.*theirs\.{suffix}' exists and headscope did not "
        r"write it",
    ):
        check_replaceable([ours, theirs])


def test_csv_and_html_are_recognised_by_their_content(tmp_path):
    csv = tmp_path / "compare.csv"
    csv.write_text("metric,run\nsink,a\n")
    assert is_ours(csv, "metric,run") and not is_ours(csv, "metric,run,model") and not is_ours(csv)
    assert is_ours(csv, lambda line: line.startswith("metric,")) and not is_ours(
        csv, lambda line: False
    )
    page = tmp_path / "view.html"
    page.write_text(f"<!DOCTYPE html><html><head>{HTML_GENERATOR}</head></html>")
    assert is_ours(page)
    page.write_text("<html>my page</html>")
    assert not is_ours(page)
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(HeadscopeError, match="exists and is not a file headscope wrote"):
        check_replaceable([tmp_path / "folder.png"])


def test_write_atomic_leaves_the_old_file_or_the_new_one(tmp_path):
    target = tmp_path / "t.csv"
    target.write_text("old")

    def broken(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, broken)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]
    write_atomic(target, lambda tmp: tmp.write_text("new"))
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


@pytest.fixture(scope="module")
def run(tiny_gpt2, tmp_path_factory):
    result = headscope.scan(
        tiny_gpt2, headscope.default_probes(tiny_gpt2, n_prompts=2, repeat_len=4)
    )
    return headscope.save_run(result, tmp_path_factory.mktemp("outputs") / "run", figures=False)


def test_plot_and_compare_never_overwrite_a_users_file(run, tmp_path):
    from headscope.apps.compare import compare_dirs
    from headscope.apps.redraw import redraw

    figs = tmp_path / "figs"
    figs.mkdir()
    mine = figs / "induction.png"
    _figure().savefig(mine)
    before = mine.read_bytes()
    with pytest.raises(
        HeadscopeError, match="induction.png' exists and headscope did not write it"
    ):
        redraw(run, figs)
    assert mine.read_bytes() == before and sorted(p.name for p in figs.iterdir()) == [
        "induction.png"
    ]
    mine.unlink()
    first = redraw(run, figs)
    assert redraw(run, figs) == first  # its own figures are replaced

    other = headscope.save_run(headscope.load_run(run), tmp_path / "run2", figures=False)
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.csv").write_text("my,own,table\n")
    with pytest.raises(HeadscopeError, match="compare.csv' exists and headscope did not write it"):
        compare_dirs([run, other], out)
    assert sorted(p.name for p in out.iterdir()) == ["compare.csv"]
    (out / "compare.csv").unlink()
    _, paths = compare_dirs([run, other], out)
    assert [p.name for p in paths] == [
        "compare.csv",
        "head_diffs.csv",
        "distributions.png",
        "difference.png",
    ]
    assert compare_dirs([run, other], out)[1] == paths  # rewriting its own comparison is fine
    third = headscope.save_run(headscope.load_run(run), tmp_path / "run3", figures=False)
    # other runs: head_diffs.csv names them, still ours
    _, paths3 = compare_dirs([run, other, third], out)
    assert [p.name for p in paths3] == ["compare.csv", "head_diffs.csv", "distributions.png"]
    # stale
    assert sorted(p.name for p in out.iterdir()) == [
        "compare.csv",
        "distributions.png",
        "head_diffs.csv",
    ]
    # difference.png (two runs only) was removed: it was ours and no longer describes this
    # comparison


def test_a_scores_table_cannot_name_a_path(run, tmp_path):
    import shutil

    from headscope.apps.redraw import redraw
    from headscope.rundir.store import load_run

    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    table = (
        (bad / "scores.csv")
        .read_text()
        .replace("\nmodel", "\nmodel")
        .replace(",induction,", ",../../x,")
    )
    (bad / "scores.csv").write_text(table)
    with pytest.raises(
        HeadscopeError, match="names a metric '../../x', which is not a metric name"
    ):
        load_run(bad)
    with pytest.raises(HeadscopeError, match="not a metric name"):
        redraw(bad)


def test_show_never_overwrites_a_users_figure(tiny_gpt2, tmp_path):
    from headscope.apps.show import show_head

    mine = tmp_path / "head.png"
    _figure().savefig(mine)
    with pytest.raises(HeadscopeError, match="head.png' exists and headscope did not write it"):
        show_head(tiny_gpt2, "0.1", out=mine)
    written = show_head(tiny_gpt2, "0.1", out=tmp_path / "ours.png", html_view=True)
    assert [p.name for p in written] == ["ours.png", "ours.html"] and all(
        is_ours(p) for p in written
    )
    assert show_head(tiny_gpt2, "0.1", out=tmp_path / "ours.png", html_view=True) == written
