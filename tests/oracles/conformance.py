"""Conformance: for each model family transformers ships, does every engine score it exactly?

For every family below, a tiny random model of that family (2-3 layers, 4 heads, a sliding window
that bites where the family has one) is scanned by every registered engine, and each score, chance
and n is compared with the same 8 metrics computed here, from scratch, from Hugging Face's own eager
attention weights (``output_attentions=True``) on the same token ids. The outcome of a (family,
engine) pair is one of:

* ``exact``: every score and chance within 1e-5 and every n equal;
* ``refused``: the engine said, in one line, that it cannot score this model (and which engine can);
* ``wrong``: it scored the model and the scores differ (a bug: never shipped as supported);
* ``error``: it crashed with something other than a one-line refusal (a bug too).

The oracle imports nothing from ``headscope.metrics``/``extract``/``scoring``: a key is visible to a
query in a layer exactly when HF's eager attention gives it a weight above 0 (masked keys get
exactly 0), so sliding windows, padding and causality come from the model itself, not from
headscope's reading of its config.

    python -m scripts.conformance                 # run, print the table
    python -m scripts.conformance --write         # ... and write headscope/data/support.json

``tests/apps/test_conformance.py`` runs the same :func:`check` per family and engine, and checks
that the shipped ``support.json`` (:mod:`headscope.engines.support`) and the site's table (generated
from it) say what the run found. The tokenizers here are also what the tests' tiny models use
(``tests/tiny_models.py``). An oracle, so not part of the package: it lives beside the tests.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field

import numpy as np
import torch

TOL = 1e-5

CORPUS = [
    "The river bank flooded after the storm, and the path was closed.",
    "A cat sat on the mat; the dog slept by the door.",
    "Where is the key? It is on the table, next to the book.",
    "She ran to the station, but the train had already left!",
    "Numbers like 1, 2 and 3 are small; 1000 is larger.",
] * 20

WINDOW = 6  # the sliding window of the tiny configs: shorter than every probe sequence

# Shared sizes: hidden 32, 4 query heads of 8 dims, 2 KV heads where the family has grouped-query
# attention, intermediate 64. ``{V}`` is replaced by the tokenizer's vocabulary size.
_DEC = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=256,
)
_GQA = dict(_DEC, num_key_value_heads=2, head_dim=8)
_ENC = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=256,
)


@dataclass(frozen=True)
class Family:
    """One model family: its transformers ``model_type`` and a tiny config of it."""

    name: str  # as a user would say it
    model_type: str
    config: dict = field(default_factory=dict)
    encoder: bool = False
    note: str = ""  # what the tiny config exercises beyond plain softmax attention


FAMILIES: list[Family] = [
    Family("GPT-2", "gpt2", dict(n_embd=32, n_layer=2, n_head=4, n_positions=256)),
    Family(
        "GPT-Neo",
        "gpt_neo",
        dict(
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            max_position_embeddings=256,
            attention_types=[[["global", "local"], 1]],
            window_size=WINDOW,
        ),
        note=f"local layers (window {WINDOW})",
    ),
    Family("GPT-NeoX / Pythia", "gpt_neox", dict(_DEC, rotary_pct=0.25)),
    Family("GPT-J", "gptj", dict(n_embd=32, n_layer=2, n_head=4, n_positions=256, rotary_dim=4)),
    Family(
        "OPT",
        "opt",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            word_embed_proj_dim=32,
            max_position_embeddings=256,
        ),
    ),
    Family("BLOOM", "bloom", dict(hidden_size=32, n_layer=2, n_head=4), note="ALiBi"),
    Family(
        "Falcon",
        "falcon",
        dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
        note="multi-query attention",
    ),
    Family("Llama", "llama", _GQA),
    Family(
        "Mistral", "mistral", dict(_GQA, sliding_window=WINDOW), note=f"sliding window {WINDOW}"
    ),
    Family(
        "Mixtral",
        "mixtral",
        dict(_GQA, sliding_window=WINDOW, num_local_experts=2, num_experts_per_tok=1),
        note=f"sliding window {WINDOW}, mixture of experts",
    ),
    Family(
        "Qwen2",
        "qwen2",
        dict(_GQA, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
        note=f"sliding window {WINDOW} on layer 1",
    ),
    Family("Qwen3", "qwen3", _GQA, note="query/key norm"),
    Family("Phi", "phi", dict(_DEC, partial_rotary_factor=0.5)),
    Family("Phi-3", "phi3", dict(_GQA, sliding_window=WINDOW), note=f"sliding window {WINDOW}"),
    Family("Gemma", "gemma", _GQA),
    Family(
        "Gemma 2",
        "gemma2",
        dict(_GQA, sliding_window=WINDOW),
        note="logit soft-capping, sliding window",
    ),
    Family(
        "Gemma 3",
        "gemma3_text",
        dict(
            _GQA,
            num_hidden_layers=3,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        ),
        note=f"sliding window {WINDOW} on layers 0-1, query/key norm",
    ),
    Family("OLMo", "olmo", _GQA),
    Family("OLMo 2", "olmo2", _GQA, note="query/key norm"),
    Family(
        "OLMo 3",
        "olmo3",
        dict(_GQA, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]),
        note=f"sliding window {WINDOW} on layer 0",
    ),
    Family("StableLM", "stablelm", dict(_GQA, partial_rotary_factor=0.5)),
    Family(
        "Starcoder2",
        "starcoder2",
        dict(_GQA, sliding_window=WINDOW),
        note=f"sliding window {WINDOW}",
    ),
    Family("Cohere", "cohere", _GQA),
    Family("Granite", "granite", _GQA, note="attention multiplier"),
    Family("SmolLM3", "smollm3", _GQA, note="no rotary on some layers"),
    Family(
        "GPT-BigCode",
        "gpt_bigcode",
        dict(n_embd=32, n_layer=2, n_head=4, n_positions=256),
        note="multi-query attention",
    ),
    Family(
        "CodeGen",
        "codegen",
        dict(n_embd=32, n_layer=2, n_head=4, n_positions=256, rotary_dim=4, n_ctx=256),
    ),
    Family(
        "Persimmon", "persimmon", dict(_DEC, partial_rotary_factor=0.5), note="query/key layer norm"
    ),
    Family("Nemotron", "nemotron", dict(_GQA, partial_rotary_factor=0.5)),
    Family(
        "Qwen2-MoE",
        "qwen2_moe",
        dict(
            _GQA,
            num_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        ),
        note="mixture of experts",
    ),
    Family(
        "Cohere 2",
        "cohere2",
        dict(_GQA, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]),
        note=f"sliding window {WINDOW} on layer 0",
    ),
    Family(
        "GPT-OSS",
        "gpt_oss",
        dict(
            _GQA,
            num_local_experts=2,
            num_experts_per_tok=1,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
        ),
        note="learned attention sinks, sliding window",
    ),
    Family("BERT", "bert", _ENC, encoder=True),
    Family("XLM-RoBERTa", "xlm-roberta", _ENC, encoder=True),
    Family("MPNet", "mpnet", _ENC, encoder=True, note="relative position bias"),
    Family("RoBERTa", "roberta", _ENC, encoder=True),
    Family(
        "DistilBERT",
        "distilbert",
        dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=256),
        encoder=True,
    ),
    Family("ELECTRA", "electra", dict(_ENC, embedding_size=32), encoder=True),
    Family("ALBERT", "albert", dict(_ENC, embedding_size=32), encoder=True),
    Family(
        "ModernBERT",
        "modernbert",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=256,
            local_attention=WINDOW,
            global_attn_every_n_layers=2,
        ),
        encoder=True,
        note=f"local (bidirectional) window {WINDOW} on layer 1",
    ),
    Family(
        "DeBERTa-v2",
        "deberta-v2",
        dict(_ENC, relative_attention=True, position_buckets=16),
        encoder=True,
        note="disentangled relative-position attention",
    ),
]


# --------------------------------------------------------------------------- tiny models


def _decoder_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<pad>",
    )


def encoder_tokenizer():
    """A WordPiece tokenizer with [CLS]/[SEP]/[PAD]/[MASK], trained on CORPUS (also the tests' tiny
    BERT's)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(
        CORPUS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=special)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def tiny_model(family: Family, seed: int = 0):
    """(a random eager-attention model of ``family`` in eval mode, its tokenizer)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    tok = encoder_tokenizer() if family.encoder else _decoder_tokenizer()
    ids = dict(pad_token_id=tok.pad_token_id)
    if family.encoder:
        ids.update(
            bos_token_id=tok.cls_token_id,
            eos_token_id=tok.sep_token_id,
            sep_token_id=tok.sep_token_id,
            cls_token_id=tok.cls_token_id,
        )
    else:
        ids.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    cfg = AutoConfig.for_model(family.model_type, vocab_size=len(tok), **ids, **family.config)
    torch.manual_seed(seed)
    auto = AutoModelForMaskedLM if family.encoder else AutoModelForCausalLM
    model = auto.from_config(cfg, attn_implementation="eager")
    model.config.architectures = [type(model).__name__]  # as a saved checkpoint records it
    # random init keeps logits near 0; spread them so patterns are far from uniform
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and any(
                k in name
                for k in (
                    "q_proj",
                    "k_proj",
                    "query",
                    "key",
                    "qkv",
                    "c_attn",
                    "Wqkv",
                    "q_lin",
                    "k_lin",
                    "query_key_value",
                )
            ):
                p.mul_(8.0)
    return model.eval(), tok


# --------------------------------------------------------------------------- the oracle


def eager_attentions(model, ids: list[int]) -> torch.Tensor:
    """``[layer, head, query, key]`` float64 from HF's eager attention: one sequence, no padding."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    att = getattr(out, "attentions", None)
    if att is None or any(a is None for a in att):
        raise RuntimeError("the model returned no attention weights")
    return torch.stack([a[0] for a in att]).double()


