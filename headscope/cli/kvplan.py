"""``headscope kvplan``: a KV-cache plan from a scan, verified by running the model (wiring only;
the work is :func:`headscope.apps.kvplan.plan_to_dir`)."""

from __future__ import annotations

import click

from headscope.errors import HeadscopeError

#: PlanSettings' defaults, repeated here so that ``--help`` loads no torch; tests/cli check they agree.
DEFAULTS = {"budgets": (0.25, 0.5, 0.75), "seeds": 3, "sinks": 4, "window": 64, "seq_len": 2048, "n_texts": 2,
            "depths": (0.1, 0.3, 0.5, 0.7, 0.9), "needles_per_depth": 2, "needle_tokens": 8, "scan_sequences": 8,
            "scan_bootstrap": 200}


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise HeadscopeError(f"{what} must be numbers separated by commas, e.g. 0.25,0.5,0.75; got '{text}'.") from None
    if not values:
        raise HeadscopeError(f"{what} is empty; give numbers separated by commas, e.g. 0.25,0.5,0.75.")
    return values


def _csv(values) -> str:
    return ",".join(f"{v:g}" for v in values)


@click.command(epilog="Quick look (SmolLM2-135M on 2 CPU cores, about 15 minutes): headscope kvplan "
               "smollm2-135m --seq-len 512 --seeds 1 --out runs/kv512. The default (2,048 tokens, 3 seeds) "
               "runs 15 verified conditions and takes about an hour on the same machine.")
@click.argument("source")
@click.option("--out", default=None, type=click.Path(), help="With a MODEL: the run directory to scan into "
              "[default: runs/<model>-long]. The plan goes to <run>/kvplan/.")
@click.option("--budgets", default=_csv(DEFAULTS["budgets"]), show_default=True,
              help="Shares of the heads to restrict to sinks + window, in 0..1.")
@click.option("--seeds", type=int, default=DEFAULTS["seeds"], show_default=True,
              help="Random head sets per budget: the baseline the plan must beat.")
@click.option("--sinks", type=int, default=DEFAULTS["sinks"], show_default=True,
              help="First tokens a restricted head still sees (attention sinks).")
@click.option("--window", type=int, default=DEFAULTS["window"], show_default=True,
              help="Most recent tokens a restricted head still sees.")
@click.option("--seq-len", type=int, default=DEFAULTS["seq_len"], show_default=True,
              help="Length of the held-out texts and needles (and of a MODEL's scan).")
@click.option("--texts", type=int, default=DEFAULTS["n_texts"], show_default=True,
              help="Held-out prose sequences the loss is measured on.")
@click.option("--depths", default=_csv(DEFAULTS["depths"]), show_default=True,
              help="Needle depths, fractions of the haystack.")
@click.option("--needles-per-depth", type=int, default=DEFAULTS["needles_per_depth"], show_default=True,
              help="Needles at each depth (greedy decoding of each, all tokens right to count).")
@click.option("--needle-tokens", type=int, default=DEFAULTS["needle_tokens"], show_default=True,
              help="Random tokens in each needle.")
@click.option("--scan-sequences", type=int, default=DEFAULTS["scan_sequences"], show_default=True,
              help="With a MODEL: long prose sequences its long-context scan reads to choose the heads.")
@click.option("--scan-bootstrap", type=int, default=DEFAULTS["scan_bootstrap"], show_default=True,
              help="With a MODEL: bootstrap resamples of that scan (its scores' intervals).")
@click.option("--threads", type=int, default=None, help="torch CPU threads. [default: torch's choice]")
@click.option("--force", is_flag=True, help="Replace an earlier plan (and, with a MODEL, an earlier run at --out).")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def kvplan(source, out, budgets, seeds, sinks, window, seq_len, texts, depths, needles_per_depth, needle_tokens,
           scan_sequences, scan_bootstrap, threads, force, quiet) -> None:
    """Choose heads to restrict to a sink + window KV cache, and check each plan by running the model.

    SOURCE is a run directory scanned with --long-context (its streaming and retrieval scores choose
    the heads), or a model: a name or a checkpoint folder (scanned first, with --long-context at
    --seq-len, into --out, once the plan's own inputs are known to fit).
    Writes kvplan.csv, kvplan.md, kvplan.json and kvplan.png to <run>/kvplan/.
    """
    from headscope.apps import kvplan as kv
    from headscope.errors import at_least

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"headscope: {msg}", err=True)

    settings = kv.PlanSettings(budgets=_floats(budgets, "--budgets"), seeds=seeds, sinks=sinks, window=window,
                               seq_len=seq_len, n_texts=texts, depths=_floats(depths, "--depths"),
                               needles_per_depth=needles_per_depth, needle_tokens=needle_tokens,
                               scan_sequences=scan_sequences, scan_bootstrap=scan_bootstrap).validate()
    at_least("threads", threads)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    df, target = kv.plan_to_dir(source, out, settings, force=force, say=say)
    click.echo(kv.summary(df).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    click.echo(f"wrote {target}/ ({', '.join(n for n in kv.FILES if (target / n).is_file())})")
