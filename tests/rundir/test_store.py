"""Run directories: atomic, never a folder headscope did not write, nothing left behind by Ctrl-C or
SIGTERM in any phase, and exactly one winner when two scans race for one --out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import headscope
from headscope.errors import HeadscopeError
from headscope.result import RUN_FORMAT
from headscope.rundir.kinds import CENSUS
from headscope.rundir.store import check_out_dir, foreign_entries, is_run_dir, load_run, save_run

REPO = Path(__file__).resolve().parents[2]
FAST = ["--n-prompts", "3", "--repeat-len", "6", "--batch-size", "3", "--quiet", "--threads", "1"]


@pytest.fixture(scope="module")
def result(tiny_gpt2):
    return headscope.scan(tiny_gpt2, headscope.default_probes(tiny_gpt2, n_prompts=3, repeat_len=5))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(folder.rglob("*"))
    }


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_a_run_is_written_whole_with_complete_metadata(result, tmp_path):
    out = save_run(
        result, tmp_path / "a" / "b" / "run", figures=False, started=time.perf_counter() - 5
    )
    meta = json.loads((out / "metadata.json").read_text())
    assert (
        meta["run_format"] == RUN_FORMAT
        and meta["timings"]["total_s"] >= 5
        and meta["timings"]["write_s"] >= 0
    )
    assert meta["files"] == sorted(p.name for p in out.iterdir())
    assert is_run_dir(out) and foreign_entries(out) == [] and leftovers(out.parent) == []
    back = load_run(out)
    pd.testing.assert_frame_equal(back.scores, result.scores, check_exact=False, rtol=1e-7)
    assert [p.sequences for p in back.probes] == [p.sequences for p in result.probes]


def test_token_types_are_saved_and_read_back(tiny_bert, tmp_path):
    probe = headscope.text_probe(tiny_bert, n_prompts=3, token_types=True)
    out = save_run(headscope.scan(tiny_bert, [probe], bootstrap=0), tmp_path / "run", figures=False)
    records = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    assert [r["token_type_ids"] for r in records] == probe.token_types
    back = load_run(out).probes[0]
    assert back.sequences == probe.sequences and back.token_types == probe.token_types
    plain = save_run(
        headscope.scan(tiny_bert, [headscope.text_probe(tiny_bert, n_prompts=3)], bootstrap=0),
        tmp_path / "plain",
        figures=False,
    )
    assert (
        "token_type_ids" not in (plain / "tokens.jsonl").read_text()
        and load_run(plain).probes[0].token_types is None
    )


def test_force_replaces_a_run_or_an_empty_folder_and_nothing_else(result, tmp_path):
    run = save_run(result, tmp_path / "run", figures=False)
    with pytest.raises(HeadscopeError, match="already exists; pass --force"):
        save_run(result, run, figures=False)
    (run / "scores.csv").write_text((run / "scores.csv").read_text())  # touch: still ours
    save_run(result, run, force=True)  # an earlier run is replaced
    assert (run / "summary.png").is_file() and leftovers(tmp_path) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert save_run(result, empty, force=True, figures=False) == empty and is_run_dir(empty)

    thesis = tmp_path / "thesis"
    (thesis / "chapters").mkdir(parents=True)
    (thesis / "draft.tex").write_text("years of work")
    (thesis / "scores.csv").write_text("not, ours\n")
    before = snapshot(thesis)
    with pytest.raises(
        HeadscopeError,
        match=r"'.*thesis' is not a headscope run directory \(it "
        r"holds chapters and "
        r"2 more\); --force replaces only",
    ):
        save_run(result, thesis, force=True)
    assert snapshot(thesis) == before and leftovers(tmp_path) == []

    (run / "notes.txt").write_text("my notes on this run")
    before = snapshot(run)
    with pytest.raises(HeadscopeError, match="also holds notes.txt, which headscope did not write"):
        save_run(result, run, force=True)
    assert snapshot(run) == before

    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(HeadscopeError, match="is not a directory"):
        check_out_dir(a_file, force=True)
    link = tmp_path / "link"
    link.symlink_to(run, target_is_directory=True)
    with pytest.raises(HeadscopeError, match="is a symbolic link"):
        check_out_dir(link, force=True)


def test_runs_from_before_the_run_format_key_are_recognised(result, tmp_path):
    run = save_run(result, tmp_path / "old", figures=False)
    meta = json.loads((run / "metadata.json").read_text())
    del meta["run_format"], meta["files"]
    meta["versions"] = {"headscope": "0.1.0"}
    (run / "metadata.json").write_text(json.dumps(meta))
    (run / "induction.png").write_bytes(b"png")  # a heatmap `headscope plot` would write
    assert is_run_dir(run) and foreign_entries(run) == []
    (run / "metadata.json").write_text(json.dumps({"something": "else"}))
    assert not is_run_dir(run)


def test_an_error_while_writing_leaves_nothing(result, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("headscope.report.figures.save_figures", broken)
    with pytest.raises(OSError, match="disk full"):
        save_run(result, tmp_path / "new" / "deeper" / "run")
    assert list(tmp_path.iterdir()) == []  # the parent folders made for it are gone too


def test_the_cli_refuses_force_on_a_folder_it_did_not_write(tmp_path, tiny_gpt2_dir):
    from click.testing import CliRunner

    from headscope.cli.main import main

    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export X=1")
    before = snapshot(home)
    res = CliRunner().invoke(
        main, ["scan", str(tiny_gpt2_dir), "--out", str(home), "--force", *FAST]
    )
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "is not a headscope run directory" in res.stderr
    assert snapshot(home) == before


# ------------------------------------------------------------------------------ signals and races

DRIVER = r"""
import os, sys, time
phase, ready, model, out = sys.argv[1:5]
import headscope.engines.extract, headscope.files, headscope.models.model
import headscope.rundir.store, headscope.scanner.runner

