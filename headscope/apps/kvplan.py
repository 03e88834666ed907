"""A KV-cache plan from a scan, checked by running the model.

StreamingLLM keeps a few initial "sink" tokens plus a recent window for every head. Some heads live
happily with that cache and some must see everything. A **plan** restricts a fraction of the heads
(the budget) to sinks + window: the heads whose ``streaming`` score is highest, heads labelled
``retrieval`` last. Each plan is then **verified** by running the model with those heads restricted
(their other keys masked, the kernel skipping their key tiles):

* next-token loss (nats) on held-out long prose (never the text the scan chose heads on);
* needle exact match: the needle probe's prompt on held-out prose, the ``K`` needle tokens decoded
  greedily (with a KV cache), all ``K`` right;

against full attention, the same number of heads chosen at random (several seeds), every head
restricted (StreamingLLM), and every head on a window of the same cache size without sinks (the
StreamingLLM ablation). Memory counts only KV heads every one of whose query heads is restricted
(grouped-query attention shares a KV head), as bytes of the K and V cache at the plan's length.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import pandas as pd
import torch

from headscope.apps.plan_settings import PlanSettings
from headscope.engines import kernel
from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall

HeadSet = frozenset  # of (layer, head)
DEFAULT_SETTINGS = PlanSettings()  # frozen, so one shared instance is a safe default


# ------------------------------------------------------------------------------ choosing heads


def ranking(scores: pd.DataFrame) -> list[tuple[int, int]]:
    """Heads in the order a plan restricts them: highest ``streaming`` score first; heads that
    pass the retrieval threshold after every other head."""
    s = scores[scores["metric"] == "streaming"]
    if s.empty or s["score"].isna().all():
        raise HeadscopeError(
            "The run has no streaming scores; scan with --long-context first (or give a model)."
        )
    table = s[["layer", "head", "score"]].rename(columns={"score": "streaming"})
    r = scores[scores["metric"] == "retrieval"][["layer", "head", "label"]]
    table = table.merge(r, on=["layer", "head"], how="left")
    table["retrieves"] = table["label"].fillna("").ne("")
    table = table.sort_values(
        ["retrieves", "streaming", "layer", "head"], ascending=[True, False, True, True]
    )
    return [(int(a), int(b)) for a, b in zip(table["layer"], table["head"], strict=True)]


def take(order: Sequence[tuple[int, int]], fraction: float) -> HeadSet:
    return HeadSet(order[: int(round(fraction * len(order)))])


def random_heads(n_layers: int, n_heads: int, count: int, seed: int) -> HeadSet:
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(n_layers * n_heads, generator=gen)[:count].tolist()
    return HeadSet((i // n_heads, i % n_heads) for i in pick)


def kv_saving(
    restricted: HeadSet,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    d_head: int,
    seq_len: int,
    kept: int,
    bytes_per: int = 4,
) -> dict:
    """KV heads whose every query head is restricted, and the cache bytes they no longer need.

    >>> heads = HeadSet({(0, 0), (0, 1), (0, 2)})  # heads 0, 1 share KV head 0
    >>> kv_saving(heads, 1, 4, 2, 8, 100, 10)["kv_heads_dropped"]
    1
    """
    group = n_heads // n_kv_heads
    dropped = sum(
        all((layer, g * group + j) in restricted for j in range(group))
        for layer in range(n_layers)
        for g in range(n_kv_heads)
    )
    per_head = 2 * seq_len * d_head * bytes_per  # K and V
    saved = dropped * (seq_len - min(kept, seq_len)) * 2 * d_head * bytes_per
    total = n_layers * n_kv_heads * per_head
    return {
        "kv_heads_dropped": int(dropped),
        "kv_saved_bytes": int(saved),
        "kv_saved_fraction": saved / total,
    }


# ------------------------------------------------------------------------------ running restricted


class Restricted:
    """An attention handler: the heads of ``heads`` (layer, head) see only keys ``k < sinks`` and
    ``q - window < k <= q``. On the CPU kernel their key tiles outside that band are skipped;
    elsewhere (a GPU, an additive mask) they get a per-head mask and the model's own attention."""

    def __init__(self, heads: HeadSet, n_heads: int, sinks: int, window: int):
        self.sinks, self.window = sinks, window
        self.by_layer: dict[int, torch.Tensor] = {}
        for layer, head in heads:
            self.by_layer.setdefault(layer, torch.zeros(n_heads, dtype=torch.bool))[head] = True

    def __call__(self, call: AttentionCall) -> torch.Tensor:
        heads = self.by_layer.get(call.layer)
        if heads is None:
            return call.output()
        if kernel.supports(call.query, call.mask) and not call.extras:
            out, _ = kernel.attention(
                call.query,
                call.key,
                call.value,
                call.mask,
                call.scale,
                call.causal,
                {},
                band=(self.sinks, self.window),
                restrict=heads,
            )
            return out.transpose(1, 2).contiguous()
        b, h, n_q, n_k = call.shape
        base = call.full_mask().expand(b, h, n_q, n_k)
        pos = torch.arange(n_q, device=call.query.device) + (n_k - n_q)
        k = torch.arange(n_k, device=call.query.device)
        band = (k[None, :] < self.sinks) | (pos[:, None] - k[None, :] < self.window)  # [query, key]
        mask = base.clone()
        mask[:, heads.to(mask.device)] &= band
        return call.with_mask(mask).output()


