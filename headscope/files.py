"""Writing files safely: every file and folder headscope writes is published whole, and nothing a
user made is ever overwritten.

**Publishing** (one way, used by every writer): a file or folder is written under a temporary name
beside its destination, flushed to disk (``fsync``), and renamed into place, so a reader never sees
half of it and a crash leaves at most a hidden temporary entry that the next run ignores.

* :func:`write_atomic` publishes one file;
* :func:`publish_dir` publishes one folder: run directories, KV plans, sweeps, the model and
  corpus caches. Replacing a folder moves the old one aside first and deletes it only once the
  new one is in place, so there is no moment with neither on disk. Two writers racing for a new
  folder: exactly one wins (the other gets one line, or, for a cache, keeps the winner's folder).
* :func:`optional` runs a step whose failure must never lose finished work (a figure, a page):
  the failure becomes one line and a note in the record, and everything else is kept.

**Never a user's file**: ``headscope show``, ``plot --out`` and ``compare --out`` write a few files
into a folder the user names. A file of the same name that is already there is replaced only when
headscope wrote it, as the file itself says: a PNG carrying headscope's ``Software`` tag, an SVG
or PDF whose creator is headscope, an HTML page whose generator is headscope, or a CSV whose header
is the one headscope writes there. Anything else is refused with one line, before any file is
written.

A leaf: it imports nothing from headscope but :mod:`headscope.errors`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from headscope.errors import HeadscopeError, did_you_mean

# the PNG tEXt "Software" value (SVG/PDF: "Creator") of every figure headscope saves
SOFTWARE = "headscope"
PNG_METADATA = {"Software": SOFTWARE}
# in the head of every page headscope writes
HTML_GENERATOR = f'<meta name="generator" content="{SOFTWARE}">'
#: ``colour(w)``: an attention weight in [0, 1] as a CSS colour (viridis, 10 stops), for the pages'
# scripts.
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
        return at >= 0 and f"<dc:title>{SOFTWARE}</dc:title>".encode() in head[at : at + 200]
    if suffix == ".pdf":
        return f"/Creator ({SOFTWARE})".encode() in _head(path, 1 << 24)
    return False


def csv_is_ours(path: Path, header: Header) -> bool:
    """Whether ``path`` is a CSV whose first line is ``header`` (or passes it, when it is a
    test)."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError):
        return False
    return header(first) if callable(header) else first == header


def check_replaceable(
    paths: Sequence[Path], csv_headers: Mapping[str, Header] | None = None
) -> None:
    """Refuse, in one line and before anything is written, to replace a file headscope did not
    write.

    ``csv_headers`` maps a CSV file name to the header headscope writes in it. Missing files are
    fine; a directory in the way is refused.
    """
    csv_headers = csv_headers or {}
    for path in map(Path, paths):
        if not (path.exists() or path.is_symlink()):
            continue
        if path.is_symlink() or not path.is_file():
            raise HeadscopeError(
                f"'{path}' exists and is not a file headscope wrote; choose another --out."
            )
        if not is_ours(path, csv_headers.get(path.name)):
            raise HeadscopeError(
                f"'{path}' exists and headscope did not write it; it is left as "
                "it is. Move it or choose another --out."
            )


