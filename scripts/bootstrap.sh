#!/usr/bin/env bash
# Create .venv (if missing) and install headscope with its dev extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { echo "bootstrap: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# CPU torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
if ! .venv/bin/python -m pip show torch >/dev/null 2>&1; then
  say "installing torch==2.13.0, the CPU build (about a minute)"
  .venv/bin/python -m pip install -q torch==2.13.0
fi
say "installing headscope and its dependencies, editable, with the dev (spaCy included) and parquet extras (about a minute)"
# scripts/constraints.txt: the tested versions of the dependencies that decide results (transformers
# is the one the support table was made with), so a fresh clone installs what its tests expect.
.venv/bin/python -m pip install -q -e ".[dev,parquet]" -c scripts/constraints.txt
.venv/bin/python - <<'EOF2'
from importlib.metadata import version
print("bootstrap: " + ", ".join(f"{p} {version(p)}" for p in
      ("torch", "transformers", "tokenizers", "transformer-lens", "spacy")))
EOF2
# A kernel named python3 inside the venv, for the report notebooks.
.venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
# Compile the fused scan kernel now (once, ~1 min; torch caches it). Without a C++ compiler scans
# still work (blocked engine), so a failed build only prints why.
say "compiling the fused attention-statistics kernel (once, about a minute)"
.venv/bin/python -c "from headscope.engines import kernel; kernel.available() and print('bootstrap: fused kernel ready')"
say "done. Run commands as .venv/bin/headscope ..., or activate the environment once per shell: source .venv/bin/activate"
