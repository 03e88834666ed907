"""The hooks engine: every layer's full pattern from transformer-lens' ``hook_pattern``.

The reference the other engines are tested against: the model runs through a transformer-lens
``TransformerBridge`` (eager attention, so any softmax change the model makes is in the pattern),
and each layer's ``[batch, head, query, key]`` pattern is handed to the metrics inside its hook and
dropped before the next layer runs (:meth:`headscope.models.model.Model.run_patterns`). Costs an
eager forward, a second copy of the model, and one layer's patterns in memory.
"""

from __future__ import annotations

from headscope.engines.base import Engine
from headscope.errors import HeadscopeError
from headscope.metrics.rows import DenseRows


class HooksEngine(Engine):
    name = "hooks"
    summary = (
        "transformer-lens hook_pattern: each layer's full pattern (eager attention), the reference"
    )
    reads_model_attention = True
    takes_interventions = False  # its forward is transformer-lens', not headscope's seam

    def unavailable(self, model, metrics):
        if not model.has_bridge:
            return "this model has no transformer-lens bridge"
        try:
            # built once, on first use; an architecture transformer-lens lacks is said here
            _ = model.bridge
        except HeadscopeError:
            return model._bridge_error or "this model has no transformer-lens bridge"
        return None

    def run(
        self, model, tokens, mask, batch, on_rows, layers=None, interventions=(), token_types=None
    ) -> None:
        if interventions:
            raise HeadscopeError(
                "The hooks engine runs transformer-lens' forward and cannot apply interventions; "
                "use --engine blocked."
            )
        ours: list[BaseException] = []

        def on_pattern(layer, pattern):  # [batch, head, query, key]; bf16/fp16 are scored in fp32
            try:
                on_rows(layer, DenseRows(pattern.float()), 0)
            except BaseException as exc:  # headscope's own failure: passed on unchanged below
                ours.append(exc)
                raise

        try:
            model.run_patterns(tokens, mask, on_pattern, layers, token_types)
        except HeadscopeError:
            raise
        except Exception as exc:
            if any(exc is e for e in ours):
                raise
            # transformer-lens' own forward failed on this architecture: one line, not its traceback
            what = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
            hint = "; use --engine blocked" if model.attention_interface else ""
            raise HeadscopeError(
                f"transformer-lens' forward failed on {model.name} ({what}){hint}."
            ) from exc


ENGINE = HooksEngine()