def _is_punctuation(text: str) -> bool:
    s = text.strip()
    return bool(s) and all(unicodedata.category(c).startswith("P") for c in s)


def oracle_scores(model, tok, probes, causal: bool) -> dict:
    """``{metric: (score [layer, head], chance [layer], n)}``: the 8 built-in metrics (their
    definitions: headscope/catalog.py)
    from eager attention weights, a key visible to a query exactly where its weight is above 0."""
    sep = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    sums: dict = {}

    def add(name, f, chance, n):  # f [layer, head], chance [layer]
        s = sums.setdefault(name, [0.0, 0.0, 0])
        s[0] = s[0] + f
        s[1] = s[1] + chance
        s[2] += n

    for probe in probes:
        for ids in probe.sequences:
            ids = list(ids)
            n = len(ids)
            A = eager_attentions(model, ids)  # [layer, head, q, k]
            vis = A > 0
            if not bool((vis == vis[:, :1]).all()):
                raise RuntimeError("heads of one layer see different keys")
            vis = vis[:, 0].double()  # [layer, q, k]
            n_vis = vis.sum(-1)  # [layer, q]
            idx = torch.arange(n)
            if probe.name == "text":
                q = idx[1:]
                add(
                    "previous_token",
                    A[:, :, q, q - 1].sum(-1),
                    (vis[:, q, q - 1] / n_vis[:, q]).sum(-1),
                    len(q),
                )
                add("sink", A[:, :, q, 0].sum(-1), (vis[:, q, 0] / n_vis[:, q]).sum(-1), len(q))
                ent = -torch.special.xlogy(A[:, :, q], A[:, :, q]).sum(-1)
                add("entropy", ent.sum(-1), torch.log(n_vis[:, q]).sum(-1), len(q))
                q = idx[:-1]
                if not causal:
                    add(
                        "next_token",
                        A[:, :, q, q + 1].sum(-1),
                        (vis[:, q, q + 1] / n_vis[:, q]).sum(-1),
                        len(q),
                    )
                causal_vis = (
                    (idx[None, :] <= idx[:, None]) if causal else torch.ones(n, n, dtype=torch.bool)
                )
                ids_t = torch.tensor(ids)
                flags = {
                    "separator": ids_t == sep,
                    "punctuation": torch.tensor([_is_punctuation(tok.decode([i])) for i in ids]),
                }
                for name, key_ok in flags.items():
                    key_ok = key_ok.clone()
                    key_ok[0] = False
                    M = causal_vis & key_ok[None, :]  # [q, k]
                    qual = M.any(1)
                    Md = M.double()
                    f = (A * Md).sum(-1)[:, :, qual].sum(-1)
                    chance = ((vis * Md).sum(-1) / n_vis)[:, qual].sum(-1)
                    add(name, f, chance, int(qual.sum()))
            elif probe.name == "repeat":
                L = probe.repeat_len
                q = torch.arange(L + 1, 2 * L + 1)
                add(
                    "induction",
                    A[:, :, q, q - L + 1].sum(-1),
                    (vis[:, q, q - L + 1] / n_vis[:, q]).sum(-1),
                    len(q),
                )
                add(
                    "duplicate_token",
                    A[:, :, q, q - L].sum(-1),
                    (vis[:, q, q - L] / n_vis[:, q]).sum(-1),
                    len(q),
                )
    out = {k: (f / n, c / n, n) for k, (f, c, n) in sums.items() if n}
    if causal:
        out["next_token"] = None  # NaN by definition for causal models
    return out


