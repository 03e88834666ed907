"""Notebook 07: train a small attention-only transformer on text with repeated spans, keep its
checkpoints, and measure in-context learning, so that headscope can sweep the checkpoints.

Olsson et al. (2022) saw induction heads form "at precisely the same point as a sudden sharp
increase in in-context learning". This module makes the smallest version of that experiment:

* :func:`repeated_spans`: sequences ``BOS + R + R + ...`` of random tokens (``R`` of random
  length), so every copy after the first is predictable only in context;
* :func:`train_attention_only`: a 2-layer transformer whose MLPs are zero and frozen (attention
  only), trained with AdamW (linear warmup) on CPU, saved as ordinary Hugging Face checkpoint
  folders (``step-NNNN``) that ``headscope scan`` / ``headscope sweep`` load like any other model;
* :func:`icl_score`: the loss late in the context minus the loss early in the context, on
  held-out sequences (negative: the model predicts better with more context).

Positions matter. With rotary position embeddings (``positions="rotary"``, GPT-NeoX blocks, the
default) a previous-token head is one relative offset away and the induction circuit forms within
a few hundred steps. With GPT-2's learned absolute position embeddings (``positions="learned"``)
it did not form in 1500 steps: the model lowered its in-context loss instead with heads that
attend at fixed offsets (the span lengths of the training data), which repeat-until-full text
rewards, and the previous-token head it needs grew only slowly.

The model classes come from ``transformers``, imported inside the functions (training is not
scanning: :mod:`headscope.models.model` stays the only module that scans through them).
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = [
    "attention_by_offset",
    "icl_score",
    "make_tokenizer",
    "repeated_spans",
    "train_attention_only",
]

BOS = "<bos>"


def make_tokenizer(vocab: int):
    """A word-level tokenizer over ``t0 .. t{vocab-1}`` plus ``<bos>`` (id ``vocab``) and
    ``<unk>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)} | {BOS: vocab, "<unk>": vocab + 1}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=BOS, unk_token="<unk>"
    )


def repeated_spans(
    n: int, n_ctx: int, vocab: int, gen: torch.Generator, min_span: int = 8, max_span: int = 24
) -> torch.Tensor:
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


POSITIONS = ("rotary", "learned")


def _model(
    vocab: int,
    n_ctx: int,
    n_layer: int,
    n_head: int,
    d_model: int,
    seed: int,
    positions: str = "rotary",
):
    if positions not in POSITIONS:
        raise ValueError(f"positions={positions!r}; use one of {POSITIONS}")
    torch.manual_seed(seed)  # transformers initialises from the global generator
    if positions == "learned":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            vocab_size=vocab + 2,
            n_positions=n_ctx,
            n_embd=d_model,
            n_layer=n_layer,
            n_head=n_head,
            n_inner=4,
            bos_token_id=vocab,
            eos_token_id=vocab,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        model = GPT2LMHeadModel(cfg)
        blocks = model.transformer.h
    else:
        from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

        cfg = GPTNeoXConfig(
            vocab_size=vocab + 2,
            max_position_embeddings=n_ctx,
            hidden_size=d_model,
            num_hidden_layers=n_layer,
            num_attention_heads=n_head,
            intermediate_size=4,
            rotary_pct=1.0,
            bos_token_id=vocab,
            eos_token_id=vocab,
            tie_word_embeddings=False,
            attention_dropout=0.0,
            hidden_dropout=0.0,
        )
        model = GPTNeoXForCausalLM(cfg)
        blocks = model.gpt_neox.layers
    for block in blocks:  # attention only: each MLP outputs exactly 0 and never learns
        for p in block.mlp.parameters():
            p.data.zero_()
            p.requires_grad_(False)
    return model


def train_attention_only(
    out: str | Path,
    steps: int = 600,
    save_every: int = 25,
    vocab: int = 64,
    n_ctx: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    d_model: int = 64,
    batch: int = 32,
    lr: float = 1e-3,
    warmup: int = 100,
    seed: int = 0,
    positions: str = "rotary",
) -> list[Path]:
    """Train and save checkpoints ``out/step-NNNN`` (step 0 and every ``save_every``); returns them.

    AdamW at ``lr`` after a linear warmup over the first ``warmup`` steps; ``positions``:
    ``"rotary"`` (GPT-NeoX blocks) or ``"learned"`` (GPT-2 blocks), see the module docstring.

    Returns the folders in step order; each also holds ``train_loss.txt`` (the mean training loss
    of the steps since the previous checkpoint)."""
    out = Path(out)
    tok = make_tokenizer(vocab)
    model = _model(vocab, n_ctx, n_layer, n_head, d_model, seed, positions)
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0
    )
    gen = torch.Generator().manual_seed(seed)
    saved, losses = [], []

    def save(step: int) -> None:
        path = out / f"step-{step:04d}"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        (path / "train_loss.txt").write_text(
            f"{sum(losses) / len(losses) if losses else float('nan')}\n"
        )
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
        sched.step()
        losses.append(float(loss.detach()))
        if step % save_every == 0 or step == steps:
            save(step)
    return saved


@torch.no_grad()
def icl_score(
    checkpoint: str | Path,
    n: int = 256,
    early: tuple[int, int] = (2, 8),
    late: tuple[int, int] = (40, 62),
    seed: int = 1,
) -> dict[str, float]:
    """Loss late in the context minus loss early in the context (nats/token), on ``n`` held-out
    sequences of :func:`repeated_spans`: ``{"early", "late", "icl"}``. Positions are of the
    predicted token, ``[start, stop)``; ``icl < 0`` means later tokens are predicted better."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    vocab, n_ctx = model.config.bos_token_id, model.config.max_position_embeddings
    x = repeated_spans(n, n_ctx, vocab, torch.Generator().manual_seed(seed))  # [n, pos]
    logits = model(input_ids=x).logits[:, :-1]  # [n, pos-1, vocab]: predicts x[:, 1:]
    # [n, pos-1]
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
    per_pos = loss.mean(0)  # [pos-1]: index i predicts the token at position i + 1
    e = float(per_pos[early[0] - 1 : early[1] - 1].mean())
    la = float(per_pos[late[0] - 1 : late[1] - 1].mean())
    return {"early": e, "late": la, "icl": la - e}


@torch.no_grad()
def attention_by_offset(
    checkpoint: str | Path, span: int = 20, n: int = 32, seed: int = 1
) -> torch.Tensor:
    """Where each head looks, read straight from the model (not through headscope's engines):
    ``[layer, head, offset]``, the mean attention from a query ``q`` of the second copy of
    ``BOS + R + R`` (``|R| = span``, ``R`` distinct trained ids) to the key ``q - offset``.

    An induction head puts its mass at ``offset = span - 1`` (the token after the earlier copy of
    the current one), a previous-token head at ``1``, a duplicate-token head at ``span``; a head
    that attends at a fixed offset puts it at that offset whatever ``span`` is."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager").eval()
    vocab = model.config.bos_token_id
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        r = torch.randperm(vocab, generator=gen)[:span]
        rows.append(torch.cat([torch.tensor([vocab]), r, r]))
    x = torch.stack(rows)  # [n, pos]
    # [n, layer, head, q, k]
    att = torch.stack(model(input_ids=x, output_attentions=True).attentions, 1)
    out = torch.zeros(att.shape[1], att.shape[2], 2 * span + 1)  # [layer, head, offset]
    for q in range(span + 1, 2 * span + 1):
        out[..., : q + 1] += att[:, :, :, q, : q + 1].mean(0).flip(-1)  # key q - o at index o
    return out / span
