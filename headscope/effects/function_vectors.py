"""Function-vector heads (Todd et al. 2024, "Function vectors in large language models";
docs/icl.md): which heads carry an in-context task.

For a task, a head's **mean output** is its output ``z`` (``A v`` before the output projection) at
the last position, averaged over clean few-shot prompts. Its **indirect effect** on a prompt whose
demonstrations' labels are shuffled is the rise in the probability of the correct answer's first
token when that head's output at the last position is replaced by its mean output, every other head
left as it was:

    IE(head, prompt) = P(answer | shuffled prompt, z_head <- mean) - P(answer | shuffled prompt)

and its **average indirect effect** (AIE) the mean over prompts; the **FV score** is the AIE
averaged over tasks.

Cost: the replacement acts at the last position only, so no earlier position's keys or values
change: each prompt runs once without its last token (a KV cache), then every head's job computes
the last token alone against that cache, as many jobs to a forward as ``jobs_per_forward``
(:meth:`~headscope.models.model.Model.run_last`). Each chunk carries an untouched copy too, and
each job's effect is read against the copy of its own forward (a head given its own output changes
nothing, exactly).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.engines.extract import pad_batch
from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall, SetHeads
from headscope.probes.icl import IclPrompts

#: jobs (heads, plus the untouched copy) per forward of :meth:`Model.run_last`
JOBS_PER_FORWARD = 96
#: logits kept per forward when reading the last positions (rows x positions x vocabulary)
LOGIT_CELLS = 64 * 2**20


def check_model(model) -> None:
    """One line for a model the indirect effects cannot run on."""
    if not model.causal:
        raise HeadscopeError(
            f"{model.name} is an encoder; function-vector scores need a decoder that completes "
            "a few-shot prompt (e.g. smollm2-135m, gemma3-270m, gpt2-small)."
        )
    if not model.attention_interface:
        raise HeadscopeError(
            f"{model.name}: its attention does not run through transformers' attention interface, "
            "so headscope cannot set a head's output; function-vector scores need one that does."
        )


class _LastOutputs:
    """Records each layer's head outputs at each row's last real position (``[row, head,
    dim_v]``)."""

    def __init__(self, last: Tensor):
        self.last = last
        self.got: dict[int, Tensor] = {}

    def before(self, call: AttentionCall) -> AttentionCall:
        return call

    def after(self, call: AttentionCall, out: Tensor) -> Tensor:
        rows = torch.arange(out.shape[0], device=out.device)
        self.got[call.layer] = out[rows, self.last.to(out.device)].float().cpu()
        return out


def _batches(model, ids: list[list[int]]):
    """``(index, tokens, mask, last)`` batches of ``ids`` (similar lengths together), each small
    enough that its logits fit :data:`LOGIT_CELLS`."""
    order = sorted(range(len(ids)), key=lambda i: (len(ids[i]), i))
    vocab = model.hf.config.get_text_config().vocab_size
    start = 0
    while start < len(order):
        stop = start + 1  # grow while the batch's logits (its longest row is its last) still fit
        while (
            stop < len(order) and (stop - start + 1) * len(ids[order[stop]]) * vocab <= LOGIT_CELLS
        ):
            stop += 1
        index = order[start:stop]
        tokens, mask, lengths = pad_batch([ids[i] for i in index], model.pad_id)
        yield torch.tensor(index), tokens, mask, torch.as_tensor(lengths) - 1
        start = stop


def last_position(
    model, prompts: IclPrompts, outputs: bool = False
) -> tuple[Float[Tensor, " prompt"], Tensor, Tensor | None]:
    """Each prompt's probability of its answer token at its last position, whether that token is
    the top-1 prediction (``bool``), and with ``outputs`` every head's output there (``[prompt,
    layer, head, dim_v]``)."""
    n = len(prompts)
    probs = torch.zeros(n, dtype=torch.float64)
    top1 = torch.zeros(n, dtype=torch.bool)
    z = None
    answer = torch.tensor(prompts.answer)
    for index, tokens, mask, last in _batches(model, prompts.ids):
        rec = _LastOutputs(last) if outputs else None
        logits = model.run(tokens, mask, interventions=[rec] if rec else (), output="logits")
        at = logits[torch.arange(len(index)), last.to(logits.device)].float().cpu()
        p = torch.softmax(at.double(), -1)
        probs[index] = p[torch.arange(len(index)), answer[index]]
        top1[index] = at.argmax(-1) == answer[index]
        if rec is not None:
            got = torch.stack([rec.got[la] for la in range(model.n_layers)], 1)
            if z is None:
                z = torch.zeros(n, *got.shape[1:])
            z[index] = got
    return probs, top1, z


def mean_outputs(model, prompts: IclPrompts) -> Float[Tensor, "layer head dim_v"]:
    """Every head's output at the last position, averaged over ``prompts`` (clean few-shot
    prompts: Todd et al.'s mean head activations at the last token)."""
    _, _, z = last_position(model, prompts, outputs=True)
    return z.mean(0)


