"""The documentation site: the generated pages say what the code holds, it builds with warnings as
errors, no page loads anything from the network, and pages open in headless Chromium without a
single network request (Chromium's net log is read for requests a page started).

The build needs the dev extra's MkDocs tools (``./scripts/bootstrap.sh`` installs them); without
them the build tests skip and say so, except in the checkout's own ``.venv`` (CI), where they
fail. The generator tests need only headscope.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# this checkout's own .venv (bootstrap.sh and CI): the dev extra is installed, so a missing tool is
# an error there, not a reason to skip
BOOTSTRAPPED = Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()
TOOLS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "mkdocs_jupyter")


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("headscope_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------ generated pages


def test_the_metric_reference_lists_exactly_the_registered_metrics(hooks):
    from headscope.catalog import CIRCUIT, EFFECTS
    from headscope.metrics import REGISTRY, Metric, register

    names = hooks.metric_names()
    assert names == {"pattern": list(REGISTRY), "circuit": list(CIRCUIT), "effects": list(EFFECTS)}
    text = hooks.metric_reference()
    rows = re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.M)
    assert rows == list(REGISTRY) + list(CIRCUIT) + list(EFFECTS)
    # a metric registered now is in the reference now: read from the registry, not written down
    register(
        Metric(
            name="docs_probe_metric",
            probe="text",
            fn=REGISTRY["sink"].fn,
            definition="A[q, 0] again",
            label="",
            threshold=float("nan"),
        )
    )
    try:
        assert "| `docs_probe_metric` | text | A[q, 0] again |" in hooks.metric_reference()
    finally:
        del REGISTRY["docs_probe_metric"]
    assert "<!-- headscope:metrics -->" in (DOCS / "metrics.md").read_text()


def test_the_support_table_is_generated_from_support_json(hooks):
    from headscope.engines.support import load_support, support_markdown

    table = hooks.support_table()
    assert support_markdown(load_support()) in table
    assert "<!-- headscope:support -->" in (DOCS / "models.md").read_text()


def test_the_cli_page_has_every_command_and_option(hooks):
    from headscope.cli.main import COMMANDS

    text = hooks.cli_reference()
    assert re.findall(r"^### `headscope (\w+)`$", text, flags=re.M) == list(COMMANDS)
    assert text.count("--figure-format") >= 6


def test_every_notebook_is_in_the_nav_and_described_on_the_notebooks_page(hooks):
    notebooks = sorted(nb.name for nb in (ROOT / "analyses").glob("*.ipynb"))
    assert len(notebooks) >= 7
    nav = hooks.notebook_nav([{"Home": "index.md"}, {"Report notebooks": ["notebooks.md"]}])
    assert nav[1]["Report notebooks"] == ["notebooks.md"] + [f"notebooks/{n}" for n in notebooks]
    with pytest.raises(ValueError, match="no 'Report notebooks' section"):
        hooks.notebook_nav([{"Home": "index.md"}])
    page = (DOCS / "notebooks.md").read_text()  # a new notebook gets a row saying what it shows
    undescribed = [n for n in notebooks if f"](notebooks/{n})" not in page]
    assert undescribed == [], f"docs/notebooks.md has no row for {undescribed}"


def test_the_api_reference_covers_every_package_of_headscope():
    """Each module and subpackage of ``headscope`` (a new one from a merge too) has a ``:::``
    block on an API page; subpackages render their submodules. The CLI is the command-line page."""
    import pkgutil

    import headscope

    blocks = {}
    for page in (DOCS / "api").glob("*.md"):
        for m in re.finditer(r"^::: (headscope[\w.]*)\n((?:    .*\n)*)", page.read_text(), re.M):
            blocks[m.group(1)] = m.group(2)
    modules = {
        f"headscope.{m.name}": m.ispkg
        for m in pkgutil.iter_modules(headscope.__path__)
        if not m.name.startswith("_") and m.name != "cli"
    }
    assert sorted(set(modules) - set(blocks)) == []
    unshown = [n for n, pkg in modules.items() if pkg and "show_submodules: true" not in blocks[n]]
    assert unshown == []


def test_markers_expand_and_an_unknown_marker_is_an_error(hooks):
    page = "intro\n<!-- headscope:layers -->\nend\n"
    assert "models/" in hooks.expand(page) and "<!--" not in hooks.expand(page)
    with pytest.raises(ValueError, match="unknown marker"):
        hooks.expand("<!-- headscope:nope -->\n")


def test_docstrings_become_markdown(hooks):
    text = (
        "See :func:`~headscope.files.save_figure` and :mod:`headscope.metrics`.\n\n"
        "    >>> f(1)\n    2\n\nEnd."
    )
    out = hooks.docstring_markdown(text)
    assert "`save_figure`" in out and "`headscope.metrics`" in out and ":func:" not in out
    assert "    ```pycon\n    >>> f(1)\n    2\n    ```" in out


# ------------------------------------------------------------------------------ the built site


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    missing = [
        t
        for t in TOOLS
        if importlib.util.find_spec(t.split(".")[0]) is None or importlib.util.find_spec(t) is None
    ]
    if missing and BOOTSTRAPPED:
        pytest.fail(
            f"{', '.join(missing)} missing from .venv, which bootstrap.sh made: run "
            "./scripts/bootstrap.sh again (its dev extra installs the site's tools)"
        )
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed (the dev extra has them: bootstrap.sh), so "
            "the site was not built; the generator tests above still ran"
        )
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", ROOT / "mkdocs.yml", "-d", out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert warnings == []
    return out


def test_the_site_has_every_page_and_the_generated_ones(site):
    from headscope.cli.main import COMMANDS
    from headscope.metrics import REGISTRY

    for page in (
        "index",
        "getting-started",
        "scan",
        "metrics",
        "models",
        "effects",
        "long-context",
        "scale-out",
        "gpu",
        "figures",
        "python",
        "cli",
        "notebooks",
        "benchmarks",
        "changelog",
    ):
        assert (site / f"{page}.html").is_file(), page
    metrics = (site / "metrics.html").read_text()
    first = metrics.split("<table>", 1)[1].split("</table>", 1)[0]
    assert re.findall(r"<tr>\s*<td><code>([a-z_]+)</code></td>", first) == list(REGISTRY)
    assert "GPT-OSS" in (site / "models.html").read_text()  # the support table
    assert all(f"headscope {name}" in (site / "cli.html").read_text() for name in COMMANDS)
    for nb in sorted(
        (ROOT / "analyses").glob("*.ipynb")
    ):  # every notebook rendered, with its figures
        page = (site / "notebooks" / f"{nb.stem}.html").read_text()
        assert "jupyter-wrapper" in page and "data:image/png;base64," in page, nb.name
    assert "without_first_token" in (site / "api" / "analysis.html").read_text()  # submodules
    api = (site / "api" / "metrics.html").read_text()
    assert "uniform_pattern" in api and ":func:`" not in api  # docstrings as Markdown:
    assert (
        '<span class="gp">&gt;&gt;&gt; </span>' in api and "<blockquote>" not in api
    )  # examples as code


NETWORK = re.compile(
    r"""<(script|link|img|iframe|source|embed|video|audio)\b[^>]*?\b(?:src|href)\s*=\s*["']"""
    r"""((?:https?:)?//[^"']*)""",
    re.I,
)
CSS_NETWORK = re.compile(
    r"""(?:url\(\s*["']?|@import\s+(?:url\()?["']?)((?:https?:)?//[^"')\s]+)"""
)


