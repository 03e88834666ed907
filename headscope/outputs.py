"""Files headscope writes outside a run directory (figures, comparison tables), written so that
nothing a user made is ever overwritten.

``headscope show``, ``plot --out`` and ``compare --out`` write a few files into a folder the user
names. A file of the same name that is already there is replaced only when headscope wrote it, as
the file itself says: a PNG carrying headscope's ``Software`` tag, an SVG or PDF whose creator is
headscope, an HTML page whose generator is headscope, or a CSV whose header is the one headscope
writes there. Anything else is refused with one line, before any file is written. Each file is written to a temporary name beside it and renamed, so a reader never sees
half a file.

A leaf: it imports nothing from headscope but :mod:`headscope.errors`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from headscope.errors import HeadscopeError

SOFTWARE = "headscope"  # the PNG tEXt "Software" value (SVG/PDF: "Creator") of every figure headscope saves
PNG_METADATA = {"Software": SOFTWARE}
HTML_GENERATOR = f'<meta name="generator" content="{SOFTWARE}">'  # in the head of every page headscope writes
#: ``colour(w)``: an attention weight in [0, 1] as a CSS colour (viridis, 10 stops), for the pages' scripts.
VIRIDIS_JS = """
  const V = [[68,1,84],[72,40,120],[62,73,137],[49,104,142],[38,130,142],
             [31,158,137],[53,183,121],[109,205,89],[180,222,44],[253,231,37]];
  function colour(w) {
    const x = Math.min(1, Math.max(0, w)) * (V.length - 1);
    const i = Math.min(Math.floor(x), V.length - 2), f = x - i;
    return "rgb(" + V[i].map((a, j) => Math.round(a + (V[i + 1][j] - a) * f)).join(",") + ")";
  }
"""


def png_is_ours(path: Path) -> bool:
    """Whether ``path`` is a PNG whose ``Software`` text chunk says headscope wrote it."""
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 16)  # tEXt chunks come before the image data
    except OSError:
        return False
    return data.startswith(b"\x89PNG") and b"Software\x00" + SOFTWARE.encode() in data


def _head(path: Path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


#: A CSV header headscope writes: the exact first line, or a test of the first line (for headers
#: that name what was compared).
Header = str | Callable[[str], bool]


def is_ours(path: Path, csv_header: Header | None = None) -> bool:
    """Whether the file at ``path`` says headscope wrote it (see the module docstring)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".png":
        return png_is_ours(path)
    if suffix == ".csv":
        return csv_header is not None and csv_is_ours(path, csv_header)
    if suffix == ".html":
        return HTML_GENERATOR.encode() in _head(path, 4096)
    if suffix == ".svg":  # matplotlib writes the creator as <dc:creator><cc:Agent><dc:title>...
        head = _head(path, 8192)
        at = head.find(b"<dc:creator>")
        return at >= 0 and f"<dc:title>{SOFTWARE}</dc:title>".encode() in head[at:at + 200]
    if suffix == ".pdf":
        return f"/Creator ({SOFTWARE})".encode() in _head(path, 1 << 24)
    return False


def csv_is_ours(path: Path, header: Header) -> bool:
    """Whether ``path`` is a CSV whose first line is ``header`` (or passes it, when it is a test)."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError):
        return False
    return header(first) if callable(header) else first == header


def check_replaceable(paths: Sequence[Path], csv_headers: Mapping[str, Header] | None = None) -> None:
    """Refuse, in one line and before anything is written, to replace a file headscope did not write.

    ``csv_headers`` maps a CSV file name to the header headscope writes in it. Missing files are
    fine; a directory in the way is refused.
    """
    csv_headers = csv_headers or {}
    for path in map(Path, paths):
        if not (path.exists() or path.is_symlink()):
            continue
        if path.is_symlink() or not path.is_file():
            raise HeadscopeError(f"'{path}' exists and is not a file headscope wrote; choose another --out.")
        if not is_ours(path, csv_headers.get(path.name)):
            raise HeadscopeError(f"'{path}' exists and headscope did not write it; it is left as it is. Move it "
                                 "or choose another --out.")


def write_atomic(path: Path, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.tmp-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    """Save a matplotlib Figure atomically (format from the suffix), tagged as headscope's when PNG."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    meta = PNG_METADATA if fmt == "png" else {"Creator": SOFTWARE}  # svg: <dc:title>, pdf: /Creator
    return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=fmt, metadata=meta))
