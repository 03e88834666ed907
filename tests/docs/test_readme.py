"""The README a newcomer reads in two minutes, and every command in it (and in the site's pages)
runs as written: each fenced block after a ``<!-- runnable -->`` line is read, every ``headscope
...`` command in it is parsed by the CLI's own click parser (the command exists, its options and
their values are accepted), and the cheap ones (no model, no run directory) are run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from headscope.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
RUNNABLE = re.compile(r"^<!-- runnable -->\n```[a-z]*\n(.*?)^```", re.M | re.S)
CHEAP = {"metrics", "engines", "models"}  # read tables and configs only: run them


def runnable_commands(text: str) -> list[list[str]]:
    """The ``headscope`` commands of the runnable blocks of ``text``, as argument lists (a
    ``.venv/bin/`` prefix, ``&&`` chains and ``# comments`` as a shell reads them)."""
    commands = []
    for block in RUNNABLE.findall(text):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            starts = [0] + [i + 1 for i, w in enumerate(words) if w == "&&"]
            for a, b in zip(
                starts, [i for i, w in enumerate(words) if w == "&&"] + [len(words)], strict=True
            ):
                if b > a and words[a].rsplit("/", 1)[-1] == "headscope":
                    commands.append(words[a + 1 : b])
    return commands


def parse(args: list[str]) -> click.Context:
    """The subcommand's context as click parses ``headscope ARGS`` (raises what it refuses)."""
    group = click.Context(main, info_name="headscope")
    name, command, rest = main.resolve_command(
        group, list(args)
    )  # an unknown name: one line, exit 2
    return command.make_context(name, rest, parent=group)


def test_the_readme_is_short_and_sets_up_in_its_first_screen():
    lines = README.read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move sections to docs/"
    first = "\n".join(lines[:40])
    assert "./scripts/bootstrap.sh && .venv/bin/headscope scan" in first
    assert "./scripts/bootstrap.sh && .venv/bin/python -m pytest" in first


def test_ci_runs_the_readmes_test_command_after_bootstrap():
    """``.ci/run`` is bootstrap.sh plus the README's second set-up command, word for word, and
    bootstrap installs the dev extra, which holds the site's tools and ``build`` (so CI builds
    the site and the wheel instead of skipping them)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+ (CI runs 3.11)")

    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == "./scripts/bootstrap.sh && .venv/bin/python -m pytest"
    assert ci in README.read_text().splitlines()
    assert '-e ".[dev,parquet]"' in (ROOT / "scripts" / "bootstrap.sh").read_text()
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=\[;]", r, maxsplit=1)[0].strip() for r in dev["dev"]}
    assert {"mkdocs", "mkdocs-material", "mkdocstrings", "mkdocs-jupyter", "build"} <= names


def test_the_readme_has_runnable_commands():
    commands = runnable_commands(README.read_text())
    assert len(commands) >= 10 and {c[0] for c in commands} >= {
        "scan",
        "show",
        "plot",
        "compare",
        "kvplan",
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_runnable_command_parses(page):
    for args in runnable_commands(page.read_text()):
        try:
            ctx = parse(args)
        except click.ClickException as exc:
            pytest.fail(
                f"{page.name}: `headscope {' '.join(args)}` is refused: {exc.format_message()}"
            )
        assert ctx.command.name == args[0]


def test_the_parser_check_can_fail():
    assert runnable_commands(
        "<!-- runnable -->\n```bash\nheadscope scan m --figure-format jpg\n```\n"
    )
    for wrong in (
        ["scan", "m", "--no-such-option"],
        ["scna", "m"],
        ["plot"],
        ["kvplan", "x", "--budgets"],
    ):
        with pytest.raises((click.ClickException, SystemExit)):
            parse(wrong)
    from headscope.errors import HeadscopeError

    with pytest.raises(HeadscopeError, match="figure format"):
        parse(["plot", "runs/x", "--figure-format", "jpg"])  # values are checked too


def test_the_cheap_commands_run_as_written():
    ran = 0
    for page in PAGES:
        for args in runnable_commands(page.read_text()):
            if args[0] in CHEAP:
                result = CliRunner().invoke(main, args, catch_exceptions=False)
                assert result.exit_code == 0, f"`headscope {' '.join(args)}`: {result.output}"
                ran += 1
    assert ran >= 3
