"""The tests' tiny random Hugging Face models, in memory or saved as checkpoints (and a hub-cache
layout): the one place tests get them from. The tokenizers are trained on the conformance oracle's
corpus (``tests/oracles/conformance.py``); the oracle keeps its own family configs."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.oracles.conformance import CORPUS  # one training text for every tiny tokenizer


def _bpe_tokenizer(vocab_size: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )


def make_tiny_gpt2(path: Path, n_layer: int = 2, n_head: int = 4, n_ctx: int = 128) -> Path:
    model, tok = tiny_gpt2_in_memory(n_layer, n_head, n_ctx)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return Path(path)


def make_tiny_bert(path: Path, n_layer: int = 2, n_head: int = 4) -> Path:
    from transformers import BertConfig, BertForMaskedLM

    from tests.oracles.conformance import encoder_tokenizer

    fast = encoder_tokenizer()
    cfg = BertConfig(
        vocab_size=len(fast),
        hidden_size=32,
        num_hidden_layers=n_layer,
        num_attention_heads=n_head,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(0)
    BertForMaskedLM(cfg).save_pretrained(path)
    fast.save_pretrained(path)
    return Path(path)


def tiny_gpt2_in_memory(n_layer: int = 2, n_head: int = 4, n_ctx: int = 128):
    """A random GPT-2 and its tokenizer that exist only in memory (nothing on disk): (model,
    tokenizer)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = _bpe_tokenizer()
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_positions=n_ctx,
        n_embd=32,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).eval(), tok


def tiny_llama(
    n_layer: int = 2,
    n_head: int = 4,
    n_kv_head: int = 2,
    hidden: int = 32,
    intermediate: int = 64,
    n_ctx: int = 128,
    head_dim: int | None = None,
    pad: bool = True,
    seed: int = 0,
):
    """A random Llama (RMSNorm, no biases) with grouped-query attention, ``n_head`` query heads on
    ``n_kv_head`` KV heads, and the tiny BPE tokenizer, in memory: (model in eval mode, tokenizer).
    ``head_dim`` None: ``hidden // n_head``. ``pad``: the config names the end-of-text token as
    padding (which also sets that token's embedding row at init). Seeded with ``seed`` just before
    the weights are drawn, so a caller that draws more after it gets the same numbers each time."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _bpe_tokenizer()
    extra = {} if head_dim is None else {"head_dim": head_dim}
    if pad:
        extra["pad_token_id"] = tok.eos_token_id
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=n_layer,
        num_attention_heads=n_head,
        num_key_value_heads=n_kv_head,
        max_position_embeddings=n_ctx,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **extra,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval(), tok


def tiny_attention_only_neox(
    n_layer: int = 2,
    n_head: int = 4,
    d_model: int = 32,
    vocab: int = 32,
    n_ctx: int = 32,
    seed: int = 0,
):
    """Notebook 07's attention-only GPT-NeoX (rotary; ``analyses/lib/phase_change.py``, the model it
    trains), random, with its word-level tokenizer: (model in eval mode, tokenizer)."""
    from lib.phase_change import _model, make_tokenizer

    hf = _model(vocab, n_ctx, n_layer, n_head, d_model, seed=seed).eval()
    return hf, make_tokenizer(vocab)


def install_in_hub_cache(
    checkpoint: Path,
    hf_home: Path,
    repo_ids=("openai-community/gpt2", "gpt2"),
    commit: str = "0123456789abcdef0123456789abcdef01234567",
    ref: str = "main",
) -> None:
    """Lay ``checkpoint`` out as the hub cache does: models--org--name/{refs/<ref>,
    snapshots/<commit>}."""
    import shutil

    for repo in repo_ids:
        repo_dir = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
        snap = repo_dir / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        for f in Path(checkpoint).iterdir():
            shutil.copy2(f, snap / f.name)
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit)


def make_tiny_gemma3(
    path: Path, sliding_window: int = 4, layer_types=("sliding_attention", "full_attention")
) -> Path:
    """A random Gemma 3 text decoder (sliding-window and global layers, 4 query heads sharing one
    KV head, like gemma3-270m) with the tiny BPE tokenizer, saved as a local checkpoint folder."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tok = _bpe_tokenizer()
    cfg = Gemma3TextConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=sliding_window,
        layer_types=list(layer_types),
        max_position_embeddings=128,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg)
    # random weights give near-uniform attention; sharpen it so windows matter
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return Path(path)