# --------------------------------------------------------------------------- one check


@dataclass
class Outcome:
    family: str
    engine: str
    status: str  # exact | refused | wrong | error
    detail: str = ""  # the refusal line, the largest difference, or the error
    max_diff: float = math.nan

    def as_dict(self) -> dict:
        d = {"status": self.status, "detail": self.detail}
        if self.status in ("exact", "wrong"):
            d["max_diff"] = float(f"{self.max_diff:.3g}")
        return d


def probes_for(model):
    from headscope.scanner.runner import default_probes

    return default_probes(model, n_prompts=6, repeat_len=8, seed=0)


def check(family: Family, engines: list[str] | None = None) -> list[Outcome]:
    """Scan a tiny random ``family`` model with each engine and compare with the eager oracle."""
    from headscope.engines.registry import engine_names
    from headscope.errors import HeadscopeError
    from headscope.models.loading import load_model
    from headscope.scanner.runner import scan

    engines = engines or engine_names()
    try:
        hf, tok = tiny_model(family)
        model = load_model(hf, tok, name=f"tiny-{family.model_type}")
        probes = probes_for(model)
        oracle = oracle_scores(hf, tok, probes, model.causal)
    except HeadscopeError as exc:
        return [Outcome(family.name, e, "refused", str(exc).splitlines()[0]) for e in engines]
    except Exception as exc:  # noqa: BLE001 - a model headscope cannot even load is a finding
        return [
            Outcome(family.name, e, "error", f"{type(exc).__name__}: {exc}"[:300]) for e in engines
        ]
    outcomes = []
    for engine in engines:
        try:
            res = scan(model, probes, engine=engine, bootstrap=0, null=False, examples=False)
        except HeadscopeError as exc:
            line = str(exc).splitlines()[0].replace(f" on {model.name} ", " ")
            outcomes.append(Outcome(family.name, engine, "refused", line))
            continue
        except Exception as exc:  # noqa: BLE001 - recorded: a crash is a finding, not a refusal
            outcomes.append(
                Outcome(family.name, engine, "error", f"{type(exc).__name__}: {exc}"[:300])
            )
            continue
        outcomes.append(_compare(family, engine, res.scores, oracle))
    return outcomes


