"""``headscope circuit``: its options are the fields of
:class:`~headscope.apps.settings.CircuitSettings` (:mod:`headscope.cli.options`), plus the
task, the scan read beside it, where the run goes and how loud it is. Wiring only: the work and
every check are :func:`headscope.apps.circuit_run.circuit_to_dir`'s."""

from __future__ import annotations

import click

from headscope.apps.settings import CircuitSettings
from headscope.cli.options import run_task, task_run_options


@click.command(
    epilog="Example: headscope circuit smollm2-135m --task ioi --out runs/ioi-circuit (IOI: the "
    "name movers, S-inhibition, induction and previous-token heads, each by its rule). "
    "headscope circuit smollm2-135m --task pairs.jsonl --receivers logits,L20H1.k@S1+1 "
    "--out runs/mine. Measured on 2 shared CPU cores: all 270 SmolLM2 heads into the logits over "
    "32 pairs about 150 s; the whole IOI run about 40 min."
)
@click.argument("model_name", metavar="MODEL")
@task_run_options(
    CircuitSettings,
    "circuit run",
    "the diagram and agreement figures",
    "A `headscope scan` run of the same model: the classes read its induction, duplicate-token, "
    "previous-token and (with --effects) copying scores instead of measuring them.",
)
def circuit(model_name, **typed) -> None:
    """Which attention head of MODEL feeds which on a task: path patching, composition, classes.

    Each sender head's output, taken from the corrupt prompt of a pair, reaches only one receiver
    (the logits, or one head's query, key or value input) with every other head frozen; the
    effect is the share of the metric's clean-corrupt gap it destroys, with a bootstrap interval
    over pairs. Beside it: Q-, K- and V-composition of every head pair from the weights (z against
    random senders) and how well the two rankings agree.
    """
    from headscope.apps.circuit_run import circuit_to_dir

    run_task(circuit_to_dir, CircuitSettings, model_name, **typed)
