"""``headscope census`` from the command line: options are CensusSettings' fields, bad input exits 2
with one line and writes nothing, a run prints its summary."""

from __future__ import annotations

import sys

import pandas as pd
from click.testing import CliRunner

from headscope.cli.main import main


def test_help_lists_the_settings():
    r = CliRunner().invoke(main, ["census", "--help"])
    assert r.exit_code == 0
    for opt in (
        "--parts",
        "--tokenize",
        "--n-sentences",
        "--readout",
        "--bootstrap",
        "--force",
        "--out",
    ):
        assert opt in r.output


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, tiny_gpt2_dir, monkeypatch):
    runner = CliRunner()
    out = tmp_path / "run"
    cases = [
        (
            ["census", "x", "--parts", "syntax,nope", "--out", str(out)],
            "Unknown census part 'nope'",
        ),
        (
            ["census", "x", "--tokenize", "chars", "--out", str(out)],
            "Unknown tokenize (--tokenize) 'chars'",
        ),
        (["census", "x", "--bootstrap", "0", "--out", str(out)], "bootstrap"),
        (
            [
                "census",
                str(tiny_gpt2_dir),
                "--parts",
                "copy_suppression",
                "--readout",
                "unembedding",
                "--n-null",
                "-1",
                "--out",
                str(out),
            ],
            "n_null",
        ),
    ]
    for args, msg in cases:
        r = runner.invoke(main, args)
        assert r.exit_code == 2 and msg in r.output and len(r.output.strip().splitlines()) == 1, (
            args,
            r.output,
        )
    monkeypatch.setitem(sys.modules, "spacy", None)  # spaCy missing: refused before the model loads
    r = runner.invoke(main, ["census", "no-such-model", "--parts", "syntax", "--out", str(out)])
    assert r.exit_code == 2 and "pip install 'headscope[syntax]'" in r.output
    assert len(r.output.strip().splitlines()) == 1
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("x")
    r = runner.invoke(
        main,
        [
            "census",
            str(tiny_gpt2_dir),
            "--parts",
            "rare_word",
            "--out",
            str(tmp_path / "taken"),
            "--force",
        ],
    )
    assert r.exit_code == 2 and "not a headscope census run" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_a_run_prints_its_summary(tmp_path, tiny_gpt2_dir):
    out = tmp_path / "run"
    r = CliRunner().invoke(
        main,
        [
            "census",
            str(tiny_gpt2_dir),
            "--parts",
            "rare_word,successor",
            "--n-prompts",
            "3",
            "--bootstrap",
            "20",
            "--n-null",
            "5",
            "--out",
            str(out),
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "Rare-word heads" in r.output and "Successor heads" in r.output
    assert set(pd.read_csv(out / "scores.csv").metric) == {"rare_word", "successor"}
