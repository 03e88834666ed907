"""The settings of a circuit run (``headscope circuit``, :func:`headscope.apps.circuit.circuit`),
checked once when made. Light: no torch, so ``headscope circuit --help`` and a refused setting are
instant."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from headscope.apps.patch import template_indices
from headscope.effects.settings import PATCH_DIRECTIONS
from headscope.errors import HeadscopeError, at_least, did_you_mean, setting
from headscope.models.sources import check_dtype
from headscope.probes.tasks import METRICS
from headscope.scanner.config import opt
from headscope.uncertainty import check as check_bootstrap

#: chosen: an attribution estimate beside every exact path; all: also every head's q, k and v as a
#: receiver of every earlier head (first order only); none.
ATTRIBUTION = ("chosen", "all", "none")
N_PAIRS = 32


@dataclass(frozen=True)
class CircuitConfig:
    """Everything a circuit run is made with but the model and the task."""

    receivers: tuple | None = opt(
        None,
        "Receivers, comma-separated: logits, or a head's input LAYERhHEAD.KIND[@POSITION] "
        "(KIND q, k or v; POSITION a named position of the task, shifted like S1+1, or all), "
        "e.g. L9H1.q@END. [default: for IOI, the classes' receivers (logits, then the name "
        "movers' queries at END, the S-inhibition heads' values at S2, the induction heads' "
        "keys at S1+1); for other tasks, logits and the queries at END of the 5 heads with the "
        "largest direct effect]",
        kind="csv",
    )
    senders: tuple | None = opt(
        None,
        "Senders, comma-separated head names (L3H0). [default: every head below each receiver]",
        kind="csv",
    )
    direction: str = opt(
        "noising",
        "noising (the sender's output from the corrupt prompt into the clean run: share of the "
        "gap destroyed) or denoising (clean into corrupt: share restored).",
        choices=PATCH_DIRECTIONS,
    )
    freeze_mlps: bool = opt(
        False, "Freeze every MLP at its base output too (default: MLPs recompute)."
    )
    attribution: str = opt(
        "chosen",
        "First-order estimates: chosen (beside every exact path), all (also every head's q, k "
        "and v from every earlier head) or none.",
        choices=ATTRIBUTION,
    )
    composition: bool = opt(
        True, "Q-, K- and V-composition of every head pair from the weights, with their null."
    )
    n_null: int = opt(32, "Random sender matrices per receiver for the composition null.")
    top_k: int = opt(5, "Senders compared between composition and path patching (top-k overlap).")
    edge_threshold: float = opt(0.05, "|Path effect| drawn as an edge of the circuit diagram.")
    direct: float = opt(0.05, "Class rule: |direct effect| of a (negative) name mover.")
    attention: float = opt(0.1, "Class rule: END -> IO attention of a name mover.")
    copying: float = opt(0.5, "Class rule: copying score of a name mover.")
    path: float = opt(0.05, "Class rule: path effect into a class's receivers.")
    pattern: float = opt(0.4, "Class rule: induction / duplicate-token / previous-token score.")
    metric: str | None = opt(
        None,
        "Read at the last position: logit_diff, prob or loss. [default: the task's]",
        choices=METRICS,
    )
    n_pairs: int | None = opt(
        None,
        f"Pairs: drawn from a kit, or the first N of a file. [default: {N_PAIRS} from a kit, "
        "every pair of a file]",
    )
    templates: tuple | None = opt(
        None, "A kit's templates to draw from, comma-separated indices. [default: all]", kind="csv"
    )
    seed: int = opt(0, "Seed of a kit's pairs, the composition null and the bootstrap.")
    bootstrap: int = opt(1000, "Resamples of the pairs for every interval (0: none).")
    ci: float = opt(0.95, "Coverage of the intervals.")
    batch_size: int = opt(32, "Pairs per forward pass.")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N or mps.")
    dtype: str | None = opt(
        None, "Model weights dtype: float32, bfloat16 or float16. [default: float32]"
    )
    threads: int | None = opt(None, "CPU threads for torch. [default: torch's choice]")

    def __post_init__(self) -> None:
        def put(name, value):
            object.__setattr__(self, name, value)

        for name in ("receivers", "senders"):
            value = getattr(self, name)
            value = () if value is None else value
            items = value.split(",") if isinstance(value, str) else list(value)
            put(name, tuple(dict.fromkeys(str(v).strip() for v in items if str(v).strip())))
        put("direction", str(self.direction).strip().lower())
        put("attribution", str(self.attribution).strip().lower())
        put("templates", template_indices(self.templates))
        self._check()

    def _check(self) -> None:
        from headscope.circuits.receivers import Receiver, parse_head

        for name, allowed in (("direction", PATCH_DIRECTIONS), ("attribution", ATTRIBUTION)):
            value = getattr(self, name)
            if value not in allowed:
                raise HeadscopeError(
                    f"Unknown {setting(name)} '{value}'.{did_you_mean(value, allowed)} "
                    f"Use one of {', '.join(allowed)}."
                )
        for r in self.receivers:
            Receiver.parse(r)
        for s in self.senders:
            parse_head(s)
        if self.metric is not None and self.metric not in METRICS:
            raise HeadscopeError(
                f"Unknown {setting('metric')} '{self.metric}'."
                f"{did_you_mean(self.metric, METRICS)} Use one of {', '.join(METRICS)}."
            )
        for name in ("n_pairs", "batch_size", "threads", "n_null", "top_k"):
            at_least(name, getattr(self, name))
        for name in ("edge_threshold", "direct", "attention", "copying", "path", "pattern"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v >= 0:
                raise HeadscopeError(f"{setting(name)} must be a number >= 0, got {v!r}.")
        check_bootstrap(self.bootstrap, self.ci)
        check_dtype(self.dtype)

    def record(self) -> dict:
        """The settings as saved in ``metadata.json``."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def changed(self) -> dict:
        default = CircuitConfig().record()
        return {k: v for k, v in self.record().items() if v != default[k]}

    @classmethod
    def settings(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def configure(config: CircuitConfig | None, settings: dict) -> CircuitConfig:
    """``config`` with the keyword ``settings`` of the Python API applied (checked once)."""
    names = CircuitConfig.settings()
    unknown = [k for k in settings if k not in names]
    if unknown:
        raise HeadscopeError(
            f"Unknown setting '{unknown[0]}'.{did_you_mean(unknown[0], names)} "
            f"Settings: {', '.join(names)}."
        )
    settings = {k: (tuple(v) if isinstance(v, list) else v) for k, v in settings.items()}
    if config is None:
        return CircuitConfig(**settings)
    return replace(config, **settings) if settings else config