def text_loss(model, texts: Sequence[Sequence[int]], handler) -> float:
    """Mean next-token cross-entropy (nats) over positions 1..n-1 of every text."""
    total, count = 0.0, 0
    for ids in texts:
        x = torch.tensor([list(ids)])
        logits = model.run(x, handler=handler, output="logits")[0, :-1].float()
        target = x[0, 1:].to(logits.device)
        total += float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
        count += len(target)
    return total / count


def needle_accuracy(model, probe, handler) -> tuple[float, float]:
    """(share of needles decoded exactly, share of needle tokens decoded right at their place):
    greedy decoding with a KV cache from the prompt before the answer."""
    hits, tokens = 0, 0.0
    for ids, nd in zip(probe.sequences, probe.needles, strict=True):
        prompt = list(ids[: nd["answer_start"]])
        want = list(ids[nd["needle_start"] : nd["needle_start"] + nd["k"]])
        got = model.greedy(prompt, nd["k"], handler=handler)
        hits += got == want
        tokens += sum(a == b for a, b in zip(got, want, strict=True)) / len(want)
    return hits / len(probe.sequences), tokens / len(probe.sequences)


# ------------------------------------------------------------------------------ the plan


def plan_inputs(model, settings: PlanSettings, say: Callable[[str], None] | None = None):
    """The held-out texts and needle probe a plan is verified on: ``(texts, needles)``; one line
    when the model or the settings cannot make them (an encoder, attention headscope cannot
    restrict, a held-out corpus too short for ``n_texts`` sequences). Cheap: no forward pass, so
    ``headscope kvplan MODEL`` calls it before it scans anything."""
    from headscope.probes.long import long_text_probe, needle_probe

    settings.validate(model.n_ctx)
    if not model.causal:
        raise HeadscopeError(f"A KV-cache plan is for decoders; {model.name} is an encoder.")
    if not model.attention_interface:
        raise HeadscopeError(
            f"{model.name}: its attention does not run through transformers' "
            "attention interface, "
            "so heads cannot be restricted."
        )
    texts = long_text_probe(
        model, settings.seq_len, settings.n_texts, part="heldout", progress=say
    ).sequences
    needles = needle_probe(
        model,
        [settings.seq_len] * settings.needles_per_depth,
        settings.depths,
        settings.needle_tokens,
        seed=0,
        part="heldout",
        progress=say,
    )
    return texts, needles


