"""Independent recomputation of a census run directory (``headscope census``), from its files alone.

Every row of ``scores.csv`` (score, chance, n, and the null where one exists) is recomputed from
``syntax_sentences.jsonl``, ``tokens.jsonl`` and ``metadata.json`` with plain Hugging Face modules:
eager attention weights (``output_attentions=True``) one sequence at a time, the model's own
modules read by name (value and output projections, norms, the LM head), its eager attention
function patched by hand for the no-op test, a forward pre-hook on the output projection for the
mean ablation, and every definition written out as loops (docs/census.md).

    python scripts/recompute_census.py RUN_DIR [--model-dir DIR]      # exit 0: every row agrees

On purpose this imports nothing from the census's modules (``headscope.apps``, ``metrics``,
``probes`` but the corpus text, ``effects``, ``circuits``, ``engines``); ``tests/oracles/
test_recompute_census.py`` checks its imports. Syntax accuracies must agree to 1e-6, counts and
hits exactly; effects (float32 forwards, sdpa against eager) to ``effect_tol`` (relative).
Families: Llama-style (Llama, SmolLM2, Gemma 2/3 with their ``1 + w`` norms), GPT-2 and BERT.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

OFFSETS = range(-3, 3)  # Clark's baseline offsets
DIRECTIONS = {"d2h": "dep->head", "h2d": "head->dep"}


# ------------------------------------------------------------------------------ the model


def load(folder: str):
    """``(model, tokenizer, causal)``: the checkpoint with eager attention, float32, eval mode."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(folder)
    causal = cfg.model_type not in ("bert", "roberta", "distilbert", "electra")
    cls = AutoModelForCausalLM if causal else AutoModel
    model = cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder), causal


def arch(hf) -> str:
    name = type(hf).__name__
    return (
        "gpt2"
        if "GPT2" in name
        else "bert"
        if "Bert" in name
        else "gemma"
        if "Gemma" in name
        else "llama"
    )


def layers(hf) -> list:
    a = arch(hf)
    return list(
        hf.transformer.h if a == "gpt2" else hf.encoder.layer if a == "bert" else hf.model.layers
    )


def shape(hf) -> tuple[int, int, int]:
    """(layers, heads, d_head)."""
    cfg = hf.config
    heads = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    d = getattr(cfg, "hidden_size", None) or cfg.n_embd
    return len(layers(hf)), heads, getattr(cfg, "head_dim", None) or d // heads


def o_proj(hf, layer: int):
    """The module that reads the heads' outputs ``[.., head * d_head]`` (the seam's output)."""
    blk = layers(hf)[layer]
    a = arch(hf)
    return (
        blk.attn.c_proj
        if a == "gpt2"
        else blk.attention.output.dense
        if a == "bert"
        else blk.self_attn.o_proj
    )


def hidden(hf, tokens: torch.Tensor) -> tuple:
    with torch.no_grad():
        return hf(input_ids=tokens, output_hidden_states=True).hidden_states


def attentions(hf, ids: list[int]) -> np.ndarray:
    """``[layer, head, n, n]`` float64 attention weights of one sequence."""
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([ids]), output_attentions=True)
    return np.stack([a[0].double().numpy() for a in out.attentions])


def head_out(hf, x: torch.Tensor, layer: int, head: int) -> torch.Tensor:
    """``x`` ``[n, d_model]`` entering block ``layer``: what head ``head`` writes into the residual
    stream if it attends to that position alone: its value there (bias included), through its
    slice of the output projection (bias dropped: it does not depend on the input; Gemma: times
    the post-attention norm's gain ``1 + w``)."""
    blk = layers(hf)[layer]
    _, H, dh = shape(hf)
    a = arch(hf)
    with torch.no_grad():
        if a == "gpt2":
            d = x.shape[-1]
            v = blk.attn.c_attn(blk.ln_1(x))[:, 2 * d :]  # Conv1D, bias included: [n, d]
            z = v[:, head * dh : (head + 1) * dh]
            return z @ blk.attn.c_proj.weight[head * dh : (head + 1) * dh, :]
        if a == "bert":  # post-norm: the block's input is what the value projection reads
            z = blk.attention.self.value(x)[:, head * dh : (head + 1) * dh]
            return z @ blk.attention.output.dense.weight[:, head * dh : (head + 1) * dh].T
        g = H // hf.config.num_key_value_heads
        kv = head // g
        z = blk.input_layernorm(x) @ blk.self_attn.v_proj.weight[kv * dh : (kv + 1) * dh].T
        out = z @ blk.self_attn.o_proj.weight[:, head * dh : (head + 1) * dh].T
        if a == "gemma":
            out = out * (1 + blk.post_attention_layernorm.weight)
        return out