def pause():
    open(ready, "w").close()
    time.sleep(3 if phase == "publish" else 120)  # a signal in publish is held until it ends

def wrap(module, name, before=True):
    orig = getattr(module, name)
    def patched(*a, **k):
        if before:
            pause()
        res = orig(*a, **k)
        if not before:
            pause()
        return res
    setattr(module, name, patched)

if phase == "load":
    wrap(headscope.scanner.runner, "load_model")
elif phase == "scan":
    wrap(headscope.scanner.runner, "score_probe")
elif phase == "write":
    wrap(headscope.rundir.store, "write_csv")              # a table half written to the temp folder
elif phase == "publish":
    wrap(headscope.files, "rename_into")                   # inside the held section: deferred
elif phase == "race":
    orig = headscope.files.rename_into
    def together(*a, **k):                           # both scans finish, then publish at once
        open(ready + "." + str(os.getpid()), "w").close()
        while len([f for f in os.listdir(os.path.dirname(ready)) if
        f.startswith(os.path.basename(ready) + ".")]) < 2:
            time.sleep(0.02)
        return orig(*a, **k)
    headscope.files.rename_into = together
from headscope.cli.main import main
command = sys.argv[5] if len(sys.argv) > 5 else "scan"
if command == "scan":
    main(["scan", model, "--out", out, "--n-prompts", "3", "--repeat-len", "6", "--batch-size",
          "3", "--quiet", "--threads", "1"])
else:  # every command writes its run through the one writer: interrupted alike
    main(["census", model, "--out", out, "--parts", "noop", "--noop-sequences", "2",
          "--n-prompts", "3", "--bootstrap", "10", "--quiet"])
"""


def _as_from_a_terminal() -> None:
    """In the child, before it starts: Ctrl-C as a terminal delivers it. A suite run as a background
    job inherits SIGINT ignored, and headscope rightly keeps an ignored signal ignored, so without
    this the SIGINT cases would test the shell, not headscope."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(
    phase: str, model: Path, out: Path, ready: Path, command: str = "scan"
) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, phase, str(ready), str(model), str(out), command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_from_a_terminal,
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    t0 = time.time()
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"exited early ({proc.returncode}): {proc.stderr.read()}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError("never reached the phase")
        time.sleep(0.05)


