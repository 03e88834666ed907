"""An ICL run's page and figures (``headscope icl``; :mod:`headscope.apps.icl`), drawn from its
tables: ``summary.md`` (the tasks, the top FV heads, FV against induction, the ablations, the
function vector), the scatter of FV against induction scores, the ablation curves beside the
random sets, and ``report.html``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd


def summary_md(model_name: str, res: dict, config) -> str:
    """The run's findings in a few lines: the tasks, the top FV heads, the comparison, the
    ablations at each size."""
    tasks, heads, comp, abl = res["tasks"], res["heads"], res["comparison"], res["ablations"]
    pct = int(round(100 * config.ci))
    lines = [
        f"# In-context learning heads: {model_name}",
        "",
        f"{len(tasks)} tasks, {config.shots} shots, first-token accuracy on valid queries "
        f"({pct}% Wilson intervals); FV scores from {config.prompts} shuffled-label prompts per "
        f"task (queries: {config.filter}), mean outputs from {config.mean_prompts} clean prompts.",
        "",
        "| task | kept pairs | zero-shot | few-shot | queries right |",
        "|---|---|---|---|---|",
    ]
    for r in tasks.itertuples():
        lines.append(
            f"| {r.task} | {r.kept} / {r.pairs} | {r.zero_shot:.2f} [{r.zero_shot_low:.2f}, "
            f"{r.zero_shot_high:.2f}] | {r.few_shot:.2f} [{r.few_shot_low:.2f}, "
            f"{r.few_shot_high:.2f}] | {r.correct_queries} / {r.queries} |"
        )
    top = heads.sort_values("fv", ascending=False).head(10)
    lines += ["", f"## Top FV heads ({pct}% intervals over tasks and prompts)", "",
              "| head | FV score | induction | previous-token | FV rank | induction rank |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for r in top.itertuples():
        lines.append(
            f"| {r.head_name} | {r.fv:+.4f} [{r.fv_low:+.4f}, {r.fv_high:+.4f}] | "
            f"{r.induction:.3f} | {r.previous_token:.3f} | {r.fv_rank} | {r.induction_rank} |"
        )
    lines += ["", "## FV against induction", ""]
    for r in comp.itertuples():
        lines.append(
            f"- {r.statistic} (k = {r.k}): {r.value:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]; "
            f"chance {r.chance:.3f}"
            + (
                f", P(random >= seen) = {r.p_chance:.3g}" if r.p_chance == r.p_chance else ""
            )  # fmt: skip
        )
    if len(abl):
        base = abl[abl["ranking"] == "none"].iloc[0]
        lines += ["", "## Ablations (test queries, heads mean-ablated at the last position)", "",
                  f"Clean few-shot accuracy {base.accuracy:.3f} [{base.ci_low:.3f}, "
                  f"{base.ci_high:.3f}].", "",
                  "| set | k | accuracy | drop | random sets (mean, range) | P(random <= set) |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        ranked = abl[~abl["ranking"].isin(["none", "random"])]
        for r in ranked.itertuples():
            lines.append(
                f"| {r.ranking} | {r.k} | {r.accuracy:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] | "
                f"{r.drop:+.3f} [{r.drop_low:+.3f}, {r.drop_high:+.3f}] | {r.random_mean:.3f} "
                f"[{r.random_low:.3f}, {r.random_high:.3f}] | {r.p_random:.3f} |"
            )
    vec = res.get("fv_vector", pd.DataFrame())
    if len(vec):
        lines += ["", "## The function vector added to zero-shot prompts (test queries)", "",
                  f"The top {int(vec['heads'].iloc[0])} FV heads' mean outputs, added after block "
                  f"{int(vec['layer'].iloc[0])} at the last position; beside it, as many random "
                  "heads' (the range holding 95% of the random vectors).", "",
                  "| task | zero-shot | with the FV | random heads' vector | P(random >= FV) |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for r in vec.itertuples():
            rand = (f"{r.random_mean:.3f} [{r.random_low:.3f}, {r.random_high:.3f}]"
                    if getattr(r, "random_mean", float("nan")) == getattr(r, "random_mean", 0)
                    else "")  # fmt: skip
            p = getattr(r, "p_random", float("nan"))
            lines.append(f"| {r.task} | {r.zero_shot:.3f} | {r.with_fv:.3f} | {rand} | "
                         f"{'' if p != p else f'{p:.3f}'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def scatter_figure(heads: pd.DataFrame, model_name: str):
    """Every head's FV score against its induction score."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    ax.scatter(heads["induction"], heads["fv"], s=10, c=heads["layer"], cmap="viridis")
    for r in heads.sort_values("fv", ascending=False).head(5).itertuples():
        ax.annotate(r.head_name, (r.induction, r.fv), fontsize=7)
    ax.set_xlabel("induction score (repeat sequences)")
    ax.set_ylabel("FV score (AIE, mean over tasks)")
    ax.set_title(f"{model_name}: function-vector vs induction heads", fontsize=9)
    fig.tight_layout()
    return fig


def ablation_figure(abl: pd.DataFrame, model_name: str):
    """Few-shot accuracy against the number of heads mean-ablated, per ranking, with the random
    sets' range."""
    if not len(abl):
        return None
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    rand = abl[abl["ranking"] == "random"].groupby("k")["accuracy"]
    ks = np.array(sorted(rand.groups))
    ax.fill_between(ks, rand.quantile(0.025).to_numpy(), rand.quantile(0.975).to_numpy(),
                    color="0.85", label="random sets (95% of draws)")  # fmt: skip
    for ranking in abl["ranking"].unique():
        if ranking in ("none", "random"):
            continue
        sub = abl[abl["ranking"] == ranking].sort_values("k")
        ax.errorbar(sub["k"], sub["accuracy"],
                    yerr=[sub["accuracy"] - sub["ci_low"], sub["ci_high"] - sub["accuracy"]],
                    marker="o", ms=3, capsize=2, label=ranking.replace("_", " "))  # fmt: skip
    base = abl[abl["ranking"] == "none"]["accuracy"].iloc[0]
    ax.axhline(base, color="k", lw=0.8, ls="--", label="no ablation")
    ax.set_xlabel("heads mean-ablated (k)")
    ax.set_ylabel("few-shot accuracy (first token)")
    ax.set_title(f"{model_name}: ablations on test queries", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def report_html(run_dir: Path) -> str:
    """The run's page, from its saved files: the summary and its figures."""
    import base64

    from headscope.report.html import _e, page

    run_dir = Path(run_dir)
    meta = json.loads((run_dir / "metadata.json").read_text())
    model = meta.get("model", "")
    model = model.get("name", "") if isinstance(model, dict) else str(model)
    body = [f"<h1>In-context learning heads: {_e(model)}</h1>"]
    for png in ("fv_vs_induction.png", "ablations.png"):
        if (run_dir / png).exists():
            data = base64.b64encode((run_dir / png).read_bytes()).decode()
            body.append(f'<img alt="{png}" src="data:image/png;base64,{data}">')
    summary = (run_dir / "summary.md").read_text() if (run_dir / "summary.md").exists() else ""
    body.append(f"<pre>{_e(summary)}</pre>")
    return page(f"headscope icl: {model}", body)
