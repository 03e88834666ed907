"""Attention sinks: heads that park attention on position 0, and what happens without BOS.

The ``sink`` metric of a scan is each head's mean attention to position 0 (queries ``1..n-1``).
Gu et al. (2024, "When Attention Sink Emerges in Language Models") summarise a model by its
**sink rate**: the share of heads whose average attention to the first token exceeds
``epsilon = 0.3``. :func:`sink_rate` applies that threshold to the ``sink`` scores of a scan, which
differ from Gu's recipe in three ways: the ``sink`` metric leaves out query 0 (which in a causal
model can only see itself), pools every sequence before the threshold, and runs on the probe's
prompts (~28 tokens). :func:`gu_probe` and :func:`gu_sink_rate` follow Gu's recipe exactly
(``eval_sink_open_source.py`` of their code): running text cut to ``T = 64`` tokens as the tokenizer
encodes it, every query counted, ``A[0, 0] = 1`` included, the threshold applied per sequence and
the indicator averaged over sequences, layers and heads.

To ask whether the sink is the BOS *token* or the first *position*, :func:`without_first_token`
drops position 0 from every sequence of a probe, so an ordinary word sits at position 0, and the
same scan measures attention to it.

>>> import pandas as pd
>>> scores = pd.DataFrame({"metric": "sink", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
...                        "score": [0.1, 0.5, 0.9, 0.2]})
>>> sink_rate(scores)
0.5
>>> sink_rate(scores, per_layer=True).tolist()
[0.5, 0.5]
"""

from __future__ import annotations

import pandas as pd
import torch

from headscope.errors import HeadscopeError

SINK_EPSILON = 0.3  # Gu et al. (2024)


def sink_rate(scores: pd.DataFrame, threshold: float = SINK_EPSILON, per_layer: bool = False):
    """Share of heads whose ``sink`` score exceeds ``threshold``; per layer: a Series by layer."""
    sub = scores[scores["metric"] == "sink"]
    if sub.empty:
        raise HeadscopeError("The scores table has no 'sink' rows; scan a text probe first.")
    above = sub["score"] > threshold
    if per_layer:
        return above.groupby(sub["layer"]).mean().rename("sink_rate")
    return float(above.mean())


def without_first_token(probe):
    """A copy of ``probe`` with position 0 (BOS or [CLS]) dropped from every sequence.

    Decoders: ``BOS a SEP b`` becomes ``a SEP b``, so position 0 holds the first word of ``a``.
    Encoders: ``[CLS] a [SEP] b [SEP]`` becomes ``a [SEP] b [SEP]``.
    """
    from headscope.probes.pairs import Probe

    if probe.repeat_len is not None:
        raise HeadscopeError(
            "without_first_token is for text probes; on a repeat probe it would "
            "shift "
            "every position the repeat metrics rely on."
        )
    if any(len(s) < 3 for s in probe.sequences):
        raise HeadscopeError(
            "Every sequence needs at least 3 tokens to drop its first one and keep two."
        )
    return Probe(
        probe.name,
        [list(s[1:]) for s in probe.sequences],
        repeat_len=probe.repeat_len,
        settings={**probe.settings, "first_token_dropped": True},
    )


def sink_comparison(runs: dict[str, pd.DataFrame], threshold: float = SINK_EPSILON) -> pd.DataFrame:
    """One row per run (``{label: scores}``): mean sink score, sink rate, strongest sink head."""
    rows = []
    for label, scores in runs.items():
        sub = scores[scores["metric"] == "sink"]
        if sub.empty:
            raise HeadscopeError(f"Run '{label}' has no 'sink' rows; scan a text probe first.")
        top = sub.loc[sub["score"].idxmax()]
        rows.append(
            {
                "run": label,
                "model": sub["model"].iloc[0],
                "mean_sink": float(sub["score"].mean()),
                "sink_rate": sink_rate(scores, threshold),
                "heads": len(sub),
                "top_head": top["head_name"],
                "top_score": float(top["score"]),
                "chance": float(sub["chance"].iloc[0]),
            }
        )
    return pd.DataFrame(rows)


def attention_to_position_sums(model, probe, position: int, batch_size: int = 8):
    """Per sequence: each head's summed attention to key ``position`` over the queries after it,
    and the count of those queries: ``(total [sequence, layer, head], count [sequence])``, float64,
    what a bootstrap over sequences resamples
    (:func:`lib.controls.pooled_interval`)."""
    from headscope.engines.extract import pad_batch

    if position < 0 or any(len(s) <= position + 1 for s in probe.sequences):
        raise HeadscopeError(
            f"Every sequence needs a query after position {position}; the "
            "shortest has "
            f"{min(len(s) for s in probe.sequences)} tokens."
        )
    n = len(probe)
    total = torch.zeros(n, model.n_layers, model.n_heads, dtype=torch.float64)
    count = torch.zeros(n, dtype=torch.float64)
    for start in range(0, n, batch_size):
        tokens, mask, lengths = pad_batch(probe.sequences[start : start + batch_size], model.pad_id)
        q = torch.arange(tokens.shape[1])
        rows = (q[None, :] > position) & (q[None, :] < lengths[:, None])  # [batch, query]
        count[start : start + len(tokens)] = rows.sum(-1).double()

        # [batch, head, query, key]
        def on_pattern(layer: int, pattern, rows=rows, start=start) -> None:
            to_key = pattern[..., position].float().cpu()  # [batch, head, query]
            total[start : start + len(rows), layer] = (to_key * rows[:, None, :]).sum(
                2, dtype=torch.float64
            )

        model.run_patterns(tokens, mask, on_pattern)
    return total, count


