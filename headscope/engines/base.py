"""What an engine is: one way of turning a forward pass into per-row attention for the metrics.

An engine gets a padded batch and a callback. It runs one forward pass and, for each wanted layer,
calls ``on_rows(layer, rows, q_start)`` with that layer's attention as
:class:`~headscope.metrics.rows.Rows`: a pattern tensor, a block of its query rows starting at
``q_start``, or per-row statistics. Every engine gives the same scores (tested to 1e-5 against
each other); they differ in cost and in what they can run on.

Adding an engine is one file defining a subclass and ``ENGINE = MyEngine()``, plus one
``register(...)`` line in :mod:`headscope.engines.registry`. The registry's order is the order
``auto`` tries them in; the CLI's ``--engine`` choices and the "use --engine X" hints come from it
too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

    from headscope.metrics.base import Metric, PatternBatch
    from headscope.metrics.rows import Rows
    from headscope.models.model import Model

#: ``on_rows(layer, rows, q_start)``: one layer's attention, or a block of its query rows.
OnRows = Callable[[int, "Rows", int], None]


class Engine(ABC):
    """One way to read every head's attention during a forward pass."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line: how it works (``headscope engines``, --help)
    #: Reads the pattern the model's own attention computes, whatever its softmax adds
    #: (soft-capping, learned sinks, position biases). Engines that recompute ``softmax(q k^T)``
    #: refuse such models and point to one that does.
    reads_model_attention: ClassVar[bool] = False
    #: Can run a forward with interventions (:mod:`headscope.models.attention`) applied: a scan of a
    # model : with some heads ablated or restricted.
    takes_interventions: ClassVar[bool] = True

    def unavailable(self, model: Model, metrics: Sequence[Metric]) -> str | None:
        """Why this engine cannot score ``metrics`` on ``model`` here, in a few words (None: it
        can)."""
        return None

    def auto_unavailable(self, model: Model, metrics: Sequence[Metric]) -> str | None:
        """Why ``auto`` passes this engine over (default: :meth:`unavailable`): an engine that runs
        when named but is not the one to choose here (FlexAttention uncompiled on the CPU) says
        so."""
        return self.unavailable(model, metrics)

    @abstractmethod
    def run(
        self,
        model: Model,
        tokens: Tensor,
        mask: Tensor,
        batch: PatternBatch,
        on_rows: OnRows,
        layers: Sequence[int] | None = None,
        interventions: Sequence = (),
        token_types: Tensor | None = None,
    ) -> None:
        """One forward over ``tokens`` ``[batch, pos]`` (``mask`` True on real tokens,
        ``token_types`` the encoder segment ids when given), with ``interventions`` applied;
        ``on_rows`` for every
        wanted layer (default: all). The forward may stop after the last wanted layer."""

    def __repr__(self) -> str:
        return f"<{self.name} engine>"