def read_logits(hf, out: torch.Tensor, readout: str) -> torch.Tensor:
    """A head's output read through the unembedding (final norm's gain folded in, centred for
    GPT-2's LayerNorm) or through the input embeddings (``embeddings``)."""
    with torch.no_grad():
        if readout == "embeddings":
            return out @ hf.get_input_embeddings().weight.T
        a = arch(hf)
        if a == "gpt2":
            out = out - out.mean(-1, keepdim=True)
            return (out * hf.transformer.ln_f.weight) @ hf.lm_head.weight.T
        gain = (1 + hf.model.norm.weight) if a == "gemma" else hf.model.norm.weight
        return (out * gain) @ hf.lm_head.weight.T


# ------------------------------------------------------------------------------ syntax


def word_map(A: np.ndarray, spans) -> np.ndarray:
    """To a word: the sum over its tokens; from a word: the mean over its tokens (loops)."""
    W = len(spans)
    M = np.zeros(A.shape[:-2] + (W, W))
    for i, (si, ei) in enumerate(spans):
        for j, (sj, ej) in enumerate(spans):
            M[..., i, j] = A[..., si:ei, sj:ej].sum(-1).sum(-1) / (ei - si)
    return M


def _predict(M, i, direction, causal):
    W = M.shape[-1]
    if direction == "dep->head":
        cands = [j for j in range(W) if j != i and (not causal or j < i)]
        values = [M[..., i, j] for j in cands]
    else:
        cands = [j for j in range(W) if j != i and (not causal or j > i)]
        values = [M[..., j, i] for j in cands]
    if not cands:
        return None
    return np.array(cands)[np.argmax(np.stack(values, -1), -1)]  # the first maximum


def syntax_rows(hf, causal: bool, sentences: list[dict]) -> dict:
    """``{(relation, direction): {"acc": [layer, head], "n", "chance", "baseline"}}`` (loops)."""
    correct, base, count, chance = (
        defaultdict(float),
        defaultdict(lambda: np.zeros(len(OFFSETS))),
        defaultdict(int),
        defaultdict(float),
    )
    for s in sentences:
        M = word_map(attentions(hf, s["token_ids"]), s["word_tokens"])  # [layer, head, W, W]
        words, heads, rels = s["words"], s["heads"], s["relations"]
        W = len(words)
        preds = {d: [_predict(M, i, d, causal) for i in range(W)] for d in DIRECTIONS.values()}
        none = np.full(M.shape[:2], -1)
        for d in DIRECTIONS.values():
            for i in range(W):
                y = heads[i]
                special = rels[i] == "poss" and i + 1 < W and words[i + 1] in ("'s", "s'")
                q = i + 1 if special else i  # Clark: a possessor is judged by its 's
                if causal and not (
                    (d == "dep->head" and 0 <= y < q) or (d == "head->dep" and y > q)
                ):
                    continue
                p_i = none if preds[d][i] is None else preds[d][i]
                chosen = p_i
                if special:
                    p_n = none if preds[d][i + 1] is None else preds[d][i + 1]
                    chosen = np.where(p_i != W - 1, p_n, p_i)
                offs = []
                for k in OFFSETS:
                    b_i = max(-1, min(i + k, W - 1))
                    b = max(-1, min(i + 1 + k, W - 1)) if special and b_i != W - 1 else b_i
                    offs.append(b == y)
                n_cand = (q if d == "dep->head" else W - 1 - q) if causal else W - 1
                for rel in (rels[i], "all"):
                    correct[(rel, d)] = correct[(rel, d)] + (chosen == y)
                    base[(rel, d)] = base[(rel, d)] + np.array(offs)
                    count[(rel, d)] += 1
                    chance[(rel, d)] += 1.0 / max(n_cand, 1)
    return {
        k: {
            "acc": correct[k] / count[k],
            "n": count[k],
            "chance": chance[k] / count[k],
            "baseline": float(base[k].max() / count[k]),
        }
        for k in count
    }


