"""The release-shaped package: ``python -m build`` makes an sdist and a wheel that hold the kernel
source and the data files, and the wheel installs into a fresh virtual environment (not editable)
where ``headscope --version``, the fused kernel's build from the installed source, and a small scan
of a tiny random model folder all work.

Runs in CI (``pytest`` runs it; ``-m "not wheel"`` leaves it out). It takes a few minutes: the
build, ``pip install torch==2.13.0`` (a file on this machine's disk) and the wheel's other
dependencies (from pip's cache after the first run), then a one-minute kernel compile.
"""

from __future__ import annotations

import importlib.util
import json
import os
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


def test_the_wheel_installs_into_a_fresh_venv_and_scans(dist, tmp_path, tiny_gpt2_dir):
    wheel, _ = dist
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py, cli = env_dir / "bin" / "python", env_dir / "bin" / "headscope"
    clean = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    clean.update(
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TORCH_EXTENSIONS_DIR=str(tmp_path / "torch-extensions"),
    )  # a build of its own
    # the CPU build first (a local file here), as bootstrap.sh does: unpinned, torch is a CUDA build
    _run([py, "-m", "pip", "install", "-q", "torch==2.13.0"], timeout=900, env=clean)
    _run([py, "-m", "pip", "install", "-q", wheel], timeout=1500, env=clean)

    version = _run([cli, "--version"], timeout=120, env=clean, cwd=tmp_path)
    assert version.stdout.strip().endswith(headscope.__version__)

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
    site = str(env_dir)
    assert package.startswith(site) and source.startswith(site), (
        package,
        source,
    )  # installed, not this checkout
    assert built, f"the kernel did not build from the installed source: {why}"
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
