"""``headscope kvplan``: a KV-cache plan from a scan, verified by running the model (wiring only;
the work is in :mod:`headscope.kvplan`)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import click

from headscope.errors import HeadscopeError
from headscope.kvplan import PlanSettings

DEFAULT = PlanSettings()


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise HeadscopeError(f"{what} must be numbers separated by commas, e.g. 0.25,0.5,0.75; got '{text}'.") from None
    if not values:
        raise HeadscopeError(f"{what} is empty; give numbers separated by commas, e.g. 0.25,0.5,0.75.")
    return values


@click.command()
@click.argument("source")
@click.option("--out", default=None, type=click.Path(), help="With a MODEL: the run directory to scan into "
              "[default: runs/<model>-long]. The plan goes to <run>/kvplan/.")
@click.option("--budgets", default=",".join(f"{b:g}" for b in DEFAULT.budgets), show_default=True,
              help="Shares of the heads to restrict to sinks + window, in 0..1.")
@click.option("--seeds", type=int, default=DEFAULT.seeds, show_default=True, help="Random baselines per budget.")
@click.option("--sinks", type=int, default=DEFAULT.sinks, show_default=True)
@click.option("--window", type=int, default=DEFAULT.window, show_default=True)
@click.option("--seq-len", type=int, default=DEFAULT.seq_len, show_default=True,
              help="Length of the held-out texts and needles (and of a MODEL's scan).")
@click.option("--texts", type=int, default=DEFAULT.n_texts, show_default=True, help="Held-out prose sequences (loss).")
@click.option("--depths", default=",".join(f"{d:g}" for d in DEFAULT.depths), show_default=True,
              help="Needle depths, fractions of the haystack.")
@click.option("--needles-per-depth", type=int, default=DEFAULT.needles_per_depth, show_default=True)
@click.option("--needle-tokens", type=int, default=DEFAULT.needle_tokens, show_default=True)
@click.option("--threads", type=int, default=None, help="torch CPU threads.")
@click.option("--force", is_flag=True, help="Replace an earlier plan (and, with a MODEL, an earlier run at --out).")
@click.option("--quiet", "-q", is_flag=True)
def kvplan(source, out, budgets, seeds, sinks, window, seq_len, texts, depths, needles_per_depth, needle_tokens,
           threads, force, quiet) -> None:
    """Choose heads to restrict to a sink + window KV cache, and check each plan by running the model.

    SOURCE is a run directory scanned with --long-context (its streaming and retrieval scores choose
    the heads), or a model: a name or a checkpoint folder (scanned first, with --long-context at
    --seq-len, into --out, once the plan's own inputs are known to fit).
    Writes kvplan.csv, kvplan.png, kvplan.md and kvplan.json to <run>/kvplan/.
    """
    import torch

    from headscope import kvplan as kv
    from headscope.rundir import KVPLAN, is_kvplan_dir, is_run_dir, load_run

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"headscope: {msg}", err=True)

    settings = PlanSettings(budgets=_floats(budgets, "--budgets"), seeds=seeds, sinks=sinks, window=window,
                            seq_len=seq_len, n_texts=texts, depths=_floats(depths, "--depths"),
                            needles_per_depth=needles_per_depth, needle_tokens=needle_tokens).validate()
    if threads is not None:
        torch.set_num_threads(threads)
    src = Path(source)
    from_run = src.is_dir() and not (src / "config.json").is_file()  # a checkpoint folder is a model
    if from_run:
        if not is_run_dir(src):
            raise HeadscopeError(f"'{source}' is a folder but neither a headscope run directory nor a model "
                                 "checkpoint (no config.json); give a run scanned with --long-context, or a model.")
        if out is not None:
            raise HeadscopeError("--out is for a MODEL source; a run's plan goes into <run>/kvplan/.")
        run_dir = src
    else:
        run_dir = Path(out) if out is not None else Path("runs") / f"{src.name.replace('/', '-')}-long"
    target = run_dir / KVPLAN
    if target.exists() or target.is_symlink():
        if not force:
            raise HeadscopeError(f"'{target}' already exists; pass --force to replace that plan.")
        if not is_kvplan_dir(target):
            raise HeadscopeError(f"'{target}' holds files headscope did not write; move it first.")
    if from_run:
        result = load_run(run_dir)
        model_name = result.metadata.get("model") or result.model_name
        kv.ranking(result.scores)  # a run without streaming scores is refused before the model loads
        from headscope.loading import load_model

        say(f"loading {model_name}")
        model = load_model(model_name, progress=say)
        inputs = kv.plan_inputs(model, settings)  # what the plan needs, refused before any forward pass
    else:
        from headscope.config import ScanConfig
        from headscope.loading import load_model
        from headscope.runner import scan_to_dir

        config = ScanConfig(long_context=True, seq_len=seq_len, sinks=sinks, window=window,
                            needle_tokens=needle_tokens, metrics=("streaming", "retrieval", "retrieval_soft"),
                            n_prompts=8, bootstrap=200)
        config.validate()
        model = load_model(source, progress=say)
        inputs = kv.plan_inputs(model, settings)  # refused here, before the scan writes its run directory
        result = scan_to_dir(model, run_dir, config, force=force, say=say)
    df = kv.kv_plan(model, result.scores, settings, say=say, inputs=inputs)
    plans = kv.plan_heads(result.scores, settings.budgets)
    meta = {"run": str(run_dir), "model_provenance": model.provenance}
    tmp = Path(tempfile.mkdtemp(prefix=".kvplan-", dir=run_dir))
    try:
        kv.save(df, tmp, settings, model.name, plans, meta)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    click.echo(kv.summary(df).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    click.echo(f"wrote {target}/ (kvplan.csv, kvplan.png, kvplan.md, kvplan.json)")