# ------------------------------------------------------------------------------ no-op and ablation


def _eager_module(hf):
    attn = next(
        m
        for m in hf.modules()
        if isinstance(getattr(m, "layer_idx", None), int) or "SelfAttention" in type(m).__name__
    )
    return sys.modules[type(attn).__module__]


class _Bar:
    """HF's eager attention with head ``head`` of ``layer`` barred from the keys ``drop`` (rows
    that would see nothing else are left as they were)."""

    def __init__(self, hf, layer, head, drop):
        self.mod, self.layer, self.head, self.drop = _eager_module(hf), layer, head, drop
        self.index = {id(m): i for i, blk in enumerate(layers(hf)) for m in blk.modules()}

    def __enter__(self):
        original = self.original = self.mod.eager_attention_forward

        def eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
            if self.index.get(id(module)) != self.layer:
                return original(
                    module,
                    query,
                    key,
                    value,
                    attention_mask,
                    scaling=scaling,
                    dropout=dropout,
                    **kwargs,
                )
            scaling = query.size(-1) ** -0.5 if scaling is None else scaling
            g = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
            w = query @ key.transpose(-1, -2) * scaling  # [batch, head, query, key]
            if attention_mask is not None:
                w = w + attention_mask[..., : key.shape[-2]]
            visible = w > torch.finfo(w.dtype).min / 2
            bar = self.drop[:, None, :].expand_as(w[:, self.head]) & visible[:, self.head]
            keeps = (visible[:, self.head] & ~bar).any(-1, keepdim=True)
            w[:, self.head] = w[:, self.head].masked_fill(bar & keeps, float("-inf"))
            p = w.softmax(-1)
            return (p @ value).transpose(1, 2), p

        self.mod.eager_attention_forward = eager

    def __exit__(self, *exc):
        self.mod.eager_attention_forward = self.original


def _target(hf, causal: bool, x: torch.Tensor):
    with torch.no_grad():
        if causal:
            logits = hf(input_ids=x).logits[0, :-1]
            return F.cross_entropy(logits.double(), x[0, 1:], reduction="sum")
        return hf(input_ids=x).last_hidden_state[0].mean(0).double()


def _change(causal, clean, changed) -> float:
    return (
        float(changed - clean) if causal else float(1 - F.cosine_similarity(clean, changed, dim=0))
    )


def noop_rows(hf, causal: bool, seqs: list[list[int]], sep_id: int) -> tuple[np.ndarray, int]:
    """Per head, the pooled no-op effect, and the target count."""
    L, H, _ = shape(hf)
    total, n = np.zeros((L, H)), 0
    for ids in seqs:
        x = torch.tensor([ids])
        drop = torch.zeros(1, len(ids), dtype=torch.bool)
        if causal:
            drop[0, 0] = True
        else:
            drop[0, 1:] = x[0, 1:] == sep_id
        clean = _target(hf, causal, x)
        n += len(ids) - 1 if causal else 1
        for la in range(L):
            for h in range(H):
                with _Bar(hf, la, h, drop):
                    total[la, h] += _change(causal, clean, _target(hf, causal, x))
    return total / n, n