def set_heads_jobs(
    model,
    prompts: IclPrompts,
    jobs: Sequence[Sequence[tuple[int, int]]],
    values: Float[Tensor, "layer head dim_v"],
    jobs_per_forward: int = JOBS_PER_FORWARD,
) -> dict[str, Tensor]:
    """Each job's heads set to ``values`` (each head its own) at each prompt's last position:
    ``prob`` and ``top1`` (``[prompt, job]``: the answer's probability, whether it is the top
    prediction), ``base`` (``[prompt, job]``: the answer's probability in the untouched copy of
    that job's forward), ``base_prob`` and ``base_top1`` (``[prompt]``)."""
    check_model(model)
    jobs = [list(j) for j in jobs]
    for job in jobs:
        for la, h in job:
            if not (0 <= la < model.n_layers and 0 <= h < model.n_heads):
                raise HeadscopeError(
                    f"Head L{la}H{h} is outside {model.name} ({model.n_layers} layers of "
                    f"{model.n_heads} heads)."
                )
    values = values.to(model.device, model.dtype)

    def forward(cache, last: int, start: int, stop: int) -> Tensor:
        rows = stop - start + 1  # row 0: untouched
        which = torch.zeros(model.n_layers, rows, model.n_heads, dtype=torch.bool)
        for r, job in enumerate(jobs[start:stop], start=1):
            for la, h in job:
                which[la, r, h] = True
        sets = [SetHeads(la, which[la], values[la]) for la in range(model.n_layers)
                if which[la].any()]  # fmt: skip
        return model.run_last(cache, last, rows, sets)

    return _last_token_jobs(model, prompts, len(jobs), jobs_per_forward, forward)


def _last_token_jobs(model, prompts: IclPrompts, n_jobs: int, jobs_per_forward: int, forward):
    """The loop both kinds of job share: each prompt's prefix run once (its KV cache), then
    ``forward(cache, last_token, start, stop)`` gives the logits of an untouched copy (row 0) and
    of jobs ``start .. stop`` (rows 1 ..), as many a forward as ``jobs_per_forward`` allows.
    Returns ``prob``, ``top1`` and ``base`` (``[prompt, job]``; ``base``: the untouched copy of
    the job's own forward) and ``base_prob``, ``base_top1`` (``[prompt]``)."""
    n = len(prompts)
    out = {
        "prob": torch.zeros(n, n_jobs, dtype=torch.float64),
        "base": torch.zeros(n, n_jobs, dtype=torch.float64),
        "top1": torch.zeros(n, n_jobs, dtype=torch.bool),
        "base_prob": torch.zeros(n, dtype=torch.float64),
        "base_top1": torch.zeros(n, dtype=torch.bool),
    }
    per = max(1, jobs_per_forward - 1)
    for p, (ids, ans) in enumerate(zip(prompts.ids, prompts.answer, strict=True)):
        cache = model.prefix_cache(ids[:-1])
        for start in range(0, n_jobs, per):
            stop = min(n_jobs, start + per)
            logits = forward(cache, ids[-1], start, stop).float().cpu()
            pr = torch.softmax(logits.double(), -1)[:, ans]
            top = logits.argmax(-1) == ans
            out["prob"][p, start:stop] = pr[1:]
            out["base"][p, start:stop] = pr[0]
            out["top1"][p, start:stop] = top[1:]
            out["base_prob"][p], out["base_top1"][p] = pr[0], top[0]
    return out