def _compare(family: Family, engine: str, scores, oracle: dict) -> Outcome:
    worst, where = 0.0, ""
    for metric, want in oracle.items():
        sub = scores[scores["metric"] == metric].sort_values(["layer", "head"])
        got = sub["score"].to_numpy().reshape(-1, sub["head"].nunique())
        if want is None:
            if not np.isnan(got).all():
                return Outcome(
                    family.name, engine, "wrong", f"{metric} should be NaN (causal)", math.inf
                )
            continue
        score, chance, n = want
        got_chance = sub.groupby("layer")["chance"].first().to_numpy()
        d = max(
            float(np.abs(got - score.numpy()).max()),
            float(np.abs(got_chance - chance.numpy()).max()),
        )
        bad_n = sub["n"].astype(int) != n
        if bad_n.any():
            return Outcome(
                family.name,
                engine,
                "wrong",
                f"{metric}: n {int(sub['n'][bad_n].iloc[0])} != {n}",
                math.inf,
            )
        if not d <= worst:
            worst, where = d, metric
    status = "exact" if worst <= TOL else "wrong"
    return Outcome(
        family.name,
        engine,
        status,
        "" if status == "exact" else f"{where} differs by {worst:.3g}",
        worst,
    )


# --------------------------------------------------------------------------- the table


def run(families: list[Family] | None = None, engines: list[str] | None = None, say=print) -> dict:
    """``{family name: {"model_type", "kind", "note", "engines": {engine: outcome dict}}}``."""
    table = {}
    for fam in families or FAMILIES:
        outs = check(fam, engines)
        table[fam.name] = {
            "model_type": fam.model_type,
            "kind": "encoder" if fam.encoder else "decoder",
            "note": fam.note,
            "engines": {o.engine: o.as_dict() for o in outs},
        }
        say(f"{fam.name:<20} " + "  ".join(f"{o.engine}={o.status}" for o in outs))
    return table