def attention_to_position(model, probe, position: int, batch_size: int = 8) -> pd.DataFrame:
    """Every head's mean attention to key ``position``, over the queries after it (``q >
    position``).

    For ``position = 0`` this is the ``sink`` score. It answers what the sink score cannot: how much
    attention a token gets when it is *not* first (e.g. the first word, at position 1 behind BOS).
    Padding never counts. One row per head: model, layer, head, head_name, score, n (queries).
    """
    total, count = attention_to_position_sums(model, probe, position, batch_size)
    score = total.sum(0) / count.sum()
    n = int(count.sum())
    return pd.DataFrame(
        [
            {
                "model": model.name,
                "layer": layer,
                "head": head,
                "head_name": f"L{layer}H{head}",
                "score": float(score[layer, head]),
                "n": n,
            }
            for layer in range(model.n_layers)
            for head in range(model.n_heads)
        ]
    )


def first_word_attention(
    model, probe, threshold: float = SINK_EPSILON, batch_size: int = 8
) -> pd.DataFrame:
    """Is the sink the first token or the first position? The same first word, in two places.

    Three rows, each a summary over heads of :func:`attention_to_position`: the special token at
    position 0 (the ``sink`` score), the first word at position 1 behind it, and the first word at
    position 0 once the special token is dropped (:func:`without_first_token`). Columns: mean and
    max over heads, and how many heads exceed ``threshold``.
    """
    special = model.str_tokens([model.bos_id])[0]
    tables = {
        f"{special} at position 0": attention_to_position(model, probe, 0, batch_size),
        "first word at position 1, behind it": attention_to_position(model, probe, 1, batch_size),
        f"first word at position 0, {special} dropped": attention_to_position(
            model, without_first_token(probe), 0, batch_size
        ),
    }
    rows = [
        {
            "position 0 / key": label,
            "mean": t["score"].mean(),
            "max": t["score"].max(),
            f"heads > {threshold:g}": int((t["score"] > threshold).sum()),
            "heads": len(t),
        }
        for label, t in tables.items()
    ]
    return pd.DataFrame(rows).set_index("position 0 / key")


# ------------------------------------------------------------------------------ Gu et al.'s recipe


def gu_probe(
    model, pairs: list[tuple[str, str]] | None = None, n_sequences: int = 64, length: int = 64
):
    """Running text as Gu et al. (2024) feed it: sequence ``i`` is the corpus text from pair ``i``
    on (pairs joined by spaces, wrapping around), tokenized with the tokenizer's own special tokens
    (a BOS only if the tokenizer adds one) and cut to exactly ``length`` tokens."""
    from headscope.errors import at_least
    from headscope.probes.pairs import Probe, load_pairs

    if not model.causal:
        raise HeadscopeError(
            "Gu et al.'s sink rate is defined for causal language models; this model is an encoder."
        )
    at_least("n_sequences", n_sequences)
    at_least("length", length, 2)
    if length > model.n_ctx:
        raise HeadscopeError(f"length {length} is longer than the model's context ({model.n_ctx}).")
    pairs = load_pairs() if pairs is None else pairs
    texts = [f"{a} {b}" for a, b in pairs]
    if not texts or not any(t.strip() for t in texts):
        raise HeadscopeError("Gu et al.'s probe needs text; the pairs given are empty.")
    seqs = []
    for i in range(n_sequences):
        parts, j, ids = [], i, []
        while len(ids) < length:
            if j - i > len(texts) * (length + 1):  # text that never grows: refuse, do not loop
                raise HeadscopeError("The pairs tokenize to too few tokens to fill a sequence.")
            parts.append(texts[j % len(texts)])
            j += 1
            ids = list(model.tokenizer(" ".join(parts), add_special_tokens=True)["input_ids"])
        seqs.append(ids[:length])
    return Probe(
        "text", seqs, settings={"n_prompts": n_sequences, "seq_len": length, "recipe": "gu2024"}
    )


def gu_sink_rate(
    model,
    probe,
    epsilon: float = SINK_EPSILON,
    batch_size: int = 8,
    per_layer: bool = False,
    per_sequence: bool = False,
):
    """Gu et al.'s sink rate on ``probe`` (sequences of one length ``T``, e.g. :func:`gu_probe`).

    Per sequence and head, ``alpha = (1/T) sum over queries t = 0..T-1 of A[t, 0]`` (with
    ``A[0, 0] = 1``); the rate is the share of (sequence, layer, head) triples with
    ``alpha > epsilon``. ``per_layer``: a Series of the rate by layer. ``per_sequence``: the
    rate of each sequence (``[sequence]`` numpy), whose mean is the rate (for a bootstrap).
    """
    from headscope.engines.extract import score_probe
    from headscope.metrics import get_metric

    if not model.causal:
        raise HeadscopeError(
            "Gu et al.'s sink rate is defined for causal language models; this model is an encoder."
        )
    lengths = {len(s) for s in probe.sequences}
    if len(lengths) != 1:
        raise HeadscopeError(
            "Gu et al.'s recipe needs sequences of one length; this probe has "
            f"{len(lengths)} "
            "lengths (use gu_probe)."
        )
    T = lengths.pop()
    sink = score_probe(model, probe, [get_metric("sink")], batch_size)["sink"]
    # seq_total sums A[q, 0] over queries 1..T-1; query 0 adds its A[0, 0] = 1
    alpha = (sink.seq_total + 1.0) / T  # [sequence, layer, head]
    above = (alpha > epsilon).double()
    if per_sequence:
        return above.mean((1, 2)).numpy()
    if per_layer:
        return pd.Series(
            above.mean((0, 2)).numpy(),
            index=pd.RangeIndex(model.n_layers, name="layer"),
            name="sink_rate",
        )
    return float(above.mean())
