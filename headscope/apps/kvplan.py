"""A KV-cache plan from a scan, checked by running the model.

StreamingLLM keeps a few initial "sink" tokens plus a recent window for every head. Some heads live
happily with that cache and some must see everything. A **plan** restricts a fraction of the heads
(the budget) to sinks + window: the heads whose ``streaming`` score is highest, heads labelled
``retrieval`` last. Each plan is then **verified** by running the model with those heads restricted
(their other keys masked, the kernel skipping their key tiles):

* next-token loss (nats) on held-out long prose (never the text the scan chose heads on);
* needle exact match: the needle probe's prompt on held-out prose, the ``K`` needle tokens decoded
  greedily (with a KV cache), all ``K`` right;

against full attention, the same number of heads chosen at random (several seeds), random whole
KV groups (every query head of randomly chosen KV heads) as many as the plan drops (the same memory
saving), every head restricted (StreamingLLM), and every head on a window of the same cache size
without sinks (the StreamingLLM ablation). Memory counts only KV heads every one of whose query
heads is restricted (grouped-query attention shares a KV head), as bytes of the K and V cache at
the plan's length.

Intervals: the loss change ``L_c - L_full`` (``L = sum_t s_t / sum_t n_t`` over texts ``t``, ``s_t``
the summed cross-entropy and ``n_t`` the predicted tokens of text ``t``) gets a 95% paired
bootstrap over texts (the same resampled texts under both conditions); needle exact match ``h / n``
a 95% Wilson interval over the ``n`` needles.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import pandas as pd
import torch

from headscope.apps.settings import PlanSettings
from headscope.engines.fused import Restricted  # noqa: F401 - notebooks and benchmarks use it here
from headscope.errors import HeadscopeError
from headscope.report.kvplan import figure, markdown, summary  # noqa: F401 - callers find them here
from headscope.uncertainty import paired_loss_ci, wilson  # noqa: F401 - notebooks use kvplan.wilson

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


def random_kv_groups(
    n_layers: int, n_heads: int, n_kv_heads: int, count: int, seed: int
) -> HeadSet:
    """``count`` whole KV groups drawn at random (seeded) from all ``n_layers * n_kv_heads``: every
    query head sharing a drawn KV head, so :func:`kv_saving` drops exactly ``count`` KV heads.

    >>> sorted(random_kv_groups(1, 4, 2, 1, 0))  # one of the two groups of 2 query heads
    [(0, 0), (0, 1)]
    """
    total = n_layers * n_kv_heads
    if not 0 <= count <= total:
        raise HeadscopeError(f"Cannot draw {count} KV groups from {total}; use 0..{total}.")
    group = n_heads // n_kv_heads
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(total, generator=gen)[:count].tolist()
    return HeadSet(
        (i // n_kv_heads, (i % n_kv_heads) * group + j) for i in pick for j in range(group)
    )


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


def text_losses(model, texts: Sequence[Sequence[int]], handler) -> tuple[list[float], list[int]]:
    """Per text: the summed next-token cross-entropy (nats) over positions 1..n-1, and the number
    of positions predicted (``s_t``, ``n_t``)."""
    sums, counts = [], []
    for ids in texts:
        x = torch.tensor([list(ids)])
        logits = model.run(x, handler=handler, output="logits")[0, :-1].float()
        target = x[0, 1:].to(logits.device)
        sums.append(float(torch.nn.functional.cross_entropy(logits, target, reduction="sum")))
        counts.append(len(target))
    return sums, counts


def text_loss(model, texts: Sequence[Sequence[int]], handler) -> float:
    """Mean next-token cross-entropy (nats) over positions 1..n-1 of every text."""
    sums, counts = text_losses(model, texts, handler)
    total = 0.0
    for v in sums:  # summed in text order, as before per-text sums were kept
        total += v
    return total / sum(counts)


def needle_hits(
    model, probe, handler, decode: str = "greedy", batch: int = 8
) -> tuple[list[bool], list[float]]:
    """Per needle: (all ``K`` needle tokens right, share of them right).

    ``decode="greedy"``: decoded greedily with a KV cache from the prompt before the answer.
    ``decode="forced"``: one forward of the whole sequence (needles of one answer position
    ``batch`` at a time), the arg-max at each answer position against the needle token, the earlier
    answer tokens given. Exact match is the same under both (greedy decoding gets all ``K`` right
    exactly when every teacher-forced arg-max is right; up to ties in the last bit); the token
    share is not (after a miss, greedy decoding continues from its own token)."""
    if decode not in ("greedy", "forced"):
        raise HeadscopeError(f"Needle decoding is 'greedy' or 'forced', got {decode!r}.")
    hits: list[bool] = []
    tokens: list[float] = []
    if decode == "greedy":
        for ids, nd in zip(probe.sequences, probe.needles, strict=True):
            prompt = list(ids[: nd["answer_start"]])
            want = list(ids[nd["needle_start"] : nd["needle_start"] + nd["k"]])
            got = model.greedy(prompt, nd["k"], handler=handler)
            hits.append(got == want)
            tokens.append(sum(a == b for a, b in zip(got, want, strict=True)) / len(want))
        return hits, tokens
    items = list(zip(probe.sequences, probe.needles, strict=True))
    out: dict[int, tuple[bool, float]] = {}
    for key in sorted({(len(ids), nd["answer_start"], nd["k"]) for ids, nd in items}):
        idx = [
            i for i, (ids, nd) in enumerate(items) if (len(ids), nd["answer_start"], nd["k"]) == key
        ]
        _, a, k = key
        for j in range(0, len(idx), batch):
            part = idx[j : j + batch]
            x = torch.tensor([list(items[i][0]) for i in part])
            logits = model.run(x, handler=handler, output="logits", logits_from=a - 1)
            pred = logits[:, :k].argmax(-1).cpu()  # [needle, k]: the guess for answer tokens
            want = torch.tensor(
                [list(items[i][0][items[i][1]["needle_start"] :][:k]) for i in part]
            )
            right = pred == want
            for i, r in zip(part, right, strict=True):
                out[i] = (bool(r.all()), float(r.double().mean()))
    for i in range(len(items)):
        hits.append(out[i][0])
        tokens.append(out[i][1])
    return hits, tokens


# ------------------------------------------------------------------------------ intervals


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
            "attention interface, so heads cannot be restricted."
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
    decode: str = "greedy",
    resamples: int = 2000,
) -> pd.DataFrame:
    """Every condition, verified: one row per (condition, budget, seed) with heads restricted, KV
    heads dropped, memory saved, loss, loss change (with its paired bootstrap interval over texts,
    ``resamples`` draws) and needle accuracy (with its Wilson interval over needles). The
    conditions: ``full``, ``streaming_all``, ``window_all``, then per budget ``plan``, ``random``
    (as many heads, ``seeds`` draws) and ``random_kv`` (as many whole KV groups as the plan drops,
    ``seeds`` draws). ``inputs``: what :func:`plan_inputs` returned for this model and these
    settings (made here when None). ``decode``: how needles are read (:func:`needle_hits`).
    Per-text loss sums are kept in ``df.attrs["text_sums"]`` (one list per row) with
    ``df.attrs["text_counts"]``."""
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
        plan = take(order, b)
        conditions.append(("plan", b, None, plan, s, w))
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
        dropped = kv_saving(
            plan, model.n_layers, model.n_heads, model.n_kv_heads, model.d_head, 1, 0
        )["kv_heads_dropped"]
        for seed in range(settings.seeds):
            groups = random_kv_groups(
                model.n_layers, model.n_heads, model.n_kv_heads, dropped, seed
            )
            conditions.append(("random_kv", b, seed, groups, s, w))
    rows, all_sums = [], []
    counts: list[int] = []
    for i, (name, budget, seed, heads, sinks, window) in enumerate(conditions):
        handler = Restricted(heads, model.n_heads, sinks, window) if heads else None
        t0 = time.perf_counter()
        sums, counts = text_losses(model, texts, handler)
        loss = 0.0
        for v in sums:  # the order text_loss sums in
            loss += v
        loss /= sum(counts)
        hits, token_hits = needle_hits(model, needles, handler, decode)
        acc, token_acc = sum(hits) / len(hits), sum(token_hits) / len(token_hits)
        n_low, n_high = wilson(sum(hits), len(hits))
        seconds = time.perf_counter() - t0
        all_sums.append(sums)
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
                "needle_low": n_low,
                "needle_high": n_high,
                "needles": len(hits),
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
    base = all_sums[0]  # the full-attention row
    ci = [
        paired_loss_ci(v, base, counts, resamples) if k else (0.0, 0.0)
        for k, v in enumerate(all_sums)
    ]
    df["loss_delta_low"] = [lo for lo, _ in ci]
    df["loss_delta_high"] = [hi for _, hi in ci]
    df.attrs["text_sums"] = all_sums
    df.attrs["text_counts"] = list(counts)
    return df


def plan_heads(scores: pd.DataFrame, budgets: Sequence[float]) -> dict[str, list[str]]:
    """The heads each budget restricts, by name (``L{layer}H{head}``), for the record."""
    order = ranking(scores)
    return {
        f"{b:g}": [f"L{la}H{h}" for la, h in order[: int(round(b * len(order)))]] for b in budgets
    }


def save(
    df: pd.DataFrame,
    out,
    settings: PlanSettings,
    model_name: str,
    plans: dict,
    meta: dict,
    say: Callable[[str], None] | None = None,
    figure_formats=("png",),
    force: bool = False,
) -> dict:
    """The plan's folder ``out``, written whole (:func:`headscope.rundir.store.write_run`):
    kvplan.csv, kvplan.md and its record kvplan.json, then kvplan.png (and .svg / .pdf, as
    ``figure_formats`` says). A figure that cannot be drawn is noted in kvplan.json
    (``figures_skipped``) and costs nothing else. Returns the record."""
    from pathlib import Path

    from headscope.files import save_figure
    from headscope.rundir.kinds import KVPLAN
    from headscope.rundir.store import write_run

    def tables(tmp: Path) -> None:
        df.to_csv(tmp / "kvplan.csv", index=False)
        (tmp / "kvplan.md").write_text(markdown(df, settings, model_name, plans))

    def draw(tmp: Path) -> None:
        fig = figure(df, model_name, settings.seq_len)
        save_figure(fig, tmp / "kvplan.png", formats=figure_formats)

    record = {"model": model_name, "settings": settings.record(), "plans": plans, **meta}
    return write_run(Path(out), KVPLAN, tables, record, force=force, figures=draw, say=say)


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
    from headscope.models.placement import threads

    with threads(settings.threads):
        return _plan_to_dir(source, out, settings, force, say, figure_formats)


def _plan_to_dir(source, out, settings: PlanSettings, force, say, figure_formats):
    from pathlib import Path

    from headscope.files import figure_formats as check_figure_formats
    from headscope.models.loading import load_model
    from headscope.rundir.kinds import KVPLAN
    from headscope.rundir.store import KVPLAN_DIR, check_out_dir, is_run_dir, load_run
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
                f"'{source}' is a folder but neither a headscope run directory nor a model "
                "checkpoint (no config.json); give a run scanned with --long-context, or a model."
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
    target = check_out_dir(run_dir / KVPLAN_DIR, force, KVPLAN)
    if from_run:
        result = load_run(run_dir)
        ranking(result.scores)  # a run without streaming scores is refused before the model loads
        name = result.metadata.get("model") or result.model_name
        model = load_model(name, device=settings.device, dtype=settings.dtype, progress=say)
        # what the plan needs, refused before any forward pass
        inputs = plan_inputs(model, settings)
    else:
        config = settings.scan_config()
        model = load_model(source, device=settings.device, dtype=settings.dtype, progress=say)
        # refused here, before the scan writes its run directory
        inputs = plan_inputs(model, settings)
        result = scan_to_dir(
            model, run_dir, config, force=force, say=say, figure_formats=figure_formats
        )
    df = kv_plan(model, result.scores, settings, say=say, inputs=inputs)
    plans = plan_heads(result.scores, settings.budgets)
    meta = {"run": str(run_dir), "model_provenance": model.provenance}
    save(df, target, settings, model.name, plans, meta, say, figure_formats, force=force)
    return df, target
