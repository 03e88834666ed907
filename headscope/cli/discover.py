"""``headscope discover``: its options are the fields of
:class:`~headscope.apps.settings.DiscoverSettings` (:mod:`headscope.cli.options`), plus the task,
the scan read beside it, where the run goes and how loud it is. Wiring only: the work and every
check are :func:`headscope.apps.discover.discover_to_dir`'s."""

from __future__ import annotations

import click

from headscope.apps.settings import DiscoverSettings
from headscope.cli.options import run_task, task_run_options


@click.command(
    epilog="Example: headscope discover smollm2-135m --task ioi --out runs/ioi-edges. "
    "headscope discover gemma3-270m --task pairs.jsonl --methods eap --edges 'L3H1->L9H0.q' "
    "--out runs/mine."
)
@click.argument("model_name", metavar="MODEL")
@task_run_options(
    DiscoverSettings,
    "discovery run",
    "the curve and circuit figures",
    "A `headscope scan` run of the same model: its pattern scores go beside each head's node "
    "score.",
)
def discover(model_name, **typed) -> None:
    """Find MODEL's circuit on a task: every edge scored, the top edges patched exactly, the
    faithfulness curve against random circuits.

    An edge is a writer (the embedding, a head's output, an MLP's output) feeding a reader (a
    head's query, key or value input, an MLP's input, the logits) through the residual stream.
    Each is scored by edge attribution patching (EAP) and its integrated-gradients form (EAP-IG)
    with an interval over pairs; the top edges by each are patched exactly; the top edges at
    log-spaced sizes are run as circuits (every other edge cut) against random circuits of the
    same sizes (CPR, CMD).
    """
    from headscope.apps.discover import discover_to_dir

    run_task(discover_to_dir, DiscoverSettings, model_name, **typed)
