"""Engines: the ways headscope reads attention during a forward pass, behind one registry.

=========  =====================================================================================
fused      a C++ kernel replaces each layer's attention: output plus per-row statistics, one pass
blocked    the model's sdpa for outputs, exact ``softmax`` pattern blocks a few query rows at a time
hooks      transformer-lens ``hook_pattern`` (eager attention), the reference
=========  =====================================================================================

``auto`` takes the first registered engine that can run (model, device, metrics); a named engine
that cannot run says why and names the first one that can. Engines are registered by import path
and imported on first use, so listing them (``--help``) loads no torch.

>>> engine_names()
['fused', 'flex', 'blocked', 'hooks']
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import import_module
from typing import TYPE_CHECKING

from headscope.engines.base import Engine
from headscope.errors import HeadscopeError, did_you_mean

if TYPE_CHECKING:  # pragma: no cover
    from headscope.metrics.base import Metric


AUTO = "auto"
_REGISTRY: dict[str, Engine | str] = {}


def register(name: str, engine: Engine | str) -> None:
    """Add an engine (an instance, or the module path of one defining ``ENGINE``); ``auto`` tries
    engines in registration order. A second engine of the same name is refused."""
    if name in _REGISTRY or name == AUTO:
        raise ValueError(f"An engine named '{name}' is already registered.")
    _REGISTRY[name] = engine


def engine_names() -> list[str]:
    """Registered engines, in the order ``auto`` tries them."""
    return list(_REGISTRY)


def get_engine(name: str) -> Engine:
    """The engine called ``name`` (imported on first use); an unknown name gets a did-you-mean."""
    if name not in _REGISTRY:
        raise HeadscopeError(
            f"Unknown engine '{name}'.{did_you_mean(name, [AUTO, *_REGISTRY])} "
            f"Known: {', '.join([AUTO, *_REGISTRY])}."
        )
    entry = _REGISTRY[name]
    if isinstance(entry, str):
        try:
            entry = _REGISTRY[name] = import_module(entry).ENGINE
        # a plug-in that cannot load is one line, not a traceback
        except (ImportError, AttributeError) as exc:
            raise HeadscopeError(
                f"The {name} engine cannot be loaded from {entry} ({exc})."
            ) from None
    return entry


def model_attention_engines() -> list[str]:
    """Engines that read the model's own attention, whatever its softmax adds (the refusal hint)."""
    names = []
    for n in _REGISTRY:
        try:
            if get_engine(n).reads_model_attention:
                names.append(n)
        except HeadscopeError:
            continue
    return names


def resolve_engine(
    model, name: str = AUTO, metrics: Sequence[Metric] = (), interventions: bool = False
) -> Engine:
    """The engine ``name`` (``auto``: the first that can run), or one clear line saying why not.
    ``interventions``: the scan applies some (then only engines that take them can run)."""

    def why_not(engine: Engine, auto: bool = True) -> str | None:
        if interventions and not engine.takes_interventions:
            return "it cannot apply interventions"
        return (
            engine.auto_unavailable(model, metrics) if auto else engine.unavailable(model, metrics)
        )

    if name != AUTO:
        engine = get_engine(name)
        reason = why_not(engine, auto=False)
        if reason is None:
            return engine
        alternative = next((e for e in _usable() if e.name != name and why_not(e) is None), None)
        hint = f"; use --engine {alternative.name}" if alternative is not None else ""
        raise HeadscopeError(f"The {name} engine cannot run here: {reason}{hint}.")
    reasons = []
    for engine_name in engine_names():
        try:
            engine = get_engine(engine_name)
        except HeadscopeError as exc:  # a plug-in that cannot load: auto moves on
            reasons.append(str(exc))
            continue
        reason = why_not(engine)
        if reason is None:
            return engine
        reasons.append(f"{engine.name}: {reason}")
    raise HeadscopeError(f"No engine can score this model here ({'; '.join(reasons)}).")


def _usable() -> list[Engine]:
    out = []
    for n in engine_names():
        try:
            out.append(get_engine(n))
        except HeadscopeError:
            continue
    return out


# The built-in engines, in the order `auto` tries them: one line per engine.
register("fused", "headscope.engines.fused")
register("flex", "headscope.engines.flex")
register("blocked", "headscope.engines.blocked")
register("hooks", "headscope.engines.hooks")

__all__ = [
    "AUTO",
    "Engine",
    "engine_names",
    "get_engine",
    "model_attention_engines",
    "register",
    "resolve_engine",
]
