"""The release-shaped package: ``python -m build`` makes an sdist and a wheel that hold the kernel
source and the data files, and the wheel installs into a fresh virtual environment (not editable)
where ``headscope --version``, the fused kernel's build from the installed source, and a small scan
of a tiny random model folder all work.

Runs in CI (``pytest`` runs it; ``-m "not wheel"`` leaves it out), in about half a minute: the
wheel goes in with ``--no-deps`` and the new environment borrows the running one's dependencies,
and the kernel is the build torch cached for the installed source's hash. The release check in
full, as a user's machine would do it (every dependency from the index, the CPU torch first, and
the kernel compiled from the installed source into a folder of its own; about five minutes on
the 2-core machine)::

    HEADSCOPE_WHEEL_TEST=full .venv/bin/python -m pytest tests/test_wheel.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import site
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

import headscope

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.wheel
# this checkout's own .venv (bootstrap.sh, CI): the dev extra holds 'build', so it must be there
BOOTSTRAPPED = Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()

SHIPPED = [
    "headscope/engines/csrc/head_stats.cpp",
    "headscope/data/pairs.tsv",
    "headscope/data/support.json",
    "headscope/py.typed",
]


def _run(cmd, timeout, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    if importlib.util.find_spec("build") is None and BOOTSTRAPPED:
        pytest.fail("'build' is missing from .venv, which bootstrap.sh made: run it again")
    if importlib.util.find_spec("build") is None:
        pytest.skip(
            "the 'build' package is not installed (it is in the dev extra: pip install build), so "
            "the "
            "sdist and wheel were not built"
        )
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", out, ROOT], timeout=600)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return wheels[0], sdists[0]


def test_the_wheel_and_sdist_hold_the_kernel_source_and_the_data(dist):
    wheel, sdist = dist
    assert (
        wheel.name == f"headscope-{headscope.__version__}-py3-none-any.whl"
    )  # the version from one place
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(SHIPPED) <= names
    data = {n for n in names if n.startswith("headscope/data/")}
    on_disk = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "headscope" / "data").rglob("*")
        if p.is_file()
    }
    assert data == on_disk  # every data file, however many the other layers add
    assert not [n for n in names if "__pycache__" in n or n.startswith("tests/")]
    meta = (
        zipfile.ZipFile(wheel)
        .read(f"headscope-{headscope.__version__}.dist-info/entry_points.txt")
        .decode()
    )
    assert "headscope = headscope.cli.main:main" in meta
    with tarfile.open(sdist) as tar:
        inside = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert (
        set(SHIPPED) | {"pyproject.toml", "README.md", "CHANGELOG.md", "tests/tiny_models.py"}
        <= inside
    )


FULL = os.environ.get("HEADSCOPE_WHEEL_TEST", "") == "full"


def _fresh_venv(env_dir: Path, wheel: Path, env: dict) -> Path:
    """A new virtual environment with the wheel installed (not editable); its Python.

    By default the wheel goes in with ``--no-deps`` and the environment then borrows the running
    one's installed dependencies through a ``.pth`` line appended after its own site-packages
    (so the wheel's ``headscope`` is the one imported, and the editable checkout's ``.pth`` in the
    borrowed folder is never read: Python reads ``.pth`` files only in its own site folders). With
    ``HEADSCOPE_WHEEL_TEST=full`` every dependency is installed from the index as a user would
    (the CPU torch first, as bootstrap.sh does), which takes minutes."""
    venv.EnvBuilder(with_pip=FULL, clear=True).create(env_dir)
    py = env_dir / "bin" / "python"
    if FULL:
        _run([py, "-m", "pip", "install", "-q", "torch==2.13.0"], timeout=900, env=env)
        _run([py, "-m", "pip", "install", "-q", wheel], timeout=1500, env=env)
        return py
    # this environment's pip installs into the new one (pip --python): no ensurepip, 10 s less
    pip = [sys.executable, "-m", "pip", "--python", py]
    _run([*pip, "install", "-q", "--no-deps", wheel], timeout=300, env=env)
    own = _run([py, "-c", "import site; print(site.getsitepackages()[0])"], timeout=60, env=env)
    borrowed = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(own.stdout.strip()) / "zz_borrowed_dependencies.pth").write_text(
        "".join(f"{p}\n" for p in borrowed)
    )
    return py


# Requires-Dist of the installed wheel, each met by what the new environment imports (checks that
# the borrowed environment really holds what the wheel declares, extras aside).
REQUIREMENTS_MET = """
import json
from importlib.metadata import PackageNotFoundError, requires, version
from packaging.requirements import Requirement
bad = []
for line in requires("headscope"):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        if not req.specifier.contains(version(req.name), prereleases=True):
            bad.append(f"{req} (have {version(req.name)})")
    except PackageNotFoundError:
        bad.append(f"{req} (missing)")
print(json.dumps(bad))
"""


def test_the_wheel_installs_into_a_fresh_venv_and_scans(dist, tmp_path, tiny_gpt2_dir):
    wheel, _ = dist
    env_dir = tmp_path / "venv"
    clean = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    clean.update(PIP_DISABLE_PIP_VERSION_CHECK="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    if FULL:  # a kernel build of its own (about a minute); else the build torch cached for this
        # kernel source (the folder is named by the source's hash: kernel._build_place)
        clean["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "torch-extensions")
    py = _fresh_venv(env_dir, wheel, clean)
    cli = env_dir / "bin" / "headscope"

    version = _run([cli, "--version"], timeout=120, env=clean, cwd=tmp_path)
    assert version.stdout.strip().endswith(headscope.__version__)
    unmet = _run([py, "-c", REQUIREMENTS_MET], timeout=120, env=clean, cwd=tmp_path)
    assert json.loads(unmet.stdout.strip().splitlines()[-1]) == []

    where = _run(
        [
            py,
            "-c",
            "import headscope, json; from headscope.engines import kernel; "
            "ok = kernel.available(); "
            "print(json.dumps([headscope.__file__, str(kernel.SOURCE), ok, "
            "kernel.unavailable_reason()]))",
        ],
        timeout=900,
        env=clean,
        cwd=tmp_path,
    )
    package, source, built, why = json.loads(where.stdout.strip().splitlines()[-1])
    site_dir = str(env_dir)
    assert package.startswith(site_dir) and source.startswith(site_dir), (package, source)
    assert Path(source).read_bytes() == (ROOT / SHIPPED[0]).read_bytes()  # the shipped kernel
    assert built, f"the kernel did not build from the installed source: {why}"
    if FULL:
        assert list((tmp_path / "torch-extensions").rglob("headscope_head_stats*.so"))

    out = tmp_path / "run"
    scan = _run(
        [
            cli,
            "scan",
            tiny_gpt2_dir,
            "--out",
            out,
            "--n-prompts",
            "2",
            "--repeat-len",
            "4",
            "--bootstrap",
            "0",
            "--quiet",
            "--figure-format",
            "png,svg",
        ],
        timeout=600,
        env=clean,
        cwd=tmp_path,
    )
    assert "previous_token" in scan.stdout and f"wrote {out}/" in scan.stdout
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["versions"]["headscope"] == headscope.__version__ and meta["engine"] == "fused"
    assert {"scores.csv", "report.html", "induction.png", "induction.svg"} <= set(meta["files"])
