"""A KV plan's table as people read it, from the plan's table alone (never the model): the
per-budget summary (the plan against its random baselines), the figure (loss change and needle
accuracy against the KV memory saved) and ``kvplan.md``. :mod:`headscope.apps.kvplan` computes
the table.
"""

from __future__ import annotations

import math

import pandas as pd


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per budget: the plan (with its intervals, where the table has them) against the mean
    (min..max) of its random baselines: ``random`` heads (as many) and ``random_kv`` groups (as
    many KV heads dropped)."""
    out = []
    kinds = ["plan", "random", "random_kv"]
    for b, sub in df[df["condition"].isin(kinds)].groupby("budget"):
        plan = sub[sub["condition"] == "plan"].iloc[0]
        row = {
            "budget": b,
            "heads": int(plan.heads_restricted),
            "kv_saved": plan.kv_saved_fraction,
            "plan_loss_delta": plan.loss_delta,
        }
        if "loss_delta_low" in sub:
            row["plan_loss_low"] = plan.loss_delta_low
            row["plan_loss_high"] = plan.loss_delta_high
        needles = {"plan_needle": plan.needle_acc}
        if "needle_low" in sub:
            needles["plan_needle_low"] = plan.needle_low
            needles["plan_needle_high"] = plan.needle_high
        for kind in ("random", "random_kv"):
            rnd = sub[sub["condition"] == kind]
            if kind == "random_kv" and not len(rnd):
                continue
            some = len(rnd) > 0
            row[f"{kind}_loss_delta"] = rnd.loss_delta.mean() if some else math.nan
            row[f"{kind}_loss_delta_min"] = rnd.loss_delta.min() if some else math.nan
            row[f"{kind}_loss_delta_max"] = rnd.loss_delta.max() if some else math.nan
            needles[f"{kind}_needle"] = rnd.needle_acc.mean() if some else math.nan
            needles[f"{kind}_kv_saved"] = rnd.kv_saved_fraction.mean() if some else math.nan
        out.append({**row, **needles})  # loss columns, then the needles
    return pd.DataFrame(out)


def _merge_same_points(point: dict, budgets: list) -> dict:
    """One random-KV point per place: budgets whose draws are the same sets (a plan that drops as
    many KV heads at each, so the same seeds draw the same groups) sit on one point, and its note
    names them all (``b=0.25, 0.5``) instead of printing one note over another."""
    merged: dict[tuple, list] = {}
    for i, b in enumerate(budgets):
        key = (point["x"][i], point["y"][i], point["low"][i], point["high"][i])
        merged.setdefault(key, []).append(b)
    out = {**point}
    for j, name in enumerate(("x", "y", "low", "high")):
        out[name] = [key[j] for key in merged]
    out["notes"] = ["b=" + ", ".join(f"{b:g}" for b in bs) for bs in merged.values()]
    return out


def figure(
    df: pd.DataFrame,
    model_name: str = "",
    seq_len: int | None = None,
    needle_len: int | None = None,
):
    """Loss change and needle accuracy against the share of heads restricted: plan (bars: its 95%
    intervals, where the table has them), random heads, random KV groups, baselines. Three panels:
    the loss change of every condition; the same without the two all-heads conditions, on a scale
    of its own (a window without sinks costs so much more than any budget that, on one axis, the
    budgets' differences cannot be seen); needle accuracy on a 0..1 axis. Each condition sits at
    the share of heads it really restricts (a random KV group restricts every query head of its KV
    heads, so its share is not the budget's; each such point is labelled with the budget it
    matches). ``seq_len`` / ``needle_len``: the held-out texts' and needles' lengths for the title
    (needles as long as the texts when ``needle_len`` is None)."""
    from headscope.report.curves import curve_panels

    full = df[df["condition"] == "full"]
    plan = df[df["condition"] == "plan"].sort_values("budget")
    total = _total_heads(df)
    panels = []
    for col, label, low, high, every in (
        (
            "loss_delta",
            "held-out loss change vs full (nats per token)",
            "loss_delta_low",
            "loss_delta_high",
            True,
        ),
        (
            "loss_delta",
            "held-out loss change vs full (nats per token)",
            "loss_delta_low",
            "loss_delta_high",
            False,
        ),
        ("needle_acc", "needle exact match (share of needles)", "needle_low", "needle_high", True),
    ):
        line = {
            "x": [0.0, *(plan["heads_restricted"] / total)],
            "y": [float(full[col].iloc[0]), *plan[col]],
            "style": "o-",
            "colour": "C0",
            "label": "plan (streaming score)",
        }
        if low in df and high in df and len(full):
            lo = [0.0 if col == "loss_delta" else float(full[low].iloc[0]), *plan[low]]
            hi = [0.0 if col == "loss_delta" else float(full[high].iloc[0]), *plan[high]]
            if not any(math.isnan(v) for v in lo + hi):
                line["low"], line["high"] = lo, hi
                what = "texts, paired" if col == "loss_delta" else "needles, Wilson"
                line["label"] = f"plan (streaming score); bars 95% over {what}"
        lines = [line]
        if len(full):  # the plan line starts at it; keyed on its own, drawn over the plan's
            lines.append(
                {
                    "x": [0.0],
                    "y": [float(full[col].iloc[0])],
                    "style": "o",
                    "colour": "black",
                    "label": "full attention (nothing restricted)",
                    "size": 7,
                    "zorder": 5,
                }
            )
        for kind, style, colour, text in (
            ("random", "s--", "C1", "random heads (as many)"),
            ("random_kv", "D:", "C4", "random KV groups (as many KV heads dropped)"),
        ):
            rnd = df[df["condition"] == kind]
            if not len(rnd):
                continue
            n_seeds = int(rnd["seed"].nunique())
            g = rnd.groupby("budget")[col]
            share = (rnd["heads_restricted"] / total).groupby(rnd["budget"]).mean()
            budgets = list(g.mean().index)
            point = {
                "x": list(share.loc[budgets]),
                "y": list(g.mean()),
                "low": list(g.min()),
                "high": list(g.max()),
                "style": style,
                "colour": colour,
                "label": f"{text}: mean, bars min-max of {n_seeds} seed{'s' * (n_seeds != 1)}",
            }
            if kind == "random_kv":  # not at its budget's share: say which budget it matches
                point = _merge_same_points(point, budgets)
                point["label"] += "; b = the budget it matches"
            lines.append(point)
        for name, marker, colour, text, nudge in (  # side by side at 1: one hid the other
            ("streaming_all", "^", "C2", "all heads: sinks + window", -0.015),
            ("window_all", "v", "C3", "all heads: window, no sinks", 0.015),
        ):
            row = df[df["condition"] == name]
            if len(row) and every:
                point = {
                    "x": [1.0 + nudge],
                    "y": [float(row[col].iloc[0])],
                    "style": marker,
                    "colour": colour,
                    "label": text,
                    "size": 9,
                }
                if low in row and high in row:  # its interval, as the table prints it
                    ends = [float(row[low].iloc[0]), float(row[high].iloc[0])]
                    if not any(math.isnan(v) for v in ends):
                        point["low"], point["high"] = [ends[0]], [ends[1]]
                        point["label"] += "; bars 95%, as the plan's"
                lines.append(point)
        panels.append(
            {
                "lines": lines,
                "xlabel": "share of heads restricted to sinks + window",
                "ylabel": label,
                "ylim": (-0.04, 1.04) if col == "needle_acc" else None,  # 0 and 1 unclipped
                "title": (
                    "loss: every condition"
                    if col == "loss_delta" and every
                    else "loss: the budgets only (all-heads points left out), own scale"
                    if col == "loss_delta"
                    else "needles: every condition"
                ),
            }
        )
    if seq_len and needle_len and needle_len != seq_len:
        length = f", held-out texts of {seq_len} tokens, needles of {needle_len}"
    else:
        length = f", {seq_len}-token held-out texts and needles" if seq_len else ""
    return curve_panels(  # one key below the three panels: they share their curves
        panels,
        title=f"{model_name or 'KV-cache plan'}: restricted heads against full attention{length}",
        legend_panel=-1,
        panel_size=(5.0, 4.0),
    )


def _total_heads(df: pd.DataFrame) -> int:
    """Query heads in the model: what the ``streaming_all`` row restricts (every head), else the
    plan's restricted count over its budget."""
    every = df.loc[df["condition"] == "streaming_all", "heads_restricted"]
    if len(every):
        return int(every.iloc[0])
    plan = df[(df["condition"] == "plan") & (df["budget"] > 0)]
    if len(plan):
        return max(1, int(round(float((plan["heads_restricted"] / plan["budget"]).iloc[0]))))
    return max(1, int(df["heads_restricted"].max()))


def markdown(df: pd.DataFrame, settings, model_name: str, plans: dict) -> str:
    """``kvplan.md``: the plan's table and heads (``settings``: the plan's
    :class:`~headscope.apps.settings.PlanSettings`)."""
    full = df[df["condition"] == "full"].iloc[0]
    lines = [
        f"# KV-cache plan: {model_name}",
        "",
        f"Sinks {settings.sinks} + window {settings.window}; verified on {settings.n_texts} "
        f"held-out prose sequences of {settings.seq_len} tokens (loss) and "
        f"{len(settings.depths) * settings.needles_per_depth} needles of "
        f"{settings.needle_tokens} tokens (greedy decoding). Full attention: loss "
        f"{full.loss:.3f} nats, needles {full.needle_acc:.0%}.",
        "",
        "| condition | budget | seed | heads | KV heads dropped | KV saved | loss change "
        "[95% over texts] | needles [95% Wilson] |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in df.itertuples():
        seed = (
            ""
            if r.seed is None or (isinstance(r.seed, float) and math.isnan(r.seed))
            else int(r.seed)
        )
        loss_ci = needle_ci = ""
        if hasattr(r, "loss_delta_low") and not math.isnan(r.loss_delta_low):
            loss_ci = f" [{r.loss_delta_low:+.3f}, {r.loss_delta_high:+.3f}]"
        if hasattr(r, "needle_low") and not math.isnan(r.needle_low):
            needle_ci = f" [{r.needle_low:.0%}, {r.needle_high:.0%}]"
        lines.append(
            f"| {r.condition} | {r.budget:g} | {seed} | {r.heads_restricted} | "
            f"{r.kv_heads_dropped} | {r.kv_saved_fraction:.1%} | {r.loss_delta:+.3f}{loss_ci} | "
            f"{r.needle_acc:.0%}{needle_ci} |"
        )
    lines += [
        "",
        "Heads each plan restricts (highest streaming score first, retrieval heads last):",
        "",
    ]
    lines += [f"- {b}: {', '.join(h)}" for b, h in plans.items()]
    return "\n".join(lines) + "\n"
