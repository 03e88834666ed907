"""Try a transformers release against the support table before the pin moves, in one step.

    python -m scripts.adopt_transformers 5.26.0            # run the conformance suite under it
    python -m scripts.adopt_transformers 5.26.0 --write    # ... and regenerate support.json

The release (with what it needs) is installed into a folder of its own under
``$HEADSCOPE_CACHE/transformers/`` (default ``~/.cache/headscope``) and put first on
``PYTHONPATH`` for one run of
``python -m scripts.conformance``, so ``.venv`` is left as it was. The run prints every family
whose status changed against the shipped table: *improved* (refused -> exact), *regressed*
(exact -> refused, or anything -> wrong / error) and *reworded* refusals. Read them; then, to adopt
the release, rerun with ``--write`` and move the pin in ``pyproject.toml`` and
``scripts/constraints.txt`` (``tests/test_dependencies.py`` checks the three agree), and run the
suite. Exit status: the conformance run's (1 when an engine gave a wrong score or crashed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def install(release: str) -> Path:
    """``transformers==release`` and its dependencies in a folder of their own (cached)."""
    home = Path(os.environ.get("HEADSCOPE_CACHE", Path.home() / ".cache" / "headscope"))
    target = home / "transformers" / release
    if not (target / "transformers" / "__init__.py").is_file():
        print(f"adopt: installing transformers=={release} into {target}", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--target", str(target), f"transformers=={release}"],
            check=True,
        )  # fmt: skip
    return target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("release", help="a transformers version on PyPI, e.g. 5.26.0")
    ap.add_argument("--write", action="store_true", help="regenerate headscope/data/support.json")
    ap.add_argument("--json", help="write the table found and its changes to this file")
    args = ap.parse_args(argv)
    target = install(args.release)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(target), str(ROOT)] + ([os.environ["PYTHONPATH"]] if "PYTHONPATH" in os.environ
                                     else [])))  # fmt: skip
    cmd = [sys.executable, "-m", "scripts.conformance"]
    cmd += ["--write"] * args.write + (["--json", args.json] if args.json else [])
    rc = subprocess.run(cmd, env=env, cwd=ROOT).returncode
    print(
        f"\nadopt: to move to transformers {args.release}: read the changes above, rerun with "
        "--write, set the pin in pyproject.toml and scripts/constraints.txt, then run the suite."
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
