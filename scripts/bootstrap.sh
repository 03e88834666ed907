#!/usr/bin/env bash
# Create .venv (if missing) and install headscope with its dev extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
# CPU torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/python -m pip show torch >/dev/null 2>&1 || .venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[dev,parquet]"
# A kernel named python3 inside the venv, for the report notebooks.
.venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
# Compile the fused scan kernel now (once, ~1 min; torch caches it). Without a C++ compiler scans
# still work (blocked engine), so a failed build only prints why.
.venv/bin/python -c "from headscope.engines.registry import kernel as kernels; kernels.available() and print('headscope: fused kernel ready')"
