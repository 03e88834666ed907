"""``headscope icl``: which heads carry in-context learning: function-vector heads (Todd et al.
2024) beside induction heads, and what mean-ablating each set does to few-shot accuracy (Yin and
Steinhardt 2025). docs/icl.md. The run directory::

    run/
      tasks.csv          per task: pairs kept for the model, the split, zero-shot and few-shot
                         accuracy (first token, valid queries) with intervals, queries kept
      fv_tasks.csv       per task and head: the average indirect effect (AIE) with its interval
      fv_heads.csv       per head: the FV score (AIE averaged over tasks, two-level interval) beside
                         its induction, previous-token, duplicate-token and copying scores
      comparison.csv     FV against induction: rank correlation, top-k overlap (chance beside)
      ablations.csv      few-shot accuracy (test queries) with the top-k FV, induction or random
                         heads mean-ablated, each with and without the other ranking's top heads
      fv_vector.csv      zero-shot accuracy (test queries) with the function vector of the top FV
                         heads added after block layers // 3, beside random heads' vectors
      scores.csv         rows ``fv`` and ``fv.<task>`` (one per head), as the census writes them
      prompts.jsonl      every prompt's token ids, answer token, task, kind and pairs
      means.pt           each task's mean head outputs at the last position
      summary.md, metadata.json, fv_vs_induction.png, ablations.png, report.html
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from headscope.apps.settings import IclSettings
from headscope.errors import HeadscopeError


def _task_names(config: IclSettings) -> list[str]:
    from headscope.probes.icl import ICL_TASKS

    return list(ICL_TASKS) if tuple(config.tasks) == ("all",) else list(config.tasks)


def icl(model, config: IclSettings | None = None, say: Callable[[str], None] | None = None, **kw):
    """Run the tasks on ``model``: baselines, mean outputs, indirect effects, the induction-side
    scores, the comparison and the ablations. Returns the tables (module docstring) and the
    prompts."""
    import torch

    from headscope.effects import function_vectors as fv
    from headscope.effects import icl_stats as st
    from headscope.probes import icl as kits
    from headscope.uncertainty import wilson

    config = IclSettings.configure(config, kw)
    say = say or (lambda _m: None)
    fv.check_model(model)
    tasks = [kits.icl_task(t) for t in _task_names(config)]
    L, H = model.n_layers, model.n_heads
    rows, per_task_ie, kept_tasks, means, prompts_out, test_sets = [], [], [], {}, [], {}
    for t, task in enumerate(tasks):
        t0 = time.perf_counter()
        seed = config.seed + 1000 * t
        keep = kits.usable(model, task)
        parts = kits.split(len(task))
        valid = parts["valid"][keep[parts["valid"]]]
        few = kits.build_prompts(model, task, config.queries, "clean", config.shots, seed,
                                 queries=valid, keep=keep, in_order=True)  # fmt: skip
        zero = kits.build_prompts(model, task, config.queries, "zero_shot", config.shots, seed,
                                  queries=valid, keep=keep, in_order=True)  # fmt: skip
        p_few, top_few, _ = fv.last_position(model, few)
        p_zero, top_zero, _ = fv.last_position(model, zero)
        correct = np.asarray(few.query)[top_few.numpy()]
        pool = correct if config.filter == "correct" else np.asarray(few.query)
        row = {
            "task": task.name,
            "pairs": len(task),
            "kept": int(keep.sum()),
            "train": int(keep[parts["train"]].sum()),
            "valid": int(len(valid)),
            "test": int(keep[parts["test"]].sum()),
            "queries": len(few),
            "zero_shot": float(top_zero.double().mean()),
            "few_shot": float(top_few.double().mean()),
            "few_shot_answer_prob": float(p_few.mean()),
            "correct_queries": int(len(correct)),
        }
        row["zero_shot_low"], row["zero_shot_high"] = wilson(int(top_zero.sum()), len(zero))
        row["few_shot_low"], row["few_shot_high"] = wilson(int(top_few.sum()), len(few))
        prompts_out += _rows(few, "baseline_few_shot") + _rows(zero, "baseline_zero_shot")
        if not len(pool):
            row["fv"] = "no query answered right: no mean outputs, no indirect effects"
            rows.append(row)
            say(f"{task.name}: no query answered right few-shot; left out of the FV score")
            continue
        clean = kits.build_prompts(model, task, config.mean_prompts, "clean", config.shots,
                                   seed + 1, queries=pool, keep=keep)  # fmt: skip
        shuffled = kits.build_prompts(model, task, config.prompts, "shuffled", config.shots,
                                      seed + 2, queries=pool, keep=keep)  # fmt: skip
        means[task.name] = fv.mean_outputs(model, clean)
        ie, base = fv.indirect_effects(model, shuffled, means[task.name])
        per_task_ie.append(ie.reshape(len(shuffled), L, H))
        kept_tasks.append(task.name)
        row["fv"] = "scored"
        row["mean_prompts"], row["fv_prompts"] = len(clean), len(shuffled)
        row["shuffled_answer_prob"] = float(base.mean())
        prompts_out += _rows(clean, "mean") + _rows(shuffled, "shuffled")
        test = parts["test"][keep[parts["test"]]]
        if config.test_prompts and len(test):
            test_sets[task.name] = kits.build_prompts(
                model, task, config.test_prompts, "clean", config.shots, seed + 3,
                queries=test, keep=keep,
            )  # fmt: skip
            prompts_out += _rows(test_sets[task.name], "test")
        rows.append(row)
        say(
            f"{task.name}: few-shot {row['few_shot']:.2f}, zero-shot {row['zero_shot']:.2f}, "
            f"{len(shuffled)} prompts x {L * H} heads ({time.perf_counter() - t0:.1f} s)"
        )
    if not per_task_ie:
        raise HeadscopeError(
            f"{model.name} answers no query of any task right few-shot, so no head has an "
            "indirect effect to measure; try --filter none or other tasks."
        )
    res = {"tasks": pd.DataFrame(rows), "prompts": prompts_out, "means": means}
    # ---- FV scores
    fv_mean, fv_lo, fv_hi = st.over_tasks(per_task_ie, config.bootstrap, config.ci, config.seed)
    fv_rows = []
    for name, x in zip(kept_tasks, per_task_ie, strict=True):
        m, lo, hi = st.over_prompts(x, config.bootstrap, config.ci, config.seed)
        fv_rows += [
            {"task": name, "layer": la, "head": h, "head_name": f"L{la}H{h}",
             "aie": float(m[la, h]), "ci_low": float(lo[la, h]), "ci_high": float(hi[la, h]),
             "n": x.shape[0]}
            for la in range(L) for h in range(H)
        ]  # fmt: skip
    res["fv_tasks"] = pd.DataFrame(fv_rows)
    # ---- the induction side, on repeat sequences
    say("induction-side scores on repeat sequences")
    side = _induction_side(model, config)
    heads = pd.DataFrame({"layer": np.repeat(np.arange(L), H), "head": np.tile(np.arange(H), L)})
    heads["head_name"] = [f"L{la}H{h}" for la, h in zip(heads["layer"], heads["head"], strict=True)]
    heads["fv"], heads["fv_low"], heads["fv_high"] = (
        fv_mean.flatten().numpy(), fv_lo.flatten().numpy(), fv_hi.flatten().numpy(),
    )  # fmt: skip
    for name, score in side["scores"].items():
        heads[name] = score.flatten().numpy()
    heads["fv_rank"] = (-heads["fv"]).rank(method="min").astype(int)
    heads["induction_rank"] = (-heads["induction"]).rank(method="min").astype(int)
    res["heads"] = heads
    # ---- comparison
    draws = (
        st.task_draws(per_task_ie, config.bootstrap, config.seed).reshape(config.bootstrap, -1)
        if config.bootstrap else None
    )  # fmt: skip
    res["comparison"] = _comparison(heads, draws, side["draws"], config)
    # ---- ablations
    if test_sets:
        say("ablations on test queries")
        mean_all = torch.stack([means[t] for t in kept_tasks]).mean(0)
        res["ablations"] = _ablations(model, heads, test_sets, mean_all, config)
    else:
        res["ablations"] = pd.DataFrame()
    res["fv_vector"] = pd.DataFrame()
    if test_sets and config.fv_heads:
        say("function vectors added to zero-shot prompts")
        res["fv_vector"], zero_rows = _vectors(model, heads, tasks, kept_tasks, means, config)
        prompts_out += zero_rows  # res["prompts"] is this list
    res["scores"] = _scores(model, res, per_task_ie, kept_tasks)
    res["source"] = {"tasks": [t.provenance for t in tasks], "filter": config.filter}
    return res


def _rows(p, kind: str) -> list[dict]:
    return [
        {"task": p.task, "kind": kind, "ids": ids, "answer": a, "query": q, "demos": d}
        for ids, a, q, d in zip(p.ids, p.answer, p.query, p.demos, strict=True)
    ]


#: the scores held beside the FV score, on the repeat probe
SIDE_METRICS = ("induction", "previous_token", "duplicate_token")


def _induction_side(model, config: IclSettings) -> dict:
    """The scan's induction and duplicate-token scores and copying@k on ``BOS + R + R``
    sequences of 64 tokens, its previous-token score on packed text of 64 tokens (the probes the
    scan scores them on), for every head; bootstrap draws of the induction score over
    sequences."""
    import torch

    from headscope.circuits.copying import copying_scores
    from headscope.engines.extract import score_probe
    from headscope.metrics import get_metric
    from headscope.probes.pairs import load_pairs, packed_text_probe, repeat_len_for, repeat_probe
    from headscope.uncertainty import draw_weights

    n_tok = min(64, model.n_ctx)
    probes = {
        "repeat": repeat_probe(
            model, repeat_len_for(model, n_tok), config.repeat_sequences, config.seed
        ),
        "text": packed_text_probe(model, load_pairs(), n_tok, config.repeat_sequences),
    }
    got = {}
    for probe in probes.values():
        metrics = [get_metric(m) for m in SIDE_METRICS if get_metric(m).probe == probe.name]
        got |= score_probe(model, probe, metrics)
    scores = {m: got[m].score.double() for m in SIDE_METRICS}
    if model.hf.get_output_embeddings() is not None:
        scores["copying"] = copying_scores(model, probes["repeat"]).score.double()
    ind = got["induction"]
    draws = None
    if config.bootstrap:
        w = draw_weights(ind.seq_total.shape[0], config.bootstrap, config.seed + 7)
        draws = (
            torch.einsum("rs,slh->rlh", w, ind.seq_total.double())
            / (w @ ind.seq_count.double())[:, None, None]
        )
        draws = draws.reshape(config.bootstrap, -1)
    return {"scores": scores, "draws": draws}


def top_k_size(n: int, share: float) -> int:
    """``max(1, int(share x n))`` heads (Yin and Steinhardt's sizes)."""
    return max(1, int(share * n))


def _comparison(heads: pd.DataFrame, fv_draws, ind_draws, config: IclSettings) -> pd.DataFrame:
    import torch

    from headscope.effects import icl_stats as st

    n = len(heads)
    a = torch.tensor(heads["fv"].to_numpy())
    b = torch.tensor(heads["induction"].to_numpy())
    out = []

    def interval(values: torch.Tensor) -> tuple[float, float]:
        q = torch.tensor([(1 - config.ci) / 2, (1 + config.ci) / 2], dtype=torch.float64)
        lo, hi = torch.quantile(values.double(), q)
        return float(lo), float(hi)

    rho = float(st.spearman(a, b))
    lo = hi = float("nan")
    if fv_draws is not None and ind_draws is not None:
        lo, hi = interval(st.spearman(fv_draws, ind_draws))
    out.append({"statistic": "spearman_fv_induction", "k": n, "value": rho, "ci_low": lo,
                "ci_high": hi, "chance": 0.0, "p_chance": float("nan")})  # fmt: skip
    # Yin and Steinhardt's overlap (top 5%, ceil) and "induction-FV heads" (top 2%, at least 2)
    for name, k in (("top5pct_overlap", math.ceil(0.05 * n)),
                    ("top2pct_both", math.ceil(max(2, 0.02 * n)))):  # fmt: skip
        seen = int(st.overlap(a, b, k))
        chance, p = st.overlap_chance(n, k, seen)
        lo = hi = float("nan")
        if fv_draws is not None and ind_draws is not None:
            lo, hi = interval(st.overlap(fv_draws, ind_draws, k).double())
        out.append({"statistic": name, "k": k, "value": seen, "ci_low": lo, "ci_high": hi,
                    "chance": chance, "p_chance": p})  # fmt: skip
    return pd.DataFrame(out)


def _ablations(model, heads: pd.DataFrame, test_sets: dict, mean_all, config) -> pd.DataFrame:
    """Few-shot accuracy on each task's test prompts with head sets mean-ablated at the last
    position (each head set to its mean output over the tasks' clean prompts, as Yin and
    Steinhardt): the top-k FV heads and the top-k induction heads, each with and without the other
    ranking's top ``exclude`` share left out, and ``random_sets`` random sets of each size."""
    from headscope.effects import function_vectors as fv
    from headscope.effects import icl_stats as st

    n = len(heads)
    pairs = list(zip(heads["layer"].tolist(), heads["head"].tolist(), strict=True))
    by_fv = heads["fv"].to_numpy().argsort(kind="stable")[::-1]
    by_ind = heads["induction"].to_numpy().argsort(kind="stable")[::-1]
    n_ex = int(config.exclude * n)
    rng = np.random.default_rng(config.seed)
    jobs, labels = [], []
    for share in config.fractions:
        k = top_k_size(n, share)
        for ranking, order, other in (("fv", by_fv, by_ind), ("induction", by_ind, by_fv)):
            jobs.append([pairs[i] for i in order[:k]])
            labels.append((ranking, share, k, -1))
            left_out = set(other[:n_ex].tolist())
            rest = [i for i in order if i not in left_out]
            jobs.append([pairs[i] for i in rest[:k]])
            labels.append((f"{ranking}_excluding_top_{'induction' if ranking == 'fv' else 'fv'}",
                           share, k, -1))  # fmt: skip
        for d in range(config.random_sets):
            jobs.append([pairs[i] for i in rng.choice(n, k, replace=False)])
            labels.append(("random", share, k, d))
    per_task, clean = [], []
    for prompts in test_sets.values():
        got = fv.set_heads_jobs(model, prompts, jobs, mean_all)
        per_task.append(got["top1"].double())
        clean.append(got["base_top1"].double()[:, None])
    acc, lo, hi = st.over_tasks(per_task, config.bootstrap, config.ci, config.seed)
    base, base_lo, base_hi = st.over_tasks(clean, config.bootstrap, config.ci, config.seed)
    drop = [c - x for c, x in zip(clean, per_task, strict=True)]
    d, d_lo, d_hi = st.over_tasks(drop, config.bootstrap, config.ci, config.seed)
    rows = [{"ranking": "none", "share": 0.0, "k": 0, "draw": -1, "excluded": 0,
             "accuracy": float(base[0]),
             "ci_low": float(base_lo[0]), "ci_high": float(base_hi[0]), "drop": 0.0,
             "drop_low": 0.0, "drop_high": 0.0}]  # fmt: skip
    for j, (ranking, share, k, draw) in enumerate(labels):
        rows.append({"ranking": ranking, "share": share, "k": k, "draw": draw,
                     "excluded": n_ex if "_excluding_" in ranking else 0,
                     "accuracy": float(acc[j]), "ci_low": float(lo[j]), "ci_high": float(hi[j]),
                     "drop": float(d[j]), "drop_low": float(d_lo[j]),
                     "drop_high": float(d_hi[j])})  # fmt: skip
    table = pd.DataFrame(rows)
    # beside each ranked set: where it falls among the random sets of its size
    rand = table[table["ranking"] == "random"]
    for i, r in table.iterrows():
        if r["ranking"] in ("none", "random"):
            continue
        same = rand[rand["k"] == r["k"]]["accuracy"].to_numpy()
        if len(same):
            table.loc[i, "random_mean"] = float(same.mean())
            table.loc[i, "random_low"] = float(np.quantile(same, (1 - config.ci) / 2))
            table.loc[i, "random_high"] = float(np.quantile(same, (1 + config.ci) / 2))
            table.loc[i, "p_random"] = float(((same <= r["accuracy"]).sum() + 1) / (len(same) + 1))
    return table


def _vectors(model, heads: pd.DataFrame, tasks, kept_tasks, means, config):
    """Todd et al.'s test that the vector carries the task: per task, zero-shot accuracy on
    ``test_prompts`` test queries with the function vector of the top ``fv_heads`` heads (by FV
    score over the tasks; each task's own mean outputs) added after block ``fv_layer`` at the
    last position, beside ``random_sets`` vectors of as many random heads' mean outputs. Returns
    the table and the zero-shot prompts' rows for ``prompts.jsonl``."""
    import torch

    from headscope.effects import function_vectors as fv
    from headscope.effects import icl_stats as st
    from headscope.probes import icl as kits

    n = len(heads)
    k = min(config.fv_heads, n)
    layer = model.n_layers // 3 if config.fv_layer is None else config.fv_layer
    pairs = list(zip(heads["layer"].tolist(), heads["head"].tolist(), strict=True))
    top = [pairs[i] for i in heads["fv"].to_numpy().argsort(kind="stable")[::-1][:k]]
    rng = np.random.default_rng(config.seed + 1)
    draws = [[pairs[i] for i in rng.choice(n, k, replace=False)] for _ in range(config.random_sets)]
    by_name = {t.name: t for t in tasks}
    rows, with_fv, without, saved = [], [], [], []
    for t, name in enumerate(kept_tasks):
        task = by_name[name]
        keep = kits.usable(model, task)
        test = kits.split(len(task))["test"]
        test = test[keep[test]]
        zero = kits.build_prompts(model, task, config.test_prompts, "zero_shot", config.shots,
                                  config.seed + 1000 * t + 4, queries=test, keep=keep)  # fmt: skip
        vectors = torch.stack([fv.function_vector(model, means[name], s) for s in [top, *draws]])
        got = fv.added_at_layer(model, zero, vectors, layer)
        saved += _rows(zero, "zero_shot_test")
        acc = got["top1"].double().mean(0)
        rand = acc[1:].numpy()
        row = {
            "task": name,
            "layer": layer,
            "heads": k,
            "prompts": len(zero),
            "zero_shot": float(got["base_top1"].double().mean()),
            "with_fv": float(acc[0]),
        }
        if len(rand):
            row["random_mean"] = float(rand.mean())
            row["random_low"] = float(np.quantile(rand, (1 - config.ci) / 2))
            row["random_high"] = float(np.quantile(rand, (1 + config.ci) / 2))
            row["p_random"] = float(((rand >= row["with_fv"]).sum() + 1) / (len(rand) + 1))
        rows.append(row)
        with_fv.append(got["top1"][:, :1].double())
        without.append(got["base_top1"].double()[:, None])
    m, lo, hi = st.over_tasks(with_fv, config.bootstrap, config.ci, config.seed)
    b, b_lo, b_hi = st.over_tasks(without, config.bootstrap, config.ci, config.seed)
    rows.append({"task": "all (mean over tasks)", "layer": layer, "heads": k,
                 "prompts": sum(x.shape[0] for x in with_fv), "zero_shot": float(b[0]),
                 "zero_shot_low": float(b_lo[0]), "zero_shot_high": float(b_hi[0]),
                 "with_fv": float(m[0]), "with_fv_low": float(lo[0]),
                 "with_fv_high": float(hi[0])})  # fmt: skip
    return pd.DataFrame(rows), saved


def _scores(model, res: dict, per_task_ie, kept_tasks) -> pd.DataFrame:
    """``scores.csv`` rows: ``fv`` (the FV score, two-level interval) and ``fv.<task>`` (each
    task's AIE, interval over prompts), one per head, in the census's columns."""
    from dataclasses import replace

    import torch

    from headscope.catalog import describe
    from headscope.census.base import labelled_rows

    heads = res["heads"]
    L, H = model.n_layers, model.n_heads
    grid = lambda col: torch.tensor(heads[col].to_numpy()).reshape(L, H)  # noqa: E731
    info = describe("fv")
    n = sum(x.shape[0] for x in per_task_ie)
    rows = labelled_rows(model, info, grid("fv"), 0.0, n, None, (grid("fv_low"), grid("fv_high")))
    ft = res["fv_tasks"]
    for name, x in zip(kept_tasks, per_task_ie, strict=True):
        sub = ft[ft["task"] == name]
        g = {c: torch.tensor(sub[c].to_numpy()).reshape(L, H) for c in ("aie", "ci_low", "ci_high")}
        rows += labelled_rows(
            model, replace(info, name=f"fv.{name}"), g["aie"], 0.0, x.shape[0], None,
            (g["ci_low"], g["ci_high"]),
        )  # fmt: skip
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ the run directory


def icl_to_dir(
    model_name,
    out: str | Path,
    config: IclSettings | None = None,
    *,
    force: bool = False,
    figures: bool = True,
    figure_formats=None,
    say: Callable[[str], None] | None = None,
    **settings,
) -> Path:
    """``headscope icl``: check the settings and ``out`` (one line each, before the model loads),
    load ``model_name`` (or take a model already loaded), run :func:`icl`, write the run
    directory (module docstring) whole."""
    from headscope.report.icl_page import ablation_figure, report_html, scatter_figure, summary_md
    from headscope.rundir.kinds import ICL
    from headscope.rundir.record import run_record
    from headscope.rundir.store import check_out_dir, write_csv, write_run

    started = time.perf_counter()
    config = IclSettings.configure(config, settings)
    check_out_dir(out, force, ICL)
    if isinstance(model_name, str | Path):
        from headscope.models.loading import load_model

        model = load_model(str(model_name), device=config.device, dtype=config.dtype)
    else:
        model = model_name
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    res = icl(model, config, say=say)

    def tables(tmp: Path) -> None:
        import torch

        write_csv(res["tasks"], tmp / "tasks.csv")
        write_csv(res["fv_tasks"], tmp / "fv_tasks.csv")
        write_csv(res["heads"], tmp / "fv_heads.csv")
        write_csv(res["comparison"], tmp / "comparison.csv")
        write_csv(res["ablations"], tmp / "ablations.csv")
        write_csv(res["fv_vector"], tmp / "fv_vector.csv")
        write_csv(res["scores"], tmp / "scores.csv")
        torch.save(res["means"], tmp / "means.pt")
        with open(tmp / "prompts.jsonl", "w") as f:
            for row in res["prompts"]:
                f.write(json.dumps(row) + "\n")
        (tmp / "summary.md").write_text(summary_md(model.name, res, config))

    def draw(tmp: Path) -> None:
        import matplotlib.pyplot as plt

        from headscope.files import save_figure

        for name, fig in (
            ("fv_vs_induction", scatter_figure(res["heads"], model.name)),
            ("ablations", ablation_figure(res["ablations"], model.name)),
        ):
            if fig is not None:
                save_figure(fig, tmp / f"{name}.png", formats=figure_formats)
                plt.close(fig)

    def page(tmp: Path) -> None:
        (tmp / "report.html").write_text(report_html(tmp))

    record = run_record(model, config, source=res["source"])
    write_run(
        out, ICL, tables, record, force=force, figures=draw if figures else None, page=page,
        say=say, started=started,
    )  # fmt: skip
    return Path(out)
