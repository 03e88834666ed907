"""``headscope qk``: why each head attends where it does, decomposed over the components on the
query side and the key side (:mod:`headscope.circuits.qk_attribution`; docs/qk.md).

The run directory::

      qk.csv          per head, the top pairs (query-side component, key-side component): the mean
                      contribution to the logit over prompts with its interval, its null (the
                      same pair at the null keys) and the difference, each with an interval
      sides.csv       per head, each component's total on the query side and on the key side
      knockouts.csv   per head, the top pairs' components knocked out exactly beside the
                      first-order change (the attention on the chosen key)
      subspaces.csv   per head, the logit split over subspaces of the head's space: the singular
                      directions of W_QK (no rotary) or the rotation planes (rotary)
      heads.csv       per head: the logit and the attention on the chosen keys, prompts, instances
      tables.npz      per head, the whole mean table (components x components) and its names
      tokens.jsonl    one line per prompt: its token ids (and a task's positions)
      metadata.json   the model, the settings, where the prompts came from
      map_L*H*.png    the component map of each head (the first 12; --figure-format: svg, pdf too),
                      report.html (it embeds the PNG maps)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from headscope.apps.settings import QKSettings
from headscope.errors import HeadscopeError

#: maps drawn (one per head): the first N heads
MAX_MAPS = 12


def _prompts(model, config: QKSettings) -> tuple[list[list[int]], dict | None, dict]:
    """The prompts' token ids, a task's named positions (``{name: [per prompt]}``) and where they
    came from."""
    if config.text is not None:
        ids = model.wrap(model.encode(config.text))
        return [ids], None, {"source": "text", "text": config.text}
    if config.task is not None:
        from headscope.probes.kits import tokenize_task

        tt = tokenize_task(config.task, model, n_pairs=config.n_prompts, seed=config.seed)
        return [list(c) for c in tt.clean], dict(tt.positions), dict(tt.provenance)
    if config.probe == "repeat":
        from headscope.probes.pairs import repeat_len_for, repeat_probe

        p = repeat_probe(
            model, repeat_len_for(model, config.seq_len), config.n_prompts, config.seed
        )
    else:
        from headscope.probes.pairs import load_pairs, packed_text_probe

        p = packed_text_probe(model, load_pairs(), config.seq_len, config.n_prompts)
    return [list(s) for s in p.sequences], None, {"source": f"{p.name} probe", **p.settings}


def _heads(config: QKSettings, name: str, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """The heads ``config`` names, each inside a model of ``n_layers`` layers of ``n_heads``
    heads (a loaded model's, or its config's on disk before it loads): one line for the first
    that is not."""
    if tuple(config.heads) == ("all",):
        return [(la, h) for la in range(n_layers) for h in range(n_heads)]
    from headscope.circuits.receivers import parse_head

    out = []
    for head in config.heads:
        la, h = parse_head(head)
        if not (0 <= la < n_layers and 0 <= h < n_heads):
            raise HeadscopeError(
                f"Head {head} is outside {name} ({n_layers} layers of {n_heads} heads: "
                f"L0H0 to L{n_layers - 1}H{n_heads - 1})."
            )
        out.append((la, h))
    return out


def qk(
    model,
    config: QKSettings | None = None,
    say: Callable[[str], None] | None = None,
    prompts: list[list[int]] | None = None,
    positions: dict | None = None,
    **kw,
):
    """Decompose ``config.heads``' logits at the chosen query and key positions, on the
    settings' prompts or on ``prompts`` (token ids, with ``positions``: ``{name: [one per
    prompt]}``, e.g. a :class:`~headscope.probes.tasks.TokenizedTask`'s ``clean`` and
    ``positions``): returns
    ``{"pairs", "sides", "knockouts", "subspaces", "heads"}`` (DataFrames), ``"tables"`` (head
    name -> mean table), ``"components"`` (head name -> names), ``"side_prompts"`` (head name ->
    each prompt's query-side and key-side totals, then the same at the null keys, ``[prompt,
    component]`` each), ``"prompts"``
    and ``"positions"``."""
    import torch

    from headscope.circuits import qk_attribution as qa
    from headscope.circuits import qk_rules as rules
    from headscope.circuits import qk_summary as summary

    config = QKSettings.configure(config, kw)
    say = say or (lambda _m: None)
    qa.check_family(model)
    heads = _heads(config, model.name, model.n_layers, model.n_heads)
    if prompts is None:
        prompts, positions, source = _prompts(model, config)
    else:
        prompts, source = [list(p) for p in prompts], {"source": "token ids given"}
    by_len: dict[int, list[int]] = {}
    for p, ids in enumerate(prompts):
        by_len.setdefault(len(ids), []).append(p)
    recs = []
    for n, members in sorted(by_len.items()):
        ids = torch.tensor([prompts[p] for p in members])
        pos = (
            None
            if positions is None
            else {k: [v[p] for p in members] for k, v in positions.items()}
        )
        recs.append((qa.record(model, ids), torch.tensor(members), pos))
        say(f"recorded {len(members)} prompts of {n} tokens")
    pairs, sides, kos, subs, rows, tables, comps, side_prompts = [], [], [], [], [], {}, {}, {}
    t0 = time.perf_counter()
    for done, (la, h) in enumerate(heads):
        name = f"L{la}H{h}"
        per, insts = [], []
        for rec, members, pos in recs:
            inst = rules.instances(rec, la, h, config.query, config.key, pos, config.seed)
            per.append(summary.head_tables(rec, la, h, inst, members, len(prompts)))
            insts.append((rec, inst, members))
        s = summary.summarise(
            summary.merge(per), config.top, config.bootstrap, config.ci, config.seed
        )
        tables[name], comps[name] = s["table"].float().numpy(), per[0].components
        side_prompts[name] = s["per_prompt_sides"]
        rule = {"head": name, "query": config.query, "key": config.key}
        pairs += [{**rule, "rank": k + 1, **p} for k, p in enumerate(s["pairs"])]
        sides += [{**rule, "side": sd, **c} for sd in ("query", "key") for c in s[f"{sd}_side"]]
        sub = summary.subspace_summary(
            insts, la, h, len(prompts), config.bootstrap, config.ci, config.seed
        )
        subs += [{**rule, "rank": k + 1, **x} for k, x in enumerate(sub)]
        if config.knockouts:
            ko = summary.knockout_summary(
                insts, la, h, s["pairs"][: config.knockouts], len(prompts), config.bootstrap,
                config.ci, config.seed,
            )  # fmt: skip
            kos += [{**rule, **k} for k in ko]
        rows.append(
            {
                **rule,
                "logit": s["logit"][0],
                "logit_low": s["logit"][1],
                "logit_high": s["logit"][2],
                "attn": s["attn"][0],
                "attn_low": s["attn"][1],
                "attn_high": s["attn"][2],
                "n_prompts": s["n_prompts"],
                "n_instances": s["n_instances"],
            }
        )
        if (done + 1) % max(1, len(heads) // 10) == 0:
            say(f"{done + 1}/{len(heads)} heads ({time.perf_counter() - t0:.1f} s)")
    return {
        "pairs": pd.DataFrame(pairs),
        "sides": pd.DataFrame(sides),
        "knockouts": pd.DataFrame(kos),
        "subspaces": pd.DataFrame(subs),
        "heads": pd.DataFrame(rows),
        "tables": tables,
        "components": comps,
        "side_prompts": side_prompts,
        "prompts": prompts,
        "positions": positions,
        "source": source,
    }


def check_rules(config: QKSettings) -> None:
    """Refuse, before the model loads, a query or key rule that no prompt could have: a name
    without a task."""
    from headscope.circuits.qk_rules import KEY_RULES, QUERY_RULES

    for what, value, rules in (
        ("query", config.query, QUERY_RULES),
        ("key", config.key, KEY_RULES),
    ):
        if value in rules or config.task is not None:
            continue
        try:
            int(value)
        except ValueError:
            raise HeadscopeError(
                f"Unknown {what} rule '{value}'; use {', '.join(rules)} or a number (a named "
                "position such as END needs --task)."
            ) from None


def map_figure(table: np.ndarray, names: list[str], title: str):
    """A head's component map: the mean contribution of each (query-side, key-side) pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    lim = float(np.abs(table).max()) or 1.0
    im = ax.imshow(table, cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
    step = max(1, len(names) // 12)
    ticks = list(range(0, len(names), step))
    ax.set_xticks(ticks, [names[t] for t in ticks], rotation=90, fontsize=7)
    ax.set_yticks(ticks, [names[t] for t in ticks], fontsize=7)
    ax.set_xlabel("key-side component")
    ax.set_ylabel("query-side component")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="contribution to the logit")
    fig.tight_layout()
    return fig


def qk_to_dir(
    model_name,
    out: str | Path,
    config: QKSettings | None = None,
    *,
    force: bool = False,
    figures: bool = True,
    figure_formats=None,
    say: Callable[[str], None] | None = None,
    **settings,
) -> Path:
    """``headscope qk``: check the settings and ``out`` (one line each, before the model
    loads), load ``model_name`` (a name or folder; or a model already loaded), decompose, write
    the run directory (module docstring)."""
    from headscope.rundir.kinds import QK
    from headscope.rundir.record import run_record
    from headscope.rundir.store import check_out_dir, write_csv, write_run

    started = time.perf_counter()
    config = QKSettings.configure(config, settings)
    check_rules(config)
    check_out_dir(out, force, QK)
    if isinstance(model_name, str | Path):
        from headscope.models.loading import load_model
        from headscope.models.sources import model_shape

        shape = model_shape(str(model_name))
        if shape is not None:  # the heads' range from the config on disk: before the load
            _heads(config, str(model_name), *shape)

        model = load_model(str(model_name), device=config.device, dtype=config.dtype)
    else:  # a model already loaded
        model = model_name
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    res = qk(model, config, say=say)

    def tables(tmp: Path) -> None:
        write_csv(res["pairs"], tmp / "qk.csv")
        write_csv(res["sides"], tmp / "sides.csv")
        write_csv(res["knockouts"], tmp / "knockouts.csv")
        write_csv(res["subspaces"], tmp / "subspaces.csv")
        write_csv(res["heads"], tmp / "heads.csv")
        arrays = {k: v for k, v in res["tables"].items()}
        arrays |= {f"{k}_components": np.array(v) for k, v in res["components"].items()}
        np.savez(tmp / "tables.npz", **arrays)
        with open(tmp / "tokens.jsonl", "w") as f:
            for p, ids in enumerate(res["prompts"]):
                row = {"ids": ids}
                if res["positions"]:
                    row["positions"] = {k: int(v[p]) for k, v in res["positions"].items()}
                f.write(json.dumps(row) + "\n")

    def draw(tmp: Path) -> None:
        import matplotlib.pyplot as plt

        from headscope.files import save_figure

        for name in list(res["tables"])[:MAX_MAPS]:
            fig = map_figure(
                res["tables"][name],
                res["components"][name],
                f"{model.name} {name}: query {config.query}, key {config.key}",
            )
            save_figure(fig, tmp / f"map_{name}.png", formats=figure_formats)
            plt.close(fig)

    def page(tmp: Path) -> None:
        (tmp / "report.html").write_text(report_html(tmp))

    record = run_record(model, config, source=res["source"])
    write_run(
        out, QK, tables, record, force=force, figures=draw if figures else None, page=page,
        say=say, started=started,
    )  # fmt: skip
    return Path(out)


def report_html(run_dir: Path) -> str:
    """The run's page, from its saved files."""
    import base64

    from headscope.report.html import _e, _table, page

    meta = json.loads((run_dir / "metadata.json").read_text())
    model = meta.get("model", "")
    model = model.get("name", "") if isinstance(model, dict) else str(model)
    heads = pd.read_csv(run_dir / "heads.csv")
    pairs = pd.read_csv(run_dir / "qk.csv")
    body = [
        f"<h1>QK attribution: {_e(model)}</h1>",
        "<p>Each row: a pair of components (the query side's, the key side's) and its mean "
        "contribution to the attention logit over prompts (95% interval over prompts), beside the "
        "same pair at the null keys (visible keys the head neither was given nor attends to most, "
        "nearest the chosen key). The norms are frozen at the run's values; the parts of each "
        "logit add up to it (checked every run).</p>",
    ]
    for _, h in heads.iterrows():
        name = h["head"]
        body.append(
            f"<h2>{_e(name)}</h2><p>query {_e(h['query'])}, key {_e(h['key'])}: logit "
            f"{h['logit']:.3f} [{h['logit_low']:.3f}, {h['logit_high']:.3f}], attention "
            f"{h['attn']:.3f}, {int(h['n_prompts'])} prompts, {int(h['n_instances'])} "
            "instances</p>"
        )
        rows = [
            [
                _e(r.query_component),
                _e(r.key_component),
                f"{r.contribution:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]",
                f"{r.null:+.3f}",
                f"{r.above_null:+.3f} [{r.above_null_low:+.3f}, {r.above_null_high:+.3f}]",
            ]
            for r in pairs[pairs["head"] == name].head(10).itertuples()
        ]
        body.append(_table(["query side", "key side", "contribution", "null", "above null"], rows))
        png = run_dir / f"map_{name}.png"
        if png.exists():
            uri = base64.b64encode(png.read_bytes()).decode()
            body.append(f'<img alt="{_e(name)} map" src="data:image/png;base64,{uri}">')
    return page(f"headscope qk: {model}", body)
