"""``headscope patch``: its options are the fields of
:class:`~headscope.apps.settings.PatchSettings` (:mod:`headscope.cli.options`), plus the task, the
scan read beside it, where the run goes and how loud it is. Wiring only: the work and every check
are :func:`headscope.apps.patch.patch_to_dir`'s."""

from __future__ import annotations

import click

from headscope.apps.settings import PatchSettings
from headscope.cli.options import run_task, task_run_options


@click.command(
    epilog="Example: headscope patch smollm2-135m --task ioi --activations z,v --positions "
    'all,S2,END --out runs/ioi. A task file is JSONL ({"clean", "corrupt", "answer", '
    '"wrong"[, "positions"]} a line) or TSV with a header clean, corrupt, answer, wrong.'
)
@click.argument("model_name", metavar="MODEL")
@task_run_options(
    PatchSettings,
    "patching run",
    "the heatmap files",
    "A `headscope scan` run of the same model: its pattern scores go beside each head's effect.",
)
def patch(model_name, **typed) -> None:
    """Patch every attention head of MODEL between clean and corrupt prompts; write a run directory.

    MODEL is any model `headscope scan` takes (a decoder with an LM head). Each head's output (and,
    with --activations, its query, key, value or pattern) is patched from one prompt of a pair into
    the other; the effect is the share of the metric's clean-corrupt gap restored (denoising) or
    destroyed (noising), with a bootstrap interval over pairs.
    """
    from headscope.apps.patch import patch_to_dir

    run_task(patch_to_dir, PatchSettings, model_name, **typed)
