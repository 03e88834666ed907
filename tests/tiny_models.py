"""Build tiny random Hugging Face checkpoints (and a hub-cache layout) for tests."""

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