@pytest.mark.parametrize("phase", ["load", "scan", "write", "publish"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_ctrl_c_and_sigterm_in_any_phase_leave_nothing_behind(phase, sig, tmp_path, tiny_gpt2_dir):
    parent = tmp_path / "runs"
    out, ready = parent / "run", tmp_path / "ready"
    proc = _start(phase, tiny_gpt2_dir, out, ready)
    _wait_for(ready, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    name = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
    if phase == "publish":  # held back until the rename finished: a complete run, nothing else
        assert err.strip().splitlines() == [
            f"headscope: error: interrupted ({name}) as the run "
            "was being renamed "
            f"into place; {out}/ is complete."
        ]
        assert is_run_dir(out) and foreign_entries(out) == [] and leftovers(parent) == []
    else:
        assert err.strip().splitlines() == [
            f"headscope: error: interrupted ({name}); no partial output is left behind."
        ]
        assert not parent.exists() or list(parent.iterdir()) == []
        assert not parent.exists()  # the folder made for --out's parent is gone too


@pytest.mark.parametrize("phase", ["write", "publish"])
def test_a_census_is_interrupted_as_a_scan_is(phase, tmp_path, tiny_gpt2_dir):
    """Every command publishes through one writer (rundir.store.write_run): a census stopped while
    it writes leaves nothing, and one stopped during the rename says its run is complete."""
    parent = tmp_path / "runs"
    out, ready = parent / "census", tmp_path / "ready"
    proc = _start(phase, tiny_gpt2_dir, out, ready, command="census")
    _wait_for(ready, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    if phase == "publish":
        assert err.strip().splitlines() == [
            "headscope: error: interrupted (SIGTERM) as the run was being renamed into place; "
            f"{out}/ is complete."
        ]
        assert is_run_dir(out, CENSUS) and leftovers(parent) == []
    else:
        assert err.strip().splitlines() == [
            "headscope: error: interrupted (SIGTERM); no partial output is left behind."
        ]
        assert not parent.exists()


def test_every_command_writes_through_the_one_writer(tiny_gpt2, good_task, tmp_path, monkeypatch):
    """scan, patch, circuit, discover, qk, icl, census and kvplan's plan each call write_run once,
    with their kind."""
    import headscope.rundir.store as rd
    from headscope.apps import census, circuit_run, discover, icl, kvplan, patch, qk
    from headscope.rundir.kinds import KINDS

    kinds = []
    real = rd._fill  # what write_run fills the temporary folder with

    def spy(tmp, kind, *a, **k):
        kinds.append(kind.command)
        return real(tmp, kind, *a, **k)

    monkeypatch.setattr(rd, "_fill", spy)
    small = {"n_prompts": 2, "bootstrap": 0}
    headscope.scan_to_dir(tiny_gpt2, tmp_path / "scan", repeat_len=5, figures=False, **small)
    tt = headscope.Task.from_file(good_task).tokenize(tiny_gpt2)
    result = headscope.patch(tiny_gpt2, tt, bootstrap=0, estimator="attribution")
    patch.save_patching(result, tmp_path / "patch", figures=False)
    paths = headscope.circuit(
        tiny_gpt2, tt, bootstrap=0, receivers=("logits",), senders=("L0H0",), composition=False
    )
    circuit_run.save_circuit(paths, tmp_path / "circuit", figures=False)
    found = headscope.discover(
        tiny_gpt2, tt, bootstrap=0, methods=("eap",), exact=0, sizes=2, n_random=0
    )
    discover.save_discovery(found, tmp_path / "discover", figures=False)
    qk.qk_to_dir(tiny_gpt2, tmp_path / "qk", heads=("L1H0",), n_prompts=2, seq_len=8, bootstrap=0,
                 knockouts=0, figures=False)  # fmt: skip
    from tests.icl_helpers import tiny_settings, write_task

    icl.icl_to_dir(
        tiny_gpt2, tmp_path / "icl", figures=False, **tiny_settings(write_task(tmp_path))
    )
    settings = census.CensusSettings(parts=("rare_word",), n_prompts=2, bootstrap=10)
    census.census(tiny_gpt2, tmp_path / "census", settings, figures=False)
    from tests.apps.test_kvplan import _plan_table

    kvplan.save(_plan_table(), tmp_path / "plan", kvplan.PlanSettings(), "tiny", {}, {})
    assert kinds == ["scan", "patch", "circuit", "discover", "qk", "icl", "census", "kvplan"]
    assert set(kinds) == set(KINDS)


def test_a_second_ctrl_c_during_the_clean_up_cannot_stop_it(result, tmp_path, monkeypatch):
    """Signals are held everywhere but in the writing itself: a second Ctrl-C that arrives while the
    temporary folder is being removed is held and delivered after it (double-tapping Ctrl-C)."""
    import headscope.files
    import headscope.rundir.store as rd
    from headscope.rundir import signals

    calls = []

    def interrupted_write(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: raises here, in the released part
        time.sleep(1)

    real_rmtree = headscope.files.shutil.rmtree

    def rmtree_with_a_second_ctrl_c(path, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # arrives mid clean-up: must be held
        calls.append(path)
        real_rmtree(path, **kwargs)

    monkeypatch.setattr(rd, "_write", interrupted_write)
    monkeypatch.setattr(headscope.files.shutil, "rmtree", rmtree_with_a_second_ctrl_c)
    # Ctrl-C as at a terminal, even when the suite runs as a background job (SIGINT ignored)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            save_run(result, tmp_path / "deep" / "run")
        assert len(calls) == 1 and list(tmp_path.iterdir()) == []
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    finally:
        signal.signal(signal.SIGINT, before)
    assert (
        signals._SIGNALS.pending is None
        and signals._SIGNALS.holding == 0
        and signals._SIGNALS.depth == 0
    )


def test_two_scans_to_one_out_exactly_one_wins(tmp_path, tiny_gpt2_dir):
    out, ready = tmp_path / "run", tmp_path / "sync" / "ready"
    ready.parent.mkdir()
    procs = [_start("race", tiny_gpt2_dir, out, ready) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], results
    loser_err = next(err for p, (_, err) in zip(procs, results, strict=True) if p.returncode == 2)
    assert loser_err.strip().count("\n") == 0 and "appeared while this scan ran" in loser_err
    winner_out = next(o for p, (o, _) in zip(procs, results, strict=True) if p.returncode == 0)
    assert f"wrote {out}/" in winner_out
    assert is_run_dir(out) and foreign_entries(out) == [] and leftovers(tmp_path) == []


def test_save_run_of_a_scan_writes_what_scan_to_dir_writes(tmp_path, tiny_gpt2_dir):
    """Issue 19: ``save_run(scan(...))`` from Python wrote only timings and a few settings (no
    model, source, sha256, probes, seed or versions), and summary.md said "? layers x ? heads". The
    result
    now carries everything its run directory records, however it is saved."""
    from headscope.scanner.runner import scan, scan_to_dir

    small = {"n_prompts": 3, "repeat_len": 5, "bootstrap": 50}
    scan_to_dir(str(tiny_gpt2_dir), tmp_path / "cli", figures=False, **small)
    model = headscope.load_model(str(tiny_gpt2_dir))
    save_run(
        scan(model, headscope.default_probes(model, **small), **small),
        tmp_path / "py",
        figures=False,
    )
    cli = json.loads((tmp_path / "cli" / "metadata.json").read_text())
    py = json.loads((tmp_path / "py" / "metadata.json").read_text())
    assert set(py) == set(cli)
    for key in (
        "model",
        "source",
        "n_layers",
        "n_heads",
        "probes",
        "seed",
        "versions",
        "settings",
        "engine",
    ):
        assert py[key] == cli[key], key
    # python loaded the model itself
    assert set(py["timings"]) == set(cli["timings"]) - {"load_s", "total_s"}
    summary = (tmp_path / "py" / "summary.md").read_text()
    assert (
        "?" not in summary.splitlines()[2]
        and f"{model.n_layers} layers x {model.n_heads} heads" in summary
    )


def test_a_figure_that_cannot_be_drawn_keeps_the_run(result, tmp_path, monkeypatch):
    """A figure failure never loses a finished scan: the tables, records and page are written, one
    line says what failed, and metadata.json notes it."""

    def broken(*_a, **_k):
        raise ValueError("'yerr' must not contain negative values")

    monkeypatch.setattr("headscope.report.figures.save_figures", broken)
    heard = []
    out = save_run(result, tmp_path / "run", say=heard.append)
    meta = json.loads((out / "metadata.json").read_text())
    assert (
        meta["figures_skipped"]
        == "the figures: ValueError: 'yerr' must not contain negative values"
    )
    assert {"scores.csv", "tokens.jsonl", "summary.md", "report.html"} <= {
        p.name for p in out.iterdir()
    }
    assert (
        not list(out.glob("*.png")) and len(heard) == 1 and "everything else was kept" in heard[0]
    )
    assert is_run_dir(out) and foreign_entries(out) == []