def kv_plan(
    model,
    scores: pd.DataFrame,
    settings: PlanSettings = DEFAULT_SETTINGS,
    say: Callable[[str], None] | None = None,
    inputs=None,
) -> pd.DataFrame:
    """Every condition, verified: one row per (condition, budget, seed) with heads restricted, KV
    heads dropped, memory saved, loss, loss change and needle accuracy. ``inputs``: what
    :func:`plan_inputs` returned for this model and these settings (made here when None)."""
    say = say or (lambda _m: None)
    texts, needles = inputs if inputs is not None else plan_inputs(model, settings, say)
    order = ranking(scores)
    total = model.n_layers * model.n_heads
    every = HeadSet((la, h) for la in range(model.n_layers) for h in range(model.n_heads))
    s, w = settings.sinks, settings.window
    conditions = [
        ("full", 0.0, None, HeadSet(), s, w),
        ("streaming_all", 1.0, None, every, s, w),
        ("window_all", 1.0, None, every, 0, s + w),
    ]
    for b in settings.budgets:
        conditions.append(("plan", b, None, take(order, b), s, w))
        for seed in range(settings.seeds):
            conditions.append(
                (
                    "random",
                    b,
                    seed,
                    random_heads(model.n_layers, model.n_heads, int(round(b * total)), seed),
                    s,
                    w,
                )
            )
    rows = []
    for i, (name, budget, seed, heads, sinks, window) in enumerate(conditions):
        handler = Restricted(heads, model.n_heads, sinks, window) if heads else None
        t0 = time.perf_counter()
        loss = text_loss(model, texts, handler)
        acc, token_acc = needle_accuracy(model, needles, handler)
        seconds = time.perf_counter() - t0
        mem = kv_saving(
            heads,
            model.n_layers,
            model.n_heads,
            model.n_kv_heads,
            model.d_head,
            settings.seq_len,
            sinks + window,
        )
        rows.append(
            {
                "condition": name,
                "budget": budget,
                "seed": seed,
                "sinks": sinks,
                "window": window,
                "heads_restricted": len(heads),
                **mem,
                "loss": loss,
                "needle_acc": acc,
                "needle_token_acc": token_acc,
                "seconds": seconds,
            }
        )
        say(
            f"kvplan {i + 1}/{len(conditions)}: {name} budget {budget:g}"
            + (f" seed {seed}" if seed is not None else "")
            + f": loss {loss:.3f}, needles {acc:.0%}, KV saved {mem['kv_saved_fraction']:.0%} "
            f"({seconds:.0f} s)"
        )
    df = pd.DataFrame(rows)
    df["loss_delta"] = df["loss"] - float(df.loc[df["condition"] == "full", "loss"].iloc[0])
    return df