def ablation_rows(hf, causal: bool, seqs: list[list[int]]) -> tuple[np.ndarray, int]:
    """Per head, the pooled effect of replacing its output slice by its mean over every position."""
    L, H, dh = shape(hf)
    sums, count = [0.0] * L, 0
    for ids in seqs:  # each head's mean output, from a pre-hook on the output projection
        grabbed = {}
        hooks = [
            o_proj(hf, la).register_forward_pre_hook(
                lambda m, a, la=la, grabbed=grabbed: grabbed.__setitem__(la, a[0][0].double())
            )
            for la in range(L)
        ]
        try:
            with torch.no_grad():
                hf(input_ids=torch.tensor([ids]))
        finally:
            for hk in hooks:
                hk.remove()
        for la in range(L):
            sums[la] = sums[la] + grabbed[la].sum(0)
        count += len(ids)
    means = [s / count for s in sums]  # [head * d_head] per layer
    total, n = np.zeros((L, H)), 0
    for ids in seqs:
        x = torch.tensor([ids])
        clean = _target(hf, causal, x)
        n += len(ids) - 1 if causal else 1
        for la in range(L):
            for h in range(H):

                def put(m, a, h=h, la=la):
                    z = a[0].clone()
                    z[..., h * dh : (h + 1) * dh] = means[la][h * dh : (h + 1) * dh].to(z.dtype)
                    return (z,)

                hk = o_proj(hf, la).register_forward_pre_hook(put)
                try:
                    total[la, h] += _change(causal, clean, _target(hf, causal, x))
                finally:
                    hk.remove()
    return total / n, n


def weight_rows(
    hf, causal: bool, seqs: list[list[int]], sep_id: int
) -> tuple[np.ndarray, float, int]:
    """The no-op test's weight: sink (decoders) or separator mass (encoders); its uniform chance."""
    L, H, _ = shape(hf)
    total, chance, n = np.zeros((L, H)), 0.0, 0
    for ids in seqs:
        A = attentions(hf, ids)
        sep = [k for k in range(1, len(ids)) if ids[k] == sep_id]
        for q in range(len(ids)):
            if causal:
                if q == 0:
                    continue
                total += A[:, :, q, 0]
                chance += 1.0 / (q + 1)
            else:
                if not sep:
                    continue
                total += A[:, :, q, sep].sum(-1)
                chance += len(sep) / len(ids)
            n += 1
    return total / n, chance / n, n


# ------------------------------------------------------------------------------ OV readings


def successor_rows(hf, meta: dict, readout: str) -> dict:
    """Score, chance, n and null of every head, from the saved ordinal sets (loops)."""
    L, H, _ = shape(hf)
    rec = meta["successor"]
    sets = rec["sets"]
    seed, n_null = int(meta["seed"]), int(rec["n_null"])
    gen = torch.Generator().manual_seed(
        seed
    )  # the documented draw: per set in order, n_null permutations
    perms = {
        name: torch.stack(
            [torch.randperm(len(s["token_ids"]), generator=gen) for _ in range(n_null)]
        )
        for name, s in sets.items()
    }
    hits, null = np.zeros((L, H)), np.zeros((n_null, L, H))
    n = sum(len(s["pairs"]) for s in sets.values())
    chance = sum(len(s["pairs"]) / len(s["token_ids"]) for s in sets.values()) / n
    for name, s in sets.items():
        ids = torch.tensor(s["token_ids"]).view(-1, 1)  # each token alone, no BOS
        hs = hidden(hf, ids)
        for la in range(L):
            x = hs[0 if la == 0 else 1][
                :, 0
            ].float()  # layer 0: the raw embedding; later: after block 0
            for h in range(H):
                top = read_logits(hf, head_out(hf, x, la, h), readout)[:, s["token_ids"]].argmax(
                    -1
                )  # [|S|]
                for a, b in s["pairs"]:
                    hits[la, h] += int(top[a]) == b
                    null[:, la, h] += (perms[name][:, b] == int(top[a])).numpy()
    return {"score": hits / n, "chance": chance, "n": n, "null": null.mean(0) / n}


def ordinary_vocab(tok) -> torch.Tensor:
    special = set(tok.all_special_ids) | {int(i) for i in (tok.added_tokens_decoder or {})}
    return torch.tensor([i for i in range(len(tok)) if i not in special])