def indirect_effects(
    model,
    prompts: IclPrompts,
    means: Float[Tensor, "layer head dim_v"],
    heads: Sequence[tuple[int, int]] | None = None,
    jobs_per_forward: int = JOBS_PER_FORWARD,
) -> tuple[Float[Tensor, "prompt head"], Float[Tensor, " prompt"]]:
    """Each head's indirect effect on each prompt (``[prompt, head]``, heads in the order of
    ``heads``, default every head layer by layer: its output at the last position set to its
    mean output ``means``) and each prompt's answer probability untouched (``[prompt]``)."""
    if heads is None:
        heads = [(la, h) for la in range(model.n_layers) for h in range(model.n_heads)]
    got = set_heads_jobs(model, prompts, [[hd] for hd in heads], means, jobs_per_forward)
    return got["prob"] - got["base"], got["base"][:, 0]


# ------------------------------------------------------------------------------ the vector itself


def function_vector(
    model, means: Float[Tensor, "layer head dim_v"], heads: Sequence[tuple[int, int]]
) -> Float[Tensor, " d_model"]:
    """Todd et al.'s function vector: the sum over ``heads`` of what each head's mean output
    writes through its layer's output projection, the other heads' slices zero (without the
    projection's bias: Todd et al.'s code adds GPT-2's output bias once per head). In Gemma 2 / 3
    the attention output is normalised before it joins the stream; the vector is taken before that
    norm, as Todd et al. take it at ``out_proj``."""
    from headscope.effects.logit_attribution import output_projection

    dv = means.shape[-1]
    out = torch.zeros(model.hf.config.get_text_config().hidden_size, dtype=torch.float64)
    for la, h in heads:
        proj = output_projection(model, la)
        x = torch.zeros(2, model.n_heads * dv, device=model.device, dtype=model.dtype)
        x[1, h * dv : (h + 1) * dv] = means[la, h].to(x)
        with torch.inference_mode():
            y = proj(x).double().cpu()
        out += y[1] - y[0]  # the head's write, without the projection's bias
    return out.float()


def added_at_layer(
    model,
    prompts: IclPrompts,
    vectors: Float[Tensor, "vector d_model"],
    layer: int,
    jobs_per_forward: int = JOBS_PER_FORWARD,
) -> dict[str, Tensor]:
    """Each vector added to the residual stream after block ``layer`` at each prompt's last
    position (Todd et al.'s test that a function vector carries the task): ``prob`` and ``top1``
    (``[prompt, vector]``), ``base_prob`` and ``base_top1`` (``[prompt]``: nothing added)."""
    check_model(model)
    if not 0 <= layer < model.n_layers:
        raise HeadscopeError(f"Layer {layer} is outside {model.name} (0 to {model.n_layers - 1}).")
    block = model.blocks()[layer]

    def forward(cache, last: int, start: int, stop: int) -> Tensor:
        chunk = vectors[start:stop].float().cpu()
        add = torch.cat([torch.zeros(1, chunk.shape[1]), chunk])  # row 0: untouched

        def hook(mod, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            hidden = hidden + add.to(hidden.device, hidden.dtype)[:, None, :]
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        handle = block.register_forward_hook(hook)
        try:
            return model.run_last(cache, last, len(add))
        finally:
            handle.remove()

    return _last_token_jobs(model, prompts, len(vectors), jobs_per_forward, forward)