def plan_heads(scores: pd.DataFrame, budgets: Sequence[float]) -> dict[str, list[str]]:
    """The heads each budget restricts, by name (``L{layer}H{head}``), for the record."""
    order = ranking(scores)
    return {
        f"{b:g}": [f"L{la}H{h}" for la, h in order[: int(round(b * len(order)))]] for b in budgets
    }


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per budget: the plan against the mean (min..max) of its random baselines."""
    out = []
    for b, sub in df[df["condition"].isin(["plan", "random"])].groupby("budget"):
        plan = sub[sub["condition"] == "plan"].iloc[0]
        rnd = sub[sub["condition"] == "random"]
        out.append(
            {
                "budget": b,
                "heads": int(plan.heads_restricted),
                "kv_saved": plan.kv_saved_fraction,
                "plan_loss_delta": plan.loss_delta,
                "random_loss_delta": rnd.loss_delta.mean() if len(rnd) else math.nan,
                "random_loss_delta_max": rnd.loss_delta.max() if len(rnd) else math.nan,
                "plan_needle": plan.needle_acc,
                "random_needle": rnd.needle_acc.mean() if len(rnd) else math.nan,
                "random_kv_saved": rnd.kv_saved_fraction.mean() if len(rnd) else math.nan,
            }
        )
    return pd.DataFrame(out)


def figure(df: pd.DataFrame, model_name: str = "", seq_len: int | None = None):
    """Loss change and needle accuracy against the share of heads restricted: plan, random,
    baselines."""
    from headscope.report.curves import curve_panels

    full = df[df["condition"] == "full"]
    plan = df[df["condition"] == "plan"].sort_values("budget")
    rnd = df[df["condition"] == "random"]
    n_seeds = int(rnd["seed"].nunique()) if len(rnd) else 0
    panels = []
    for col, label in (
        ("loss_delta", "held-out loss change (nats)"),
        ("needle_acc", "needle exact match"),
    ):
        lines = [
            {
                "x": [0.0, *plan["budget"]],
                "y": [float(full[col].iloc[0]), *plan[col]],
                "style": "o-",
                "colour": "C0",
                "label": "plan (streaming score)",
            }
        ]
        if len(rnd):
            g = rnd.groupby("budget")[col]
            lines.append(
                {
                    "x": list(g.mean().index),
                    "y": list(g.mean()),
                    "low": list(g.min()),
                    "high": list(g.max()),
                    "style": "s--",
                    "colour": "C1",
                    "label": f"random heads: mean, bars min-max of {n_seeds} "
                    f"seed{'s' * (n_seeds != 1)}",
                }
            )
        for name, marker, colour, text in (
            ("streaming_all", "^", "C2", "all heads: sinks + window"),
            ("window_all", "v", "C3", "all heads: window, no sinks"),
        ):
            row = df[df["condition"] == name]
            if len(row):
                lines.append(
                    {
                        "x": [1.0],
                        "y": [float(row[col].iloc[0])],
                        "style": marker,
                        "colour": colour,
                        "label": text,
                        "size": 9,
                    }
                )
        panels.append(
            {
                "lines": lines,
                "xlabel": "share of heads restricted to sinks + window",
                "ylabel": label,
            }
        )
    length = f", {seq_len}-token held-out texts and needles" if seq_len else ""
    return curve_panels(
        panels,
        title=f"{model_name or 'KV-cache plan'}: restricted heads against full attention{length}",
        legend_panel=0,
    )


def markdown(df: pd.DataFrame, settings: PlanSettings, model_name: str, plans: dict) -> str:
    full = df[df["condition"] == "full"].iloc[0]
    lines = [
        f"# KV-cache plan: {model_name}",
        "",
        f"Sinks {settings.sinks} + window {settings.window}; verified on {settings.n_texts} "
        "held-out prose "
        f"sequences of {settings.seq_len} tokens (loss) and "
        f"{len(settings.depths) * settings.needles_per_depth} "
        f"needles of "
        f"{settings.needle_tokens} tokens (greedy decoding). Full attention: loss "
        f"{full.loss:.3f} nats, "
        f"needles {full.needle_acc:.0%}.",
        "",
        "| condition | budget | seed | heads | KV heads dropped | KV saved | loss change | "
        "needles |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in df.itertuples():
        seed = (
            ""
            if r.seed is None or (isinstance(r.seed, float) and math.isnan(r.seed))
            else int(r.seed)
        )
        lines.append(
            f"| {r.condition} | {r.budget:g} | {seed} | {r.heads_restricted} | "
            f"{r.kv_heads_dropped} | "
            f"{r.kv_saved_fraction:.1%} | {r.loss_delta:+.3f} | {r.needle_acc:.0%} |"
        )
    lines += [
        "",
        "Heads each plan restricts (highest streaming score first, retrieval heads last):",
        "",
    ]
    lines += [f"- {b}: {', '.join(h)}" for b, h in plans.items()]
    return "\n".join(lines) + "\n"


FILES = ("kvplan.csv", "kvplan.md", "kvplan.json", "kvplan.png")
ALL_FILES = FILES + ("kvplan.svg", "kvplan.pdf")  # with --figure-format svg / pdf


def save(
    df: pd.DataFrame,
    out,
    settings: PlanSettings,
    model_name: str,
    plans: dict,
    meta: dict,
    say: Callable[[str], None] | None = None,
    figure_formats=("png",),
) -> None:
    """kvplan.csv, kvplan.md and kvplan.json, then kvplan.png (and .svg / .pdf, as
    ``figure_formats`` says), into the folder ``out``. A figure that cannot be drawn is noted in
    kvplan.json (``figures_skipped``) and costs nothing else."""
    import json
    from pathlib import Path

    from headscope.files import optional, save_figure

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "kvplan.csv", index=False)
    (out / "kvplan.md").write_text(markdown(df, settings, model_name, plans))
    record = {
        "model": model_name,
        "settings": {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.__dict__.items()
        },
        "plans": plans,
        **meta,
    }

    def draw():
        fig = figure(df, model_name, settings.seq_len)
        return save_figure(fig, out / "kvplan.png", formats=figure_formats)

    optional("kvplan.png", draw, record, "figures_skipped", say)
    (out / "kvplan.json").write_text(json.dumps(record, indent=1, default=str))


def plan_to_dir(
    source: str,
    out: str | None = None,
    settings: PlanSettings = DEFAULT_SETTINGS,
    *,
    force: bool = False,
    say: Callable[[str], None] | None = None,
    figure_formats=("png",),
):
    """``headscope kvplan SOURCE``: the plan of a run directory (scanned with ``--long-context``) or
    of a model (scanned first into ``out``, default ``runs/<model>-long``), verified and written to
    ``<run>/kvplan/`` whole (an earlier plan is replaced only with ``force``, and only once the new
    one is complete). Everything that can be refused is refused before the first forward pass.
    ``figure_formats``: the plan's figure (and, with a MODEL, the scan's) as png, svg and/or pdf.
    Returns ``(table, folder)``."""
    from pathlib import Path

    from headscope.files import figure_formats as check_figure_formats
    from headscope.files import publish_dir
    from headscope.models.loading import load_model
    from headscope.rundir.store import KVPLAN, is_kvplan_dir, is_run_dir, load_run
    from headscope.scanner.runner import scan_to_dir

    say = say or (lambda _m: None)
    settings.validate()
    figure_formats = check_figure_formats(figure_formats)
    src = Path(source)
    # a checkpoint folder is a model
    from_run = src.is_dir() and not (src / "config.json").is_file()
    if from_run:
        if not is_run_dir(src):
            raise HeadscopeError(
                f"'{source}' is a folder but neither a headscope run directory "
                "nor a model "
                "checkpoint (no config.json); give a run scanned with "
                "--long-context, or a model."
            )
        if out is not None:
            raise HeadscopeError(
                "--out is for a MODEL source; a run's plan goes into <run>/kvplan/."
            )
        run_dir = src
    else:
        run_dir = (
            Path(out) if out is not None else Path("runs") / f"{src.name.replace('/', '-')}-long"
        )
    target = run_dir / KVPLAN
    if target.exists() or target.is_symlink():
        if not force:
            raise HeadscopeError(f"'{target}' already exists; pass --force to replace that plan.")
        if not is_kvplan_dir(target):
            raise HeadscopeError(f"'{target}' holds files headscope did not write; move it first.")
    if from_run:
        result = load_run(run_dir)
        ranking(result.scores)  # a run without streaming scores is refused before the model loads
        model = load_model(result.metadata.get("model") or result.model_name, progress=say)
        # what the plan needs, refused before any forward pass
        inputs = plan_inputs(model, settings)
    else:
        config = settings.scan_config()
        model = load_model(source, progress=say)
        # refused here, before the scan writes its run directory
        inputs = plan_inputs(model, settings)
        result = scan_to_dir(
            model, run_dir, config, force=force, say=say, figure_formats=figure_formats
        )
    df = kv_plan(model, result.scores, settings, say=say, inputs=inputs)
    plans = plan_heads(result.scores, settings.budgets)
    meta = {"run": str(run_dir), "model_provenance": model.provenance}
    publish_dir(
        target,
        lambda tmp: save(df, tmp, settings, model.name, plans, meta, say, figure_formats),
        replace=force,
        before_replace=lambda: is_kvplan_dir(target) or _foreign(target),
    )
    return df, target


def _foreign(target) -> None:
    raise HeadscopeError(
        f"'{target}' changed while the plan ran and now holds files headscope did "
        "not write; "
        "nothing was replaced."
    )