def copy_suppression_rows(hf, tok, seqs: list[list[int]], L_rep: int, k: int, readout: str) -> dict:
    """Own-token (and control-token) logit among the ``k`` lowest of the ordinary vocabulary."""
    L, H, _ = shape(hf)
    vocab = ordinary_vocab(tok)
    vocab = vocab[
        vocab
        < read_logits(hf, torch.zeros(1, hf.get_input_embeddings().weight.shape[1]), readout).shape[
            -1
        ]
    ]
    hits, ctrl, n = np.zeros((L, H)), np.zeros((L, H)), 0
    for ids in seqs:
        first = ids[1 : L_rep + 1]
        other = (
            first[L_rep // 2 :] + first[: L_rep // 2]
        )  # the token L // 2 further along, cyclically
        hs = hidden(hf, torch.tensor([ids]))
        n += L_rep
        for la in range(L):
            x = hs[la][0, 1 : L_rep + 1].float()
            for h in range(H):
                logits = read_logits(hf, head_out(hf, x, la, h), readout)[:, vocab]  # [L, V]
                col = {int(t): i for i, t in enumerate(vocab.tolist())}
                for p in range(L_rep):
                    row = logits[p]
                    hits[la, h] += int((row < row[col[first[p]]]).sum()) < k
                    ctrl[la, h] += int((row < row[col[other[p]]]).sum()) < k
    return {"score": hits / n, "null": ctrl / n, "chance": k / len(vocab), "n": n}


def rare_word_rows(hf, tok, causal: bool, seqs: list[list[int]]) -> dict:
    """Arg-max key = a least frequent counted key (unigram counts of both corpus parts)."""
    from headscope.probes.corpus import (
        long_text,
    )  # the prose itself (data), not the census's counts

    counts: dict[int, int] = defaultdict(int)
    for part in ("scan", "heldout"):
        for i in tok(long_text(part), add_special_tokens=False)["input_ids"]:
            counts[i] += 1
    special = set(tok.all_special_ids) | {int(i) for i in (tok.added_tokens_decoder or {})}
    L, H, _ = shape(hf)
    hits, chance, n = np.zeros((L, H)), 0.0, 0
    for ids in seqs:
        A = attentions(hf, ids)
        for q in range(len(ids)):
            keys = [
                k
                for k in range(1, q + 1 if causal else len(ids))
                if k != q and ids[k] not in special
            ]
            if not keys:
                continue
            n += 1
            chance += 1.0 / len(keys)
            rarest = min(counts[ids[k]] for k in keys)
            top = A[:, :, q, : q + 1 if causal else len(ids)].argmax(
                -1
            )  # [layer, head], first maximum
            for la in range(L):
                for h in range(H):
                    t = int(top[la, h])
                    hits[la, h] += t in keys and counts[ids[t]] == rarest
    return {"score": hits / n, "chance": chance / n, "n": n}


# ------------------------------------------------------------------------------ the run


def recompute(run_dir, model_dir=None, progress=None) -> pd.DataFrame:
    """Every census row of ``run_dir`` recomputed: ``metric, layer, head, score, chance, n,
    null``."""
    from tests.oracles.recompute import model_folder

    say = progress or (lambda _m: None)
    run = Path(run_dir)
    meta = json.loads((run / "metadata.json").read_text())
    theirs = pd.read_csv(run / "scores.csv")
    metrics = set(theirs["metric"])
    hf, tok, causal = load(model_folder(meta, model_dir))
    sep = meta["special_tokens"]["separator"]
    tokens = [json.loads(line) for line in (run / "tokens.jsonl").read_text().splitlines()]
    text = [t["token_ids"] for t in tokens if t["probe"] == "text"]
    rep = [t for t in tokens if t["probe"] == "repeat"]
    out = []

    def add(metric, score, chance, n, null=None):
        for la in range(score.shape[0]):
            for h in range(score.shape[1]):
                out.append(
                    {
                        "metric": metric,
                        "layer": la,
                        "head": h,
                        "score": float(score[la, h]),
                        "chance": float(chance),
                        "n": int(n),
                        "null": float(null[la, h])
                        if null is not None and np.ndim(null)
                        else (float(null) if null is not None else float("nan")),
                    }
                )

    if any(m.startswith("syntax_") for m in metrics):
        say("syntax: word maps and Clark's evaluation, as loops")
        sents = [
            json.loads(line) for line in (run / "syntax_sentences.jsonl").read_text().splitlines()
        ]
        for (rel, d), r in syntax_rows(hf, causal, sents).items():
            short = "d2h" if d == "dep->head" else "h2d"
            if f"syntax_{rel}.{short}" in metrics:
                add(
                    f"syntax_{rel}.{short}",
                    r["acc"],
                    r["chance"],
                    r["n"],
                    np.full(r["acc"].shape, r["baseline"]),
                )
    noop_seqs = text[: int(meta.get("noop", {}).get("sequences", 0))]
    for m in ("effect_noop_text_loss", "effect_noop_embedding"):
        if m in metrics:
            say("no-op test: HF eager attention patched by hand")
            score, n = noop_rows(hf, causal, noop_seqs, sep)
            add(m, score, 0.0, n)
    if "noop_weight" in metrics:
        score, chance, n = weight_rows(hf, causal, noop_seqs, sep)
        add("noop_weight", score, chance, n)
    for m in ("effect_text_loss", "effect_embedding"):
        if m in metrics:
            say("mean ablation: a pre-hook on the output projection")
            score, n = ablation_rows(hf, causal, noop_seqs)
            add(m, score, 0.0, n)
    for m, readout in (("successor", "unembedding"), ("successor_embeddings", "embeddings")):
        if m in metrics:
            say("successor: plain modules on each token alone")
            r = successor_rows(hf, meta, readout)
            add(m, r["score"], r["chance"], r["n"], r["null"])
    for m, readout in (
        ("copy_suppression", "unembedding"),
        ("copy_suppression_embeddings", "embeddings"),
    ):
        if m in metrics:
            say("copy suppression: plain modules at the first copy")
            cs = meta["copy_suppression"]
            seqs = [t["token_ids"] for t in rep][: int(cs["sequences"])]
            r = copy_suppression_rows(
                hf, tok, seqs, int(rep[0]["repeat_len"]), int(cs["k"]), readout
            )
            add(m, r["score"], r["chance"], r["n"], r["null"])
    if "rare_word" in metrics:
        say("rare_word: HF eager attention and a recount of the prose")
        r = rare_word_rows(hf, tok, causal, text)
        add("rare_word", r["score"], r["chance"], r["n"])
    return pd.DataFrame(out)


#: Tolerances per kind of row: (absolute on score/chance/null, relative on effects)
TOL = {"syntax": 1e-6, "hits": 1e-6, "weight": 1e-5}


def compare(
    ours: pd.DataFrame, theirs: pd.DataFrame, effect_tol: float = 2e-2
) -> tuple[int, list[str]]:
    """``(rows compared, problems)``: every row of ``theirs`` (a census's ``scores.csv``) against
    ``ours``. NaN rows (not measured) must be NaN in both or absent here."""
    mine = ours.set_index(["metric", "layer", "head"])
    problems, n = [], 0
    for r in theirs.itertuples():
        key = (r.metric, r.layer, r.head)
        if key not in mine.index:
            if not (isinstance(r.score, float) and math.isnan(r.score)):
                problems.append(f"{r.metric} L{r.layer}H{r.head}: not recomputed")
            continue
        m = mine.loc[key]
        n += 1
        if int(m["n"]) != int(r.n):
            problems.append(f"{r.metric} L{r.layer}H{r.head}: n {r.n} vs {int(m['n'])}")
        effect = r.metric.startswith("effect_")
        for col in ("score", "chance", "null"):
            a, b = float(getattr(r, col)), float(m[col])
            if math.isnan(a) and math.isnan(b):
                continue
            if effect and col == "score":
                scale = max(1e-4, float(theirs.loc[theirs.metric == r.metric, "score"].abs().max()))
                ok = abs(a - b) <= effect_tol * scale
            else:
                ok = abs(a - b) <= (TOL["weight"] if r.metric == "noop_weight" else 1e-6)
            if not ok:
                problems.append(f"{r.metric} L{r.layer}H{r.head} {col}: {a:.8g} vs {b:.8g}")
    return n, problems
