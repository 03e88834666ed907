"""``headscope.patch(model, task, ...)`` and ``headscope patch``: counterfactual patching of every
head on a task's prompt pairs (docs/patching.md), its settings, its result, its run directory.

    task   = headscope.Task.from_pairs([(clean, corrupt, " Mary", " John"), ...])  # or a kit: "ioi"
    result = headscope.patch(model, task, activations=("z", "v"), positions=("all", "named"))
    result.table                          # tidy: a row per (activation, position, direction, head)
    save_patching(result, "runs/ioi")     # patching.csv, metadata.json, tokens.jsonl, figures, page

Estimators (the ``estimator`` column of every row):

* ``exact``: every head patched for real (:mod:`headscope.effects.patching`), the truth;
* ``attribution``: every head estimated to first order (:mod:`headscope.effects.patch_attribution`),
  always labelled so;
* ``both``: both, for every head (two rows per head);
* ``auto``: attribution for every head, and exact patching for the heads that matter: per
  (direction, activation, kv_mode, position), the top :data:`TOP_SHARE` of units by |attribution|
  (at least :data:`TOP_MIN`), as ``--effects auto`` chooses heads for ablation.

The run directory (written whole, :func:`headscope.files.publish_dir`; the ``--force`` rules of
:mod:`headscope.rundir.store`, for a patching run)::

    OUT/
      patching.csv        the tidy table (PatchResult.table; columns COLUMNS of effects.patch_table)
      baseline.csv        clean and corrupt metric and their gap, with intervals; share correct
      dla.csv             every head's direct logit attribution, clean and corrupt prompts
      tokens.jsonl        one line per pair: clean and corrupt ids, answer and wrong ids, positions
      pattern_scores.csv  with ``--scan RUN_DIR``: that scan's pattern scores of every head
      metadata.json       model, source, weights sha256, task and its provenance, settings, seed,
                          versions, timings, the baseline, the files
      *.png               a layer x head heatmap per (activation, position, direction, kv_mode), the
                          per-position grid, the DLA heatmap
      report.html         the page (:mod:`headscope.report.patch_page`), from the files above

Tables first, then figures and the page: a figure or the page that fails costs only itself
(``figures_skipped`` / ``report_skipped`` in ``metadata.json``).

Importing this module loads no torch (``headscope patch --help`` is instant); the work imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from headscope.apps.runs import check_model, task_run_to_dir
from headscope.apps.settings import PatchSettings
from headscope.effects.settings import PATCH_KV_MODES
from headscope.errors import HeadscopeError, did_you_mean, setting
from headscope.probes.tasks import END
from headscope.result import timed
from headscope.rundir.kinds import PATCH

if TYPE_CHECKING:  # pragma: no cover - pandas is imported where a table is made or read
    import pandas as pd

TOP_SHARE, TOP_MIN = 0.1, 10
#: Scan scores shown beside each head's effect (those the scan has).
PATTERN_SCORES = ("induction", "previous_token", "duplicate_token", "sink", "copying")


PatchConfig = PatchSettings  # the name it had


# ------------------------------------------------------------------------------ the result


@dataclass
class PatchResult:
    """What :func:`patch` returns (and :func:`load_patching` reads back, without ``per_pair``).

    ``table``: one row per patch (:data:`headscope.effects.patch_table.COLUMNS`); ``baseline``: the
    clean and corrupt metric and their gap with intervals; ``dla``: every head's direct logit
    attribution on the clean and the corrupt prompts (None without); ``tokens``: the tokenized task
    (:class:`~headscope.probes.tasks.TokenizedTask`); ``example``: pair 0's tokens as text (for the
    per-position figure); ``per_pair``: ``m_clean``, ``m_corrupt`` and ``m_patched`` (``[row,
    pair]``, rows in ``table`` order) for recomputing anything; ``metadata``: what ``metadata.json``
    holds (filled by :func:`patch` and completed when saved).
    """

    task: str
    model: str
    metric: str
    table: pd.DataFrame
    baseline: pd.DataFrame
    dla: pd.DataFrame | None
    tokens: object
    example: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    per_pair: dict = field(default_factory=dict, repr=False)
    pattern_scores: pd.DataFrame | None = None

    def top(self, n: int = 10, **where) -> pd.DataFrame:
        """The ``n`` rows with the largest |effect| of those matching ``where`` (column=value)."""
        t = self.table
        for k, v in where.items():
            t = t[t[k] == v]
        return t.reindex(t["effect"].abs().sort_values(ascending=False).index).head(n)


def _positions(positions: Sequence[str], tt) -> list[str]:
    named = list(tt.positions)
    allowed = ["all", "each", "named", *named]
    out = []
    for p in positions:
        if p not in allowed and not p.isdigit():
            raise HeadscopeError(
                f"Unknown position '{p}' ({setting('positions')}).{did_you_mean(p, allowed)} "
                f"Use {', '.join(allowed)} or a token index."
            )
        if p.isdigit() and int(p) >= min(tt.lengths):
            raise HeadscopeError(
                f"Position {p} ({setting('positions')}) is past the end of the shortest pair "
                f"({min(tt.lengths)} tokens); use 0..{min(tt.lengths) - 1}."
            )
        out.extend([n for n in named if n != END] + [END] if p == "named" else [p])
    if "each" in out and len(set(tt.lengths)) > 1:
        raise HeadscopeError(
            f"positions=each needs every pair to have one length; task '{tt.name}' has lengths "
            f"{min(tt.lengths)}..{max(tt.lengths)} (use one template: {setting('templates')} 0)."
        )
    return list(dict.fromkeys(out))


def patch(
    model,
    task,
    config: PatchSettings | None = None,
    *,
    say: Callable[[str], None] | None = None,
    **settings,
) -> PatchResult:
    """Patch every head of ``model`` on ``task`` (a :class:`~headscope.probes.tasks.Task`, a
    :class:`~headscope.probes.tasks.TokenizedTask`, a kit name or a ``.jsonl`` / ``.tsv`` file).

    ``config`` (a :class:`~headscope.apps.settings.PatchSettings`) or keyword ``settings`` (its
    fields: ``activations``, ``positions``, ``directions``, ``estimator``, ``kv_mode``,
    ``metric``, ``n_pairs``, ``seed``, ``bootstrap``, ...) say what is patched and how; ``say``
    hears progress lines.
    """
    import torch

    from headscope.effects.logit_attribution import direct_logit_attribution
    from headscope.effects.patch_attribution import attribution_patching
    from headscope.effects.patch_table import baseline_table, dla_table, effect_table
    from headscope.effects.patching import (
        Request,
        baseline_metrics,
        exact_patching,
        make_batches,
        n_units,
    )
    from headscope.probes.kits import tokenize_task
    from headscope.rundir.record import run_record

    config = PatchSettings.configure(config, settings)
    say = say or (lambda _m: None)
    timings: dict[str, float] = {}
    check_model(model)
    tt = tokenize_task(task, model, config.metric, config.n_pairs, config.seed, config.templates)
    pos = _positions(config.positions, tt)
    kinds, dirs, est = list(config.activations), list(config.directions), config.estimator
    gqa = model.n_kv_heads < model.n_heads
    wanted_kv = list(PATCH_KV_MODES) if config.kv_mode == "both" else [config.kv_mode]
    run_kv = (
        wanted_kv if gqa else ["head"]
    )  # without GQA a KV head is its query head: computed once
    batches = make_batches(tt, config.batch_size, model.pad_id)
    n = len(tt)
    combos = [
        (d, k, m) for d in dirs for k in kinds for m in (run_kv if k in ("k", "v") else ["head"])
    ]

    attribution = {}
    if est in ("attribution", "both", "auto"):
        say(f"patching: attribution estimates for every head ({', '.join(kinds)}; {n} pairs)")
        with timed(timings, "attribution_s"):
            attribution = attribution_patching(
                model, batches, n, tt.metric, kinds, run_kv, pos, dirs
            )
    requests = []
    if est != "attribution":
        for d, k, m in combos:
            every = tuple(
                (la, u) for la in range(model.n_layers) for u in range(n_units(model, k, m))
            )
            if est in ("exact", "both"):
                requests.append(Request(d, k, m, tuple(pos), every))
                continue
            for label in dict.fromkeys(key[3] for key in attribution if key[:3] == (d, k, m)):
                a = attribution[(d, k, m, label)].mean(0)  # [layer, unit]
                top = (
                    a.abs()
                    .flatten()
                    .argsort(descending=True)[: max(TOP_MIN, math.ceil(TOP_SHARE * a.numel()))]
                )
                units = tuple(sorted((int(i) // a.shape[1], int(i) % a.shape[1]) for i in top))
                requests.append(Request(d, k, m, (label,), units))
    exact, base = {}, {}
    if requests:
        say(
            f"patching: exact patches of {sum(len(r.units) * len(r.positions) for r in requests)} "
            "(head, position) pairs"
        )
        with timed(timings, "exact_s"):
            exact = exact_patching(model, batches, n, tt.metric, requests, baseline=base)
    else:
        base = baseline_metrics(model, batches, n, tt.metric)

    keys, patched = [], []
    for (d, k, m, label), e in attribution.items():
        base_m = base["corrupt" if d == "denoising" else "clean"]
        for la in range(e.shape[1]):
            for u in range(e.shape[2]):
                keys.append((d, k, m, label, la, u, "attribution"))
                patched.append(base_m + e[:, la, u])
    for (d, k, m, label, la, u), v in sorted(exact.items()):
        keys.append((d, k, m, label, la, u, "exact"))
        patched.append(v)
    if not gqa and "group" in wanted_kv:  # the group rows are the head rows, relabelled
        extra = [(i, key) for i, key in enumerate(keys) if key[1] in ("k", "v")]
        keys += [(*key[:2], "group", *key[3:]) for _, key in extra]
        patched += [patched[i] for i, _ in extra]
        if "head" not in wanted_kv:
            keep = [
                i for i, key in enumerate(keys) if not (key[1] in ("k", "v") and key[2] == "head")
            ]
            keys, patched = [keys[i] for i in keep], [patched[i] for i in keep]
    matrix = (
        torch.stack(patched) if patched else torch.zeros(0, n, dtype=torch.float64)
    )  # [row, pair]
    b, level, seed = config.bootstrap, config.ci, config.seed
    table = effect_table(
        keys,
        base["clean"],
        base["corrupt"],
        matrix,
        tt.name,
        model.n_heads,
        model.n_kv_heads,
        b,
        level,
        seed,
    )
    dla = None
    if config.dla:
        with timed(timings, "dla_s"):
            dla = dla_table(
                tt.name,
                {p: direct_logit_attribution(model, batches, n, p) for p in ("clean", "corrupt")},
                b,
                level,
                seed,
            )
    baseline = baseline_table(tt.name, tt.metric, base, b, level, seed)
    example = {
        "pair": 0,
        "clean": model.str_tokens(tt.clean[0]),
        "corrupt": model.str_tokens(tt.corrupt[0]),
    }
    meta = run_record(
        model,
        config,
        run_kind="patching",
        task=tt.name,
        task_provenance=tt.provenance,
        metric=tt.metric,
        n_pairs=n,
        positions_run=pos,
        gqa_group=model.n_heads // model.n_kv_heads,
        timings=timings,
    )
    return PatchResult(
        tt.name,
        model.name,
        tt.metric,
        table,
        baseline,
        dla,
        tt,
        example,
        meta,
        {"m_clean": base["clean"], "m_corrupt": base["corrupt"], "m_patched": matrix},
    )


# ------------------------------------------------------------------------------ the run directory


def save_patching(
    result: PatchResult, out: str | Path, *, figures: bool = True, figure_formats=None, **options
) -> Path:
    """Write ``result`` to the run directory ``out`` (see the module docstring), published whole
    (:func:`headscope.rundir.store.write_run`); an existing ``out`` is replaced only with ``force``
    and only when it is a patching run (or empty). ``figure_formats``: each figure as png (the
    default), svg and/or pdf; ``options``: :func:`~headscope.rundir.store.write_run`'s ``force``,
    ``say`` and ``started``. ``result.metadata`` becomes what was saved."""
    from headscope.report.patching import save_patch_figures
    from headscope.rundir.kinds import PATCH
    from headscope.rundir.store import write_csv, write_run

    def tables(tmp: Path) -> None:
        write_csv(result.table, tmp / "patching.csv")
        write_csv(result.baseline, tmp / "baseline.csv")
        for name in ("dla", "pattern_scores"):
            if getattr(result, name) is not None:
                write_csv(getattr(result, name), tmp / f"{name}.csv")
        result.tokens.write_jsonl(tmp / "tokens.jsonl")

    def draw(tmp: Path) -> None:
        tokens = result.example.get("clean")
        save_patch_figures(
            result.table, result.dla, tmp, model=result.model, tokens=tokens, formats=figure_formats
        )

    def page(tmp: Path) -> None:
        from headscope.report.patch_page import patch_page_html

        run = load_patching(tmp)
        html = patch_page_html(
            run.table, run.baseline, run.dla, run.metadata, run.pattern_scores, figures=figures
        )
        (tmp / "report.html").write_text(html, encoding="utf-8")

    base = result.baseline.set_index("prompt")
    record = dict(
        result.metadata,
        run_kind="patching",
        model=result.model,
        task=result.task,
        metric=result.metric,
        example=result.example,
        baseline={p: base.loc[p].drop("task").to_dict() for p in base.index},
    )
    draw = draw if figures else None
    result.metadata = write_run(out, PATCH, tables, record, figures=draw, page=page, **options)
    return Path(out)


def load_patching(path: str | Path) -> PatchResult:
    """Read a patching run directory back (tables, tokens, metadata; no per-pair values)."""
    from headscope.probes.tasks import TokenizedTask
    from headscope.rundir.kinds import PATCH
    from headscope.rundir.store import read_record, read_table

    path = Path(path)
    meta = read_record(path, PATCH)
    tokens = None
    if (path / "tokens.jsonl").is_file():
        name, metric = meta.get("task", ""), meta.get("metric", "logit_diff")
        tokens = TokenizedTask.read_jsonl(path / "tokens.jsonl", name, metric)
    return PatchResult(
        meta.get("task", ""),
        meta.get("model", ""),
        meta.get("metric", ""),
        read_table(path, "patching.csv", ("position", "query_heads", "head_name")),
        read_table(path, "baseline.csv", ("prompt",)),
        read_table(path, "dla.csv", ("head_name",)),
        tokens,
        meta.get("example", {}),
        meta,
        {},
        read_table(path, "pattern_scores.csv", ("head_name", "label")),
    )


def patch_to_dir(model_name, task, out: str | Path, config=None, **options) -> PatchResult:
    """``headscope patch``: check everything, load ``model_name``, patch, save the run to ``out``
    (:func:`headscope.apps.runs.task_run_to_dir`, whose keywords ``options`` are: ``scan``,
    ``tokenizer``, ``force``, ``figures``, ``say``, ``figure_formats`` and any setting). Every
    mistake a user can make is refused with one line before the model loads, what needs the model
    before any forward pass, and nothing is written unless the run succeeds."""
    return task_run_to_dir(
        PATCH, PatchSettings, _patch_work, save_patching, model_name, task, out, config, **options
    )


def _patch_work(model, task, config, pattern, say) -> PatchResult:
    result = patch(model, task, config, say=say)
    result.pattern_scores = pattern
    return result
