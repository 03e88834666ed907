"""What the commands on a task's prompt pairs share (``headscope patch``, ``headscope circuit``):
the model check, a scan read beside the run, and the whole command as one function
(:func:`task_run_to_dir`), so a new command on a task is its own work plus one call.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from headscope.errors import HeadscopeError, listening, setting

if TYPE_CHECKING:  # pragma: no cover - pandas is imported where a table is read
    import pandas as pd

#: Scan scores shown beside each head's effect (those the scan has).
PATTERN_SCORES = ("induction", "previous_token", "duplicate_token", "sink", "copying")


def check_model(model) -> None:
    """One line for a model patching cannot read (an encoder, no LM head, rescaled logits)."""
    from headscope.effects.readout import check_logits
    from headscope.probes.tasks import check_model as check_decoder

    check_decoder(model)
    check_logits(model)


# ------------------------------------------------------------------------------ beside a scan


def scan_scores(run_dir: str | Path) -> tuple[pd.DataFrame, dict]:
    """The pattern scores of a scan's run directory (one row per metric and head, the metrics of
    :data:`PATTERN_SCORES` it has) and its metadata; one line when it is not a scan run."""
    from headscope.rundir.store import is_run_dir, load_run

    path = Path(run_dir)
    if not is_run_dir(path):
        raise HeadscopeError(
            f"--scan '{run_dir}' is not a headscope scan run directory (no scores.csv with its "
            "metadata.json); give a folder written by `headscope scan`."
        )
    run = load_run(path)
    s = run.scores
    s = s[s["metric"].isin(PATTERN_SCORES)]
    cols = [
        c
        for c in ("metric", "layer", "head", "head_name", "score", "ci_low", "ci_high", "label")
        if c in s.columns
    ]
    return s[cols].reset_index(drop=True), run.metadata


def check_same_model(model, scan_meta: dict, run_dir) -> None:
    """Refuse a scan of another model (its weights' sha256, else its name, and its shape)."""
    from headscope.rundir.record import source_record

    src = scan_meta.get("source") or {}
    mine = source_record(model)
    shape = (scan_meta.get("n_layers"), scan_meta.get("n_heads"))
    if shape != (model.n_layers, model.n_heads):
        raise HeadscopeError(
            f"--scan '{run_dir}' is a run of {scan_meta.get('model')} ({shape[0]} layers x "
            f"{shape[1]} heads), not of {model.name} ({model.n_layers} x {model.n_heads}); give a "
            "scan of the same model."
        )
    for key in ("weights_sha256", "state_dict_sha256"):
        if src.get(key) and mine.get(key):
            if src[key] != mine[key]:
                raise HeadscopeError(
                    f"--scan '{run_dir}' is a run of other weights ({key} {src[key][:12]}..., "
                    f"{model.name}'s is {mine[key][:12]}...); give a scan of the same model."
                )
            return
    if scan_meta.get("model") != model.name:
        raise HeadscopeError(
            f"--scan '{run_dir}' is a run of {scan_meta.get('model')}, not of {model.name}; "
            "give a scan of the same model."
        )


# ------------------------------------------------------------------------------ the whole command


def task_run_to_dir(
    kind,
    settings_type,
    work: Callable,
    save: Callable,
    model_name,
    task,
    out: str | Path,
    config=None,
    *,
    scan: str | Path | None = None,
    tokenizer=None,
    force: bool = False,
    figures: bool = True,
    say: Callable[[str], None] | None = None,
    figure_formats=None,
    before_loading: Callable | None = None,
    **settings,
):
    """A command on a task (``headscope patch``, ``headscope circuit``), checked first and written
    last.

    Before the model loads: ``config`` (a ``settings_type``) with the keyword ``settings``
    applied, ``out`` (a run of ``kind`` may be written there), the task (a kit name, a file read
    now; a kit's ``templates`` only for a kit), ``--scan`` (a scan run directory), the model's
    name, then ``before_loading(config, model_name)``. Then the model (``config``'s device, dtype
    and threads), refused in one line if patching cannot read it or the scan is of another model;
    then ``work(model, task, config, pattern, say)`` (``pattern``: the scan's scores, or None) and
    ``save(result, out, force=, figures=, say=, started=, figure_formats=)``. Nothing is written
    unless the run succeeds. Returns the result, its record holding the load time and the scan
    read beside it."""
    from headscope.models.loading import load_model
    from headscope.models.placement import threads
    from headscope.models.sources import resolve
    from headscope.probes.kits import check_task
    from headscope.rundir.store import check_out_dir

    started = time.perf_counter()
    config = settings_type.configure(config, settings)
    say = say or (lambda _m: None)
    out = Path(out)
    with listening(say):
        check_out_dir(out, force, kind)
        checked = check_task(task)
        if not isinstance(checked, str) and config.templates:
            raise HeadscopeError(
                f"{setting('templates')} choose a kit's templates; '{task}' is a file of pairs."
            )
        pattern, scan_meta = scan_scores(scan) if scan is not None else (None, None)
        if isinstance(model_name, (str, os.PathLike)):
            resolve(str(model_name))  # a typo is answered before any loading
        if before_loading is not None:
            before_loading(config, model_name)
        with threads(config.threads):
            t0 = time.perf_counter()
            model = load_model(
                model_name, tokenizer, device=config.device, dtype=config.dtype, progress=say
            )
            t_load = time.perf_counter() - t0
            check_model(model)
            if scan_meta is not None:
                check_same_model(model, scan_meta, scan)
            say(
                f"{kind.command}: {model.n_layers} layers x {model.n_heads} heads of {model.name} "
                f"on {model.device}"
            )
            result = work(model, checked, config, pattern, say)
            result.metadata["timings"] = {"load_s": round(t_load, 3), **result.metadata["timings"]}
            if scan_meta is not None:
                result.metadata["scan"] = {
                    "run_dir": str(Path(scan).resolve()),
                    "model": scan_meta.get("model"),
                    "source": scan_meta.get("source"),
                    "metrics": sorted(pattern["metric"].unique()),
                }
            save(result, out, force=force, figures=figures, say=say, started=started,
                 figure_formats=figure_formats)  # fmt: skip
    return result
