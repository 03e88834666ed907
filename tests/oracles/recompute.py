"""Independent cross-check of a headscope run directory.

Recomputes every (metric, layer, head) score, its chance value and its n from ``tokens.jsonl``
alone, with plain Hugging Face eager attention (one sequence at a time, no padding; token_type_ids
only where the run saved them, i.e. a scan with ``--token-types``), from
the metric definitions (``headscope/catalog.py``), and compares with ``scores.csv``.

    python scripts/recompute_scores.py RUN_DIR [--model-dir DIR] [--tol 1e-3]      # the command
    from tests.oracles.recompute import recompute, compare                       # the functions

Exit status: 0 when every score, chance and n agrees (score/chance within ``--tol``, NaN only where
NaN), 1 otherwise.

Chance is the value of a head that spreads its attention uniformly over the keys it can see in its
own layer: with causality ``k <= q``, and in a sliding-window layer (``config.layer_types[l] ==
"sliding_attention"``, e.g. Gemma 3; or every layer of a model with ``sliding_window`` and no
``layer_types``, e.g. Mistral) only ``q - sliding_window < k <= q``. Which queries qualify never
depends on the window. So chance may differ between layers of one metric.

On purpose this imports nothing from ``headscope.metrics``, ``headscope.engines`` or
``headscope.scanner``: it is a second implementation (``tests/oracles/test_recompute.py`` checks
its imports). The only headscope code used is ``headscope.models.sources`` (to find the cached
weights of the offline models).
"""

from __future__ import annotations

import json
import os
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pandas as pd
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

METRICS = {  # metric -> probe
    "previous_token": "text",
    "next_token": "text",
    "sink": "text",
    "separator": "text",
    "punctuation": "text",
    "entropy": "text",
    "induction": "repeat",
    "duplicate_token": "repeat",
}
# Long-context metrics (a scan with --long-context): recomputed when the run holds them.
LONG_METRICS = {"streaming": "text", "retrieval": "needle", "retrieval_soft": "needle"}

OFFLINE = ("smollm2-135m", "all-minilm-l6-v2", "gemma3-270m")


# --------------------------------------------------------------------------- the model


def model_folder(meta: dict, model_dir: str | os.PathLike | None = None) -> str:
    """The local checkpoint folder (or hub repo id) of the model a run used."""
    if model_dir is not None:
        return str(model_dir)
    name = str(meta.get("model", ""))
    if name.lower() in OFFLINE:
        from headscope.models.sources import PACKAGED, packaged_folder

        return str(packaged_folder(PACKAGED[name.lower()]))
    src = meta.get("source", {})
    ref = src.get("source") if isinstance(src, dict) else src
    if ref and Path(ref).is_dir():
        return str(ref)
    if name and Path(name).is_dir():
        return name
    if ref and str(ref).startswith("hf:"):  # a hub model, read from the local HF cache
        return str(ref)[3:]
    raise SystemExit(
        f"cannot locate the model of this run (model={name!r}, source={ref!r}); pass --model-dir"
    )


