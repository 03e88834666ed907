"""Notebook 07: train a small attention-only transformer on text with repeated spans, keep its
checkpoints, and measure in-context learning, so that headscope can sweep the checkpoints.

Olsson et al. (2022) saw induction heads form "at precisely the same point as a sudden sharp
increase in in-context learning". This module makes the smallest version of that experiment:

* :func:`repeated_spans`: sequences ``BOS + R + R + ...`` of random tokens (``R`` of random
  length), so every copy after the first is predictable only in context;
* :func:`train_attention_only`: a 2-layer GPT-2 whose MLPs are zero and frozen (attention only),
  trained with AdamW on CPU, saved as ordinary Hugging Face checkpoint folders (``step-NNNN``)
  that ``headscope scan`` / ``headscope sweep`` load like any other model;
* :func:`icl_score`: the loss late in the context minus the loss early in the context, on
  held-out sequences (negative: the model predicts better with more context).

The model classes come from ``transformers``, imported inside the functions (training is not
scanning: :mod:`headscope.models` stays the only module that scans through them).
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["icl_score", "make_tokenizer", "repeated_spans", "train_attention_only"]

BOS = "<bos>"


def make_tokenizer(vocab: int):
    """A word-level tokenizer over ``t0 .. t{vocab-1}`` plus ``<bos>`` (id ``vocab``) and ``<unk>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)} | {BOS: vocab, "<unk>": vocab + 1}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=BOS, unk_token="<unk>")


def repeated_spans(n: int, n_ctx: int, vocab: int, gen: torch.Generator, min_span: int = 8,
                   max_span: int = 24) -> torch.Tensor:
    """``[n, n_ctx]`` token ids: ``BOS`` then a random span ``R`` repeated until the context is full
    (``|R|`` uniform in ``[min_span, max_span]``, its tokens uniform over ``vocab``). The first copy
    can only be guessed; every later token is predictable from the context alone.

    >>> x = repeated_spans(2, 19, 5, torch.Generator().manual_seed(0), min_span=9, max_span=9)
    >>> x.shape, bool((x[:, 1:10] == x[:, 10:19]).all()), int(x[0, 0])
    (torch.Size([2, 19]), True, 5)
    """
    out = torch.empty(n, n_ctx, dtype=torch.long)
    out[:, 0] = vocab  # BOS
    spans = torch.randint(min_span, max_span + 1, (n,), generator=gen)
    for row, span in enumerate(spans.tolist()):
        r = torch.randint(0, vocab, (span,), generator=gen)
        out[row, 1:] = r.repeat((n_ctx - 1) // span + 1)[: n_ctx - 1]
    return out


def _model(vocab: int, n_ctx: int, n_layer: int, n_head: int, d_model: int, seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)  # transformers initialises from the global generator
    cfg = GPT2Config(vocab_size=vocab + 2, n_positions=n_ctx, n_embd=d_model, n_layer=n_layer, n_head=n_head,
                     n_inner=4, bos_token_id=vocab, eos_token_id=vocab, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    for block in model.transformer.h:  # attention only: each MLP outputs exactly 0 and never learns
        for p in block.mlp.parameters():
            p.data.zero_()
            p.requires_grad_(False)
    return model


def train_attention_only(out: str | Path, steps: int = 600, save_every: int = 25, vocab: int = 64,
                         n_ctx: int = 64, n_layer: int = 2, n_head: int = 4, d_model: int = 64, batch: int = 32,
                         lr: float = 1e-3, seed: int = 0) -> list[Path]:
    """Train and save checkpoints ``out/step-NNNN`` (step 0 and every ``save_every``); returns them.

    Returns the folders in step order; each also holds ``train_loss.txt`` (the mean training loss
    of the steps since the previous checkpoint)."""
    out = Path(out)
    tok = make_tokenizer(vocab)
    model = _model(vocab, n_ctx, n_layer, n_head, d_model, seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    saved, losses = [], []

    def save(step: int) -> None:
        path = out / f"step-{step:04d}"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        (path / "train_loss.txt").write_text(f"{sum(losses) / len(losses) if losses else float('nan')}\n")
        losses.clear()
        saved.append(path)

    model.train()
    save(0)
    for step in range(1, steps + 1):
        x = repeated_spans(batch, n_ctx, vocab, gen)  # [batch, pos]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if step % save_every == 0 or step == steps:
            save(step)
    return saved


@torch.no_grad()
def icl_score(checkpoint: str | Path, n: int = 256, early: tuple[int, int] = (2, 8),
              late: tuple[int, int] = (40, 62), seed: int = 1) -> dict[str, float]:
    """Loss late in the context minus loss early in the context (nats/token), on ``n`` held-out
    sequences of :func:`repeated_spans`: ``{"early", "late", "icl"}``. Positions are of the
    predicted token, ``[start, stop)``; ``icl < 0`` means later tokens are predicted better."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(checkpoint).eval()
    vocab, n_ctx = model.config.bos_token_id, model.config.n_positions
    x = repeated_spans(n, n_ctx, vocab, torch.Generator().manual_seed(seed))  # [n, pos]
    logits = model(input_ids=x).logits[:, :-1]  # [n, pos-1, vocab]: predicts x[:, 1:]
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")  # [n, pos-1]
    per_pos = loss.mean(0)  # [pos-1]: index i predicts the token at position i + 1
    e = float(per_pos[early[0] - 1 : early[1] - 1].mean())
    la = float(per_pos[late[0] - 1 : late[1] - 1].mean())
    return {"early": e, "late": la, "icl": la - e}