def write_atomic(path: Path, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` to a temporary file beside ``path``, flushed to disk, then renamed to
    ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.tmp-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        _fsync(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _fsync(path: Path) -> None:
    """Flush one file (or a folder's entries) to disk; a file system that cannot is skipped."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder``, then the folders themselves."""
    for p in sorted(Path(folder).rglob("*"), key=lambda q: -len(q.parts)):
        if p.is_file() and not p.is_symlink():
            _fsync(p)
    for p in [*(q for q in Path(folder).rglob("*") if q.is_dir()), Path(folder)]:
        _fsync(p)


def make_parents(parent: Path) -> list[Path]:
    """Create ``parent`` and its missing ancestors; return those created, outermost first (so a
    failed write can remove exactly what it made)."""
    missing = []
    p = Path(parent)
    while not p.exists():
        missing.append(p)
        p = p.parent
    made = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
            made.append(folder)
        except FileExistsError:
            pass
    return made


def publish_dir(
    out: str | Path,
    build: Callable[[Path], None],
    *,
    replace: bool = False,
    keep_existing: bool = False,
    before_replace: Callable[[], None] | None = None,
    mode: int = 0o755,
) -> Path:
    """Build a folder with ``build(tmp)`` in a temporary sibling of ``out`` and rename it into
    place.

    * ``out`` absent: it appears whole. If another writer publishes ``out`` meanwhile, exactly one
      wins: the loser raises one line (or, with ``keep_existing``, a cache, returns the winner's).
    * ``out`` present: refused unless ``replace`` (``before_replace()`` may refuse at the last
      moment, e.g. a folder that changed while the work ran). The old folder is moved aside,
      the new one renamed in, and only then the old one deleted: never a moment with neither.
    * Any failure or interrupt removes the temporary folder and any parent folder made for
      ``out``: nothing is left behind. Folders are made ``mode`` (``mkdtemp`` makes them private).
    """
    out = Path(out)
    parent = out.absolute().parent
    made = make_parents(parent)
    tmp: Path | None = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
        build(tmp)
        fsync_tree(tmp)
        os.chmod(tmp, mode)
        rename_into(tmp, out, replace, keep_existing, before_replace)
        tmp = None
        _fsync(parent)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if still empty
        raise
    return out


class Claimed(HeadscopeError):
    """Another writer published the destination first (two commands writing one place at once)."""


def rename_into(
    tmp: Path,
    out: Path,
    replace: bool = False,
    keep_existing: bool = False,
    before_replace: Callable[[], None] | None = None,
) -> None:
    """Rename the finished folder ``tmp`` to ``out`` (the last step of :func:`publish_dir`; the run
    directory calls it inside its own signal-held section)."""
    if out.exists() or out.is_symlink():
        if keep_existing:
            shutil.rmtree(tmp, ignore_errors=True)
            return
        if not replace:  # callers check before the work starts: so it appeared meanwhile
            raise Claimed(
                f"'{out}' appeared while this ran (another headscope writing the same "
                "place?); nothing was written. Choose another place, or replace it (--force)."
            )
        if before_replace is not None:
            before_replace()
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.absolute().parent))
        os.replace(out, old / "previous")
        try:
            os.replace(tmp, out)
        except OSError:
            os.replace(old / "previous", out)  # put the old folder back
            old.rmdir()
            raise
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        out.mkdir()  # the claim: atomic, so of two writers exactly one gets here
    except FileExistsError:
        if keep_existing:
            shutil.rmtree(tmp, ignore_errors=True)
            return
        raise Claimed(
            f"'{out}' appeared while this ran (another headscope writing the same "
            "place?); nothing was written. Choose another place, or replace it (--force)."
        ) from None
    try:
        os.replace(tmp, out)  # replaces the empty folder just made
    except OSError:
        with contextlib.suppress(OSError):
            out.rmdir()
        if keep_existing and out.exists():
            shutil.rmtree(tmp, ignore_errors=True)
            return
        raise Claimed(
            f"'{out}' was written by another process while this ran; nothing was written."
        ) from None


def optional(
    what: str,
    step: Callable[[], object],
    record: dict,
    key: str,
    say: Callable[[str], None] | None = None,
):
    """Run ``step()``, whose failure must not lose finished work (a figure, a page).

    On failure: ``record[key]`` holds ``"<what>: <Error>: <message>"``, ``say`` hears one line,
    and None is returned; the caller goes on writing everything else. Interrupts are not caught,
    and neither is an ``OSError`` (a full disk, a folder that vanished): that is a failure to write,
    not a figure that cannot be drawn, and the whole output is abandoned as usual.
    """
    try:
        return step()
    except OSError:
        raise
    except Exception as exc:
        note = (
            f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(
                ": "
            )
        )
        record[key] = note
        if say is not None:
            say(f"{what} could not be made ({type(exc).__name__}: {exc}); everything else was kept")
        return None


#: The figure formats headscope writes (``--figure-format``): PNG for the screen and the page,
#: SVG and PDF for papers, with their text kept as text (searchable, not outlined).
FIGURE_FORMATS = ("png", "svg", "pdf")
#: Vector text as text: SVG ``<text>`` elements, PDF TrueType (type 42) fonts, not glyph outlines.
VECTOR_TEXT = {"svg.fonttype": "none", "pdf.fonttype": 42}


def figure_formats(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"png,svg"`` or ``["png", "svg,pdf"]`` -> ``("png", "svg", "pdf")``, in order, once each.

    None or nothing gives ``("png",)``. Names match without case and a leading dot; anything else
    is refused in one line.

    >>> figure_formats("SVG,pdf"), figure_formats(["png", "svg,png"]), figure_formats(None)
    (('svg', 'pdf'), ('png', 'svg'), ('png',))
    >>> figure_formats("jpg")
    Traceback (most recent call last):
    ...
    headscope.errors.HeadscopeError: Unknown figure format 'jpg' (--figure-format). Did you...
    """
    items = [value] if isinstance(value, str) else list(value or ())
    out: list[str] = []
    for item in items:
        for name in str(item).split(","):
            fmt = name.strip().lower().lstrip(".")
            if not fmt:
                continue
            if fmt not in FIGURE_FORMATS:
                raise HeadscopeError(
                    f"Unknown figure format '{name.strip()}' (--figure-format)."
                    f"{did_you_mean(fmt, FIGURE_FORMATS)} Choose from {', '.join(FIGURE_FORMATS)}."
                )
            if fmt not in out:
                out.append(fmt)
    return tuple(out) or ("png",)


def figure_files(path: Path, formats: Sequence[str] | None = None) -> list[Path]:
    """The files :func:`save_figure` writes for ``path``: ``path`` itself without ``formats``,
    else its stem once per format (``kvplan.png``, ``("png", "svg")``: kvplan.png, kvplan.svg)."""
    path = Path(path)
    if formats is None:
        return [path]
    return [path.with_suffix(f".{fmt}") for fmt in figure_formats(formats)]


def save_figure(fig, path: Path, dpi: int = 110, formats: Sequence[str] | None = None) -> Path:
    """Save a matplotlib Figure atomically, tagged as headscope's (PNG ``Software``, SVG and PDF
    ``Creator``); return the first file written.

    Without ``formats`` the format is ``path``'s suffix; with them, one file per format named by
    :func:`figure_files` (all drawn from this one Figure, so they show the same thing). Vector
    files keep their text as text (:data:`VECTOR_TEXT`)."""
    from matplotlib import rc_context

    paths = figure_files(path, formats)
    for target in paths:
        fmt = target.suffix.lstrip(".").lower() or "png"
        # PNG: a Software text chunk; SVG: <dc:creator>...<dc:title>; PDF: /Creator
        meta = dict(PNG_METADATA) if fmt == "png" else {"Creator": SOFTWARE}
        if fmt in ("svg", "pdf"):  # no timestamp: the same figure gives the same file
            meta["Date" if fmt == "svg" else "CreationDate"] = None

        def write(tmp: Path, fmt=fmt, meta=meta) -> None:
            with rc_context(VECTOR_TEXT):
                fig.savefig(tmp, dpi=dpi, format=fmt, metadata=meta)

        write_atomic(target, write)
    return paths[0]