def load(folder: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """(model, tokenizer, causal) with eager attention, eval mode."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, BertModel

    cfg = AutoConfig.from_pretrained(folder)
    archs = " ".join(getattr(cfg, "architectures", None) or [])
    kw = dict(dtype=dtype, attn_implementation="eager")
    if cfg.model_type == "bert":
        model, causal = BertModel.from_pretrained(folder, **kw), False
    elif (
        "CausalLM" in archs
        or "LMHeadModel" in archs
        or cfg.model_type in ("gpt2", "llama", "gpt_neox", "gemma3_text")
    ):
        model, causal = AutoModelForCausalLM.from_pretrained(folder, **kw), True
    else:
        model = AutoModel.from_pretrained(folder, **kw)
        causal = bool(getattr(cfg, "is_decoder", False))
    model.to(device).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    return model, tok, causal


def layer_windows(cfg, n_layers: int, causal: bool) -> list[int | None]:
    """Per layer, the sliding window ``w`` (a query q sees only keys ``q - w < k <= q``), or None.

    Read from the config as transformers' masks use it: ``layer_types`` naming
    ``sliding_attention`` layers (Gemma 2/3, Qwen2, ...), else a ``sliding_window`` on every layer
    (Mistral-style; Qwen2's ``use_sliding_window=False`` turns it off).
    """
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        types = list(types)
        if len(types) != n_layers or not set(types) <= {"full_attention", "sliding_attention"}:
            raise SystemExit(
                f"layer_types {sorted(set(types))} for {n_layers} layers: only "
                "full_attention and "
                "sliding_attention are modelled here"
            )
        windows = [int(window) if t == "sliding_attention" else None for t in types]
    elif window is not None and getattr(cfg, "use_sliding_window", True):
        windows = [int(window)] * n_layers
    else:
        windows = [None] * n_layers
    if not causal and any(w is not None for w in windows):
        raise SystemExit("bidirectional sliding-window layers are not modelled here")
    return windows


def visibility(n: int, causal: bool, window: int | None) -> torch.Tensor:
    """[query, key] bool: the keys each query can see (causal ``k <= q``; window ``q - w < k``)."""
    idx = torch.arange(n)
    vis = (idx[None, :] <= idx[:, None]) if causal else torch.ones(n, n, dtype=torch.bool)
    if window is not None:
        vis = vis & (idx[:, None] - idx[None, :] < window)
    return vis


def is_punctuation(text: str) -> bool:
    s = text.strip()
    return bool(s) and all(unicodedata.category(c).startswith("P") for c in s)


# --------------------------------------------------------------------------- the maths


class Acc:
    """Per-head running sums of f, per-layer sums of chance, and the pair count n, for one
    metric."""

    def __init__(self, n_layers: int, n_heads: int):
        self.f = np.zeros((n_layers, n_heads))
        self.chance = np.zeros(n_layers)
        self.n = 0

    def add(self, f_sum: np.ndarray, chance_sum, count: int):
        """``chance_sum``: one number for every layer, or one per layer."""
        self.f += f_sum
        self.chance += chance_sum
        self.n += count

    def result(self, nan_score: bool = False):
        if self.n == 0:
            return np.full_like(self.f, np.nan), np.full_like(self.chance, np.nan), 0
        score = np.full_like(self.f, np.nan) if nan_score else self.f / self.n
        return (
            score,
            (np.full_like(self.chance, np.nan) if nan_score else self.chance / self.n),
            self.n,
        )


def attentions(
    model, ids: list[int], device: str, token_types: list[int] | None = None
) -> torch.Tensor:
    """[layer, head, query, key] float64, one sequence, no padding; ``token_types`` fed when
    given."""
    x = torch.tensor([ids], dtype=torch.long, device=device)
    extra = (
        {}
        if token_types is None
        else {"token_type_ids": torch.tensor([token_types], device=device)}
    )
    # The bare transformer of a *ForCausalLM: same attention, no unembedding (~20% of the time).
    body = getattr(model, "base_model", model) or model
    with torch.no_grad():
        out = body(input_ids=x, output_attentions=True, **extra)
    att = out.attentions
    if att is None or any(a is None for a in att):
        raise RuntimeError("the model returned no attention weights (is attention eager?)")
    return torch.stack([a[0] for a in att]).to(torch.float64).cpu()


def _per_layer(windows: list[int | None], fn) -> np.ndarray:
    """``fn(window)`` for each layer, computed once per distinct window."""
    memo = {w: fn(w) for w in set(windows)}
    return np.array([memo[w] for w in windows], dtype=np.float64)


def score_text(
    A: torch.Tensor,
    ids: list[int],
    causal: bool,
    sep_id,
    punct_ids: set,
    accs: dict,
    windows: list[int | None] | None = None,
):
    n = len(ids)
    idx = torch.arange(n)
    windows = windows or [None] * A.shape[0]
    visible = visibility(n, causal, None)  # what decides the qualifying queries (never the window)

    def uniform_sum(queries, keys):
        """Per layer: sum over ``queries`` of a uniform head's weight on key ``keys[i]``."""

        def one(w):
            vis = visibility(n, causal, w)
            return (vis[queries, keys].double() / vis[queries].sum(1)).sum().item()

        return _per_layer(windows, one)

    q = idx[1:]  # 1 <= q <= n-1
    accs["previous_token"].add(A[:, :, q, q - 1].sum(-1).numpy(), uniform_sum(q, q - 1), len(q))
    accs["sink"].add(A[:, :, q, 0].sum(-1).numpy(), uniform_sum(q, torch.zeros_like(q)), len(q))
    ent = -torch.special.xlogy(A[:, :, q, :], A[:, :, q, :]).sum(-1)  # 0 ln 0 = 0
    accs["entropy"].add(
        ent.sum(-1).numpy(),
        _per_layer(
            windows, lambda w: torch.log(visibility(n, causal, w)[q].sum(1).double()).sum().item()
        ),
        len(q),
    )

    q = idx[:-1]  # 0 <= q <= n-2
    accs["next_token"].add(A[:, :, q, q + 1].sum(-1).numpy(), uniform_sum(q, q + 1), len(q))

    ids_t = torch.tensor(ids)
    for name, key_ok in (
        ("separator", ids_t == (sep_id if sep_id is not None else -1)),
        ("punctuation", torch.tensor([i in punct_ids for i in ids])),
    ):
        key_ok = key_ok.clone()
        key_ok[0] = False  # position 0 never counts as a separator/punctuation key
        M = visible & key_ok[None, :]  # [q, k] visible keys of the class
        qual = M.any(1)
        f = (A * M.to(A.dtype)).sum(-1)[:, :, qual].sum(-1)

        def chance(w, key_ok=key_ok, qual=qual):
            vis = visibility(n, causal, w)
            return ((vis & key_ok[None, :]).sum(1).double() / vis.sum(1))[qual].sum().item()

        accs[name].add(f.numpy(), _per_layer(windows, chance), int(qual.sum()))


def score_repeat(
    A: torch.Tensor,
    ids: list[int],
    L: int,
    causal: bool,
    accs: dict,
    where: str,
    windows: list[int | None] | None = None,
):
    n = len(ids)
    q = torch.arange(L + 1, 2 * L + 1)  # L+1 <= q <= 2L
    if int(q[-1]) >= n:
        raise ValueError(f"{where}: sequence of {n} tokens is too short for repeat_len {L}")
    if any(ids[i] != ids[i - L] for i in q.tolist()):
        print(
            f"warning: {where}: token at q differs from token at q-L (not BOS+R+R?)",
            file=sys.stderr,
        )
    windows = windows or [None] * A.shape[0]

    def chance(offset):
        def one(w):
            vis = visibility(n, causal, w)
            return (vis[q, q - offset].double() / vis[q].sum(1)).sum().item()

        return _per_layer(windows, one)

    accs["induction"].add(A[:, :, q, q - L + 1].sum(-1).numpy(), chance(L - 1), len(q))
    accs["duplicate_token"].add(A[:, :, q, q - L].sum(-1).numpy(), chance(L), len(q))


def score_streaming(
    A: torch.Tensor,
    ids: list[int],
    causal: bool,
    accs: dict,
    sinks: int,
    window: int,
    windows: list[int | None],
):
    """Mass on keys k < sinks or q - window < k <= q, over queries sinks + window <= q <= n-1."""
    n = len(ids)
    q = torch.arange(sinks + window, n)
    if not causal or len(q) == 0:
        accs["streaming"].add(np.zeros(A.shape[:2]), np.zeros(A.shape[0]), 0)
        return
    k = torch.arange(n)
    # [q, k]
    band = (k[None, :] < sinks) | ((q[:, None] - k[None, :] < window) & (k[None, :] <= q[:, None]))
    f = (A[:, :, q, :] * band.double()).sum(-1).sum(-1)

    def one(w):
        vis = visibility(n, causal, w)[q]
        return ((vis & band).sum(1).double() / vis.sum(1)).sum().item()

    accs["streaming"].add(f.numpy(), _per_layer(windows, one), len(q))


def score_needle(
    A: torch.Tensor,
    ids: list[int],
    causal: bool,
    accs: dict,
    needle: dict,
    windows: list[int | None],
):
    """Answer query q = answer_start + j - 1 copies key needle_start + j: arg-max hit, and
    weight."""
    n = len(ids)
    j = torch.arange(int(needle["k"]))
    q = int(needle["answer_start"]) - 1 + j
    key = int(needle["needle_start"]) + j
    hits = (A[:, :, q, :].argmax(-1) == key).double().sum(-1)
    soft = A[:, :, q, key].sum(-1)

    def one(w):
        vis = visibility(n, causal, w)
        return (vis[q, key].double() / vis[q].sum(1)).sum().item()

    chance = _per_layer(windows, one)  # a head picking a visible key at random
    accs["retrieval"].add(hits.numpy(), chance, len(q))
    accs["retrieval_soft"].add(soft.numpy(), chance, len(q))


def read_tokens(run_dir: Path) -> list[dict]:
    with open(run_dir / "tokens.jsonl") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def recompute(
    run_dir, model_dir=None, device: str = "cpu", progress: bool = False, threads: int | None = 1
) -> pd.DataFrame:
    """The recomputed long table of ``run_dir``: one row per (metric, layer, head).

    ``threads``: torch intra-op threads while recomputing (restored afterwards; None = leave as is).
    One thread is the default because on a shared 2-core machine two OpenMP threads ran the same
    SmolLM2 forward 5-8x slower than one.
    """
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _recompute(Path(run_dir), model_dir, device, progress)
    finally:
        torch.set_num_threads(old_threads)


def _recompute(run_dir: Path, model_dir, device: str, progress: bool) -> pd.DataFrame:
    meta = json.loads((run_dir / "metadata.json").read_text())
    dtype = getattr(torch, str(meta.get("dtype", "float32")))
    model, tok, causal = load(model_folder(meta, model_dir), dtype=dtype, device=device)
    if "causal" in meta and bool(meta["causal"]) != causal:
        print(
            f"warning: metadata says causal={meta['causal']}, the model loaded here is "
            f"causal={causal}",
            file=sys.stderr,
        )

    sep_id = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    records = read_tokens(run_dir)
    vocab_ids = sorted({i for r in records if r["probe"] == "text" for i in r["token_ids"]})
    punct_ids = {i for i in vocab_ids if is_punctuation(tok.decode([i]))}

    cfg = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    windows = layer_windows(cfg, int(cfg.num_hidden_layers), causal)
    settings = meta.get("settings") or {}
    scanned = (
        set(pd.read_csv(run_dir / "scores.csv", usecols=["metric"]).metric)
        if (run_dir / "scores.csv").is_file()
        else set()
    )
    long = bool(settings.get("long_context")) or bool(scanned & set(LONG_METRICS))
    sinks, window = int(settings.get("sinks", 4)), int(settings.get("window", 64))
    names = {**METRICS, **(LONG_METRICS if long else {})}
    accs = None
    for j, rec in enumerate(records):
        ids = [int(i) for i in rec["token_ids"]]
        A = attentions(model, ids, device, rec.get("token_type_ids"))
        if accs is None:
            accs = {m: Acc(A.shape[0], A.shape[1]) for m in names}
        if rec["probe"] == "text":
            score_text(A, ids, causal, sep_id, punct_ids, accs, windows)
            if long:
                score_streaming(A, ids, causal, accs, sinks, window, windows)
        elif rec["probe"] == "needle":
            score_needle(A, ids, causal, accs, rec["needle"], windows)
        elif rec["probe"] == "repeat":
            score_repeat(
                A,
                ids,
                int(rec["repeat_len"]),
                causal,
                accs,
                where=f"repeat sequence {rec.get('index')}",
                windows=windows,
            )
        else:
            raise ValueError(f"unknown probe {rec['probe']!r} in tokens.jsonl line {j + 1}")
        if progress and (j + 1) % 16 == 0:
            print(f"  {j + 1}/{len(records)} sequences", file=sys.stderr)
    if accs is None:
        raise ValueError(f"{run_dir / 'tokens.jsonl'} holds no sequence")

    rows = []
    for metric, probe in names.items():
        score, chance, n = accs[metric].result(nan_score=(metric == "next_token" and causal))
        for layer in range(score.shape[0]):
            for head in range(score.shape[1]):
                rows.append(
                    dict(
                        model=meta.get("model"),
                        metric=metric,
                        probe=probe,
                        layer=layer,
                        head=head,
                        head_name=f"L{layer}H{head}",
                        score=float(score[layer, head]),
                        chance=float(chance[layer]),
                        n=n,
                    )
                )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- comparison


def _diff(a: pd.Series, b: pd.Series) -> pd.Series:
    """|a-b|, 0 where both are NaN, inf where exactly one is."""
    a, b = a.astype(float), b.astype(float)
    d = (a - b).abs()
    both = a.isna() & b.isna()
    one = a.isna() ^ b.isna()
    return d.mask(both, 0.0).mask(one, np.inf)


def compare(ours: pd.DataFrame, theirs: pd.DataFrame, tol: float = 1e-3):
    """(per-metric summary DataFrame, list of problem strings)."""
    key = ["metric", "layer", "head"]
    m = theirs.merge(ours, on=key, how="outer", suffixes=("_run", "_re"), indicator=True)
    problems = []
    only_run = m[m["_merge"] == "left_only"]
    only_re = m[m["_merge"] == "right_only"]
    if len(only_run):
        problems.append(
            f"{len(only_run)} rows of scores.csv not recomputed "
            f"(metrics {sorted(only_run.metric.unique())})"
        )
    run_metrics = set(theirs.metric)
    missing = only_re[~only_re.metric.isin(run_metrics)].metric.unique()
    if len(missing):
        print(f"note: metrics not in scores.csv (not compared): {sorted(missing)}", file=sys.stderr)
    if len(only_re[only_re.metric.isin(run_metrics)]):
        problems.append(
            f"{len(only_re[only_re.metric.isin(run_metrics)])} (metric, layer, head) "
            "rows missing from scores.csv"
        )
    both = m[m["_merge"] == "both"].copy()
    both["d_score"] = _diff(both.score_run, both.score_re)
    both["d_chance"] = _diff(both.chance_run, both.chance_re)
    both["n_bad"] = both.n_run.astype(int) != both.n_re.astype(int)
    summary = both.groupby("metric", sort=False).agg(
        max_d_score=("d_score", "max"),
        max_d_chance=("d_chance", "max"),
        n_run=("n_run", "first"),
        n_re=("n_re", "first"),
        n_mismatch=("n_bad", "sum"),
    )
    for metric, s in summary.iterrows():
        if not (s.max_d_score <= tol):
            worst = both[both.metric == metric].sort_values("d_score").iloc[-1]
            problems.append(
                f"{metric}: score differs by {s.max_d_score:.3g} (worst L{worst.layer}H"
                f"{worst['head']}: run {float(worst.score_run):.8g}, recomputed "
                f"{float(worst.score_re):.8g})"
            )
        if not (s.max_d_chance <= tol):
            problems.append(f"{metric}: chance differs by {s.max_d_chance:.3g}")
        if s.n_mismatch:
            problems.append(
                f"{metric}: n differs on {int(s.n_mismatch)} rows "
                f"(first: run {int(s.n_run)}, recomputed {int(s.n_re)})"
            )
    return summary, problems