def test_no_page_loads_a_script_style_font_or_image_from_the_network(site):
    found = []
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css"):
            text = path.read_text(errors="replace")
            found += (
                [(path.name, m.group(2)) for m in NETWORK.finditer(text)]
                if path.suffix == ".html"
                else []
            )
            found += [(path.name, m.group(1)) for m in CSS_NETWORK.finditer(text)]
    assert found == []
    assert (site / "search" / "search_index.js").is_file()  # the offline plugin inlined the index
    assert 'src="assets/iframe-worker-shim.js"' in (site / "index.html").read_text()


def _browser():
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip(
            "chromium is not installed (Debian: apt-get install chromium), so the pages were not "
            "opened "
            "in a real browser; the static checks above still ran"
        )
    return browser


def _open(browser, page: Path, netlog: Path) -> tuple[str, str, list[str]]:
    """The page's DOM after its scripts ran, the browser's log, and the URLs of the network requests
    the page started (Chromium's own background requests are not the page's: no origin)."""
    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-sync",
        "--disable-background-networking",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing leaves
        f"--log-net-log={netlog}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
    ]
    done = subprocess.run(
        flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    log = json.loads(netlog.read_text())
    kinds = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    urls = [
        e["params"]["url"]
        for e in log["events"]
        if kinds.get(e["type"]) == "URL_REQUEST_START_JOB"
        and "url" in e.get("params", {})
        and e["params"].get("initiator") != "not an origin"
    ]
    return done.stdout, done.stderr, urls


def test_pages_open_in_headless_chromium_with_no_network_request(site, tmp_path):
    browser = _browser()
    control = (
        tmp_path / "control.html"
    )  # the check can fail: a page that does fetch is seen fetching
    control.write_text(
        "<!DOCTYPE html><html><head>"
        '<link rel="stylesheet" href="https://fonts.example.invalid/a.css"></head><body>'
        '<script src="https://cdn.example.invalid/x.js"></script><p>x</p></body></html>'
    )
    _, _, urls = _open(browser, control, tmp_path / "control.json")
    assert {"https://fonts.example.invalid/a.css", "https://cdn.example.invalid/x.js"} <= set(
        urls
    ), urls
    first_notebook = sorted((ROOT / "analyses").glob("*.ipynb"))[0].stem
    for i, (page, needle) in enumerate(
        [
            ("index.html", "attention head"),
            ("metrics.html", "duplicate_token"),
            (f"notebooks/{first_notebook}.html", "jupyter-wrapper"),
            ("api/metrics.html", "uniform_pattern"),
        ]
    ):
        dom, log, urls = _open(browser, site / page, tmp_path / f"net{i}.json")
        assert urls == [], f"{page} requested {urls}"
        assert needle in dom and 'class="md-nav' in dom, (
            page
        )  # the page and Material's navigation rendered
        assert "Uncaught" not in log, f"{page}: {log[-2000:]}"
