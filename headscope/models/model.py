"""A loaded model, as transformers and transformer-lens run it: the one place that knows how.

Everything else sees a :class:`Model`: its shape (``n_layers``, ``n_heads``, ``n_kv_heads``,
``d_head``, ``n_ctx``), whether it is causal, its special tokens, and a few methods:

* :meth:`Model.run`: one forward of the Hugging Face model in which every attention call goes
  through headscope's seam (:mod:`headscope.models.attention`): engines read it, interventions
  change it;
* :meth:`Model.run_patterns`: one forward of the transformer-lens ``TransformerBridge`` that hands
  each layer's post-softmax pattern (``blocks.{L}.attn.hook_pattern``) to a callback;
* :meth:`Model.attention_activations`, :meth:`Model.attention_inputs`,
  :meth:`Model.circuit_weights`: what the analysis helpers need from the bridge, by meaning rather
  than by hook name.

It also holds the attention function headscope registers with transformers' attention interface.
How a Model is made (from a name, a folder, a device map, or a model you hold in memory) is
:mod:`headscope.models.loading`. When transformer-lens or transformers change their APIs again (they
have, twice), these two files change and nothing else.

transformer-lens 4.x: ``TransformerBridge.boot_transformers(name, hf_model=..., tokenizer=...)``
wraps an already-loaded HF model in place and switches it to eager attention, so the bridge always
gets a copy of its own, built on first use.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.errors import HeadscopeError
from headscope.models import attention
from headscope.models.attention import AttentionCall, Handler, Intervention, StopForward
from headscope.models.sources import Source

#: Softmax changes passed to the attention function that plain ``softmax(q k^T * scale + mask)``
#: does not capture: logit soft-capping (Gemma 2), learned sinks (gpt-oss), T5-style position
# biases.
UNMODELLED = ("position_bias", "softcap", "s_aux", "sinks")
IMPLEMENTATION = "headscope"  # the name our attention function is registered under in transformers


@dataclass(frozen=True)
class CircuitWeights:
    """A pre-norm decoder's weights, as its heads' OV circuits read them (float32, CPU).

    ``W_V`` has one entry per KV head; query head ``h`` reads KV head ``h // (n_heads / n_kv)``.
    """

    W_E: Float[Tensor, "vocab d_model"]  # token embeddings, before any norm
    W_U: Float[Tensor, "d_model vocab"]  # unembedding (no final norm folded in)
    W_V: Float[Tensor, "layer kv_head d_model d_head"]
    W_O: Float[Tensor, "layer head d_head d_model"]
    ln1: Float[Tensor, "layer d_model"]  # each layer's pre-attention norm gain
    ln_final: Float[Tensor, " d_model"]  # the final norm's gain
    rms: bool  # RMSNorm (scale only) rather than LayerNorm (centre, then scale)
    eps: float
    #: Per layer, the gain of a norm applied to the attention output before the residual add
    #: (Gemma 2/3's post-attention norm); None where the model has none (Llama, GPT-2, ...).
    post_attn: Float[Tensor, "layer d_model"] | None = None


#: cache layers that only ever concatenate onto their keys and values (never write into them)
_CONCATENATING = ("DynamicLayer", "DynamicSlidingWindowLayer")


def _batch_view(cache, copies: int):
    """``cache`` as ``copies`` rows see it, the original left as it was: a dynamic layer's keys
    and values expanded along the batch (a view: its update concatenates, writing nothing in
    place); any other layer copied and repeated."""
    import copy

    view = copy.copy(cache)
    view.layers = []
    for layer in cache.layers:
        if type(layer).__name__ in _CONCATENATING and getattr(layer, "keys", None) is not None:
            lay = copy.copy(layer)
            lay.keys = layer.keys.expand(copies, *layer.keys.shape[1:])
            lay.values = layer.values.expand(copies, *layer.values.shape[1:])
        else:
            lay = copy.deepcopy(layer)
            lay.batch_repeat_interleave(copies)
        view.layers.append(lay)
    return view


@dataclass
class Model:
    """A loaded model, as the rest of headscope sees it.

    ``hf`` is the Hugging Face model (running headscope's attention function, plain ``sdpa`` when no
    handler is active); ``bridge`` a transformer-lens ``TransformerBridge`` over a second, eager
    copy, built on first use for hook-level work.
    """

    name: str  # as the user typed it (or a description of an in-memory model)
    source: Source
    provenance: dict  # where the weights came from, for metadata.json
    hf: object  # transformers PreTrainedModel
    tokenizer: object
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    n_ctx: int
    causal: bool
    bos_id: int  # token at position 0: BOS, or [CLS] for encoders
    sep_id: int  # the separator: sep_token_id, else eos_token_id
    pad_id: int
    eos_id: int | None  # appended at the end by encoders ([SEP]); None for decoders
    device: torch.device
    dtype: torch.dtype
    special_ids: frozenset[int] = field(default_factory=frozenset)
    #: Per layer, the farthest key a query can see, ``|q - k| <= reach`` (causality still applies);
    #: None for a layer that sees every key. Sliding-window layers (Mistral, Gemma 2/3, Qwen2 with
    #: ``use_sliding_window``, GPT-Neo's local layers, ModernBERT's local layers) have one:
    #: chance is uniform over the keys the layer can see (:func:`attention_reach`).
    reach: tuple[int | None, ...] = ()
    #: Every layer's attention runs through transformers' attention interface, so
    #: :meth:`run` can hand it to a handler (the blocked and fused engines, interventions).
    attention_interface: bool = False
    #: Where accelerate put each module (``--device-map``): ``{module: device}``; None when the
    #: whole model sits on ``device``.
    device_map: dict | None = None
    _make_bridge: Callable[[], object] | None = field(default=None, repr=False)
    _bridge: object | None = field(default=None, repr=False)
    _bridge_error: str | None = field(default=None, repr=False)  # why the bridge could not be built
    # one forward at a time
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _fingerprint: str | None = field(default=None, repr=False)

    @property
    def has_bridge(self) -> bool:
        """Whether a transformer-lens bridge exists or can be built (the hooks engine needs one)."""
        return self._bridge is not None or self._make_bridge is not None

    def fingerprint(self) -> str:
        """sha256 over the parameters' names, shapes, dtypes and bytes (computed once, on first
        use): what identifies an in-memory model that has no weights file."""
        if self._fingerprint is None:
            self._fingerprint = _state_sha256(self.hf)
        return self._fingerprint

    @property
    def bridge(self):
        """The transformer-lens bridge (eager attention, every hook point); built on first use."""
        if self._bridge is None:
            if self._make_bridge is None:
                raise HeadscopeError(f"{self.name} has no transformer-lens bridge.")
            if self._bridge_error is not None:  # tried once already: no second deep copy
                raise HeadscopeError(self._bridge_error)
            try:
                self._bridge = self._make_bridge()
            except HeadscopeError:
                raise
            except Exception as exc:  # transformer-lens knows no bridge for this architecture
                arch = ", ".join(
                    getattr(self.hf.config, "architectures", None) or [type(self.hf).__name__]
                )
                why = str(exc).split(". ")[0].splitlines()[0][:120]
                hint = (
                    "use --engine blocked"
                    if self.attention_interface
                    else "no headscope engine can read it"
                )
                self._bridge_error = f"transformer-lens cannot build a bridge for {arch} ({why})"
                raise HeadscopeError(f"{self._bridge_error}; {hint}.") from None
        return self._bridge

    @property
    def n_params(self) -> int:
        """Parameters of the model, tied weights counted once."""
        # offloaded: meta, ptr 0
        return sum({p.data_ptr() or id(p): p.numel() for p in self.hf.parameters()}.values())

    # ------------------------------------------------------------------ tokens

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special tokens added."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def join_pair(self, a: str, b: str) -> list[int]:
        """A segment pair joined the way the tokenizer joins one.

        Encoders: ``[CLS] a [SEP] b [SEP]``; decoders: ``BOS a SEP b`` (SEP = sep, else EOS).
        """
        if self.causal:
            return [self.bos_id, *self.encode(a), self.sep_id, *self.encode(b)]
        return list(self.tokenizer(a, b, add_special_tokens=True)["input_ids"])

    def chat_pair(self, a: str, b: str) -> list[int]:
        """A segment pair as the chat template of an instruct model joins two turns: ``a`` from the
        user, ``b`` from the assistant (with whatever the template adds, e.g. a default system
        turn)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise HeadscopeError(
                f"{self.name}'s tokenizer has no chat template; use the plain "
                "join (--text-join plain)."
            )
        ids = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": a}, {"role": "assistant", "content": b}], tokenize=True
        )
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def pair_token_types(self, a: str, b: str) -> list[int]:
        """The segment ids (token types) of ``join_pair(a, b)`` for a BERT-style encoder: 0 for
        ``[CLS] a [SEP]``, 1 for ``b [SEP]``."""
        if self.causal:
            raise HeadscopeError(
                "Token types are segment ids of encoder pairs; this model is a decoder."
            )
        return list(
            self.tokenizer(a, b, add_special_tokens=True, return_token_type_ids=True)[
                "token_type_ids"
            ]
        )

    def wrap(self, ids: list[int]) -> list[int]:
        """``BOS + ids`` for decoders, ``[CLS] + ids + [SEP]`` for encoders."""
        return [self.bos_id, *ids] + ([] if self.eos_id is None else [self.eos_id])

    def ordinary_vocab(self) -> Int[Tensor, " vocab"]:
        """Ids of ordinary tokens: every id the tokenizer knows except special and added tokens."""
        n = len(self.tokenizer)
        keep = torch.ones(n, dtype=torch.bool)
        for i in self.special_ids:
            if 0 <= i < n:
                keep[i] = False
        return torch.arange(n)[keep]

    def decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([int(token_id)])

    def str_tokens(self, ids: list[int]) -> list[str]:
        return [self.decode_one(i) for i in ids]

    # ------------------------------------------------------------------ forward passes

    def run(
        self,
        tokens: Int[Tensor, "batch pos"],
        mask: Bool[Tensor, "batch pos"] | None = None,
        *,
        handler: Handler | None = None,
        interventions: Sequence[Intervention] = (),
        output: str | None = None,
        keep_blocks: dict[int, Tensor] | None = None,
        resume: tuple[int, Tensor] | None = None,
        grad: bool = False,
        logits_from: int = 0,
        token_types: Int[Tensor, "batch pos"] | None = None,
    ) -> Tensor | None:
        """One forward of the Hugging Face model with its attention calls routed through
        ``handler``.

        ``handler(call) -> [batch, query, head, dim]`` gets every layer's
        :class:`~headscope.models.attention.AttentionCall` (None: the model's own attention) and may
        raise :class:`~headscope.models.attention.StopForward` to end the pass early (then nothing
        is returned); ``interventions`` change the calls around it. ``output``: None, ``"logits"``
        or ``"hidden"`` (the base model's last hidden state, ``[batch, pos, d_model]``).

        ``keep_blocks`` (a dict) receives each block's output, the residual stream after layer ``l``
        (``[batch, pos, d_model]``). ``resume=(l, h)`` starts at block ``l`` from ``h``, the output
        of block ``l - 1`` kept from an earlier pass on the same tokens: blocks before ``l`` are not
        computed, and the result is what the full forward gives (block ``l`` sees the same input).

        ``logits_from``: logits only for positions ``logits_from ..`` (``[batch, pos - logits_from,
        vocab]``): the unembedding is a large share of a small model's forward, and a loss often
        needs only the last positions. ``token_types``: segment ids for encoder pairs (default: none
        passed, i.e. all zero).

        Eval mode, under ``torch.inference_mode()`` unless ``grad`` (then autograd records the pass,
        for attribution). The handler is active only during this call.
        """
        if (handler is not None or interventions) and not self.attention_interface:
            raise HeadscopeError(
                f"{self.name}: its attention does not run through transformers' "
                "attention interface, so headscope cannot reach inside it; use --engine hooks."
            )
        if output not in (None, "logits", "hidden"):
            raise HeadscopeError(f"Unknown output '{output}'; use None, 'logits' or 'hidden'.")
        mask = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask
        kwargs = {
            "input_ids": tokens.to(self.device),
            "attention_mask": mask.to(self.device).long(),
            "use_cache": False,
        }
        if token_types is not None:
            kwargs["token_type_ids"] = token_types.to(self.device)
        autograd = torch.enable_grad() if grad else torch.inference_mode()
        with (
            self._lock,
            autograd,
            _eval_mode(self.hf),
            self._our_attention(),
            self._blocks(keep_blocks, resume),
            attention.intercept(handler, interventions),
            contextlib.suppress(StopForward),
        ):
            if output == "hidden" or output is None:  # no unembedding when no logits are wanted
                hidden = self.hf.base_model(**kwargs).last_hidden_state
                return hidden if output == "hidden" else None
            if logits_from:
                kwargs["logits_to_keep"] = tokens.shape[1] - logits_from  # the last positions only
            out = self.hf(**kwargs)
            return out.logits if output == "logits" else None
        return None  # stopped early

    def blocks(self) -> list:
        """The model's transformer blocks (decoder or encoder layers), in order.

        Found as the module list whose ``i``-th entry holds the attention module of layer ``i``
        (``model.layers``, ``transformer.h``, ``encoder.layer``, ...)."""
        for module in self.hf.modules():
            if isinstance(module, torch.nn.ModuleList) and len(module) == self.n_layers:
                ok = all(
                    any(getattr(m, "layer_idx", None) == i for m in blk.modules())
                    for i, blk in enumerate(module)
                )
                if ok:
                    return list(module)
        raise HeadscopeError(
            f"{self.name}: cannot find its list of {self.n_layers} transformer blocks."
        )

    def mlp(self, layer: int) -> torch.nn.Module:
        """The MLP of block ``layer`` (``mlp``, ``feed_forward``, ``ffn``): what path patching
        freezes at its base output."""
        blk = self.blocks()[layer]
        for name in ("mlp", "feed_forward", "ffn"):
            mod = getattr(blk, name, None)
            if isinstance(mod, torch.nn.Module):
                return mod
        raise HeadscopeError(
            f"{self.name}: no MLP module (mlp, feed_forward, ffn) in block {layer}, so its MLPs "
            "cannot be frozen; run with MLPs recomputed (freeze_mlps=False)."
        )

    @contextlib.contextmanager
    def mlp_outputs(
        self, record: dict | None = None, frozen: dict | None = None, repeat: int = 1
    ) -> Iterator[None]:
        """For the forwards inside the block: each MLP's output recorded into ``record[layer]``
        (``[batch, pos, d_model]``), and/or replaced by ``frozen[layer]`` repeated ``repeat``
        times along the batch. No hook outlives the block."""
        handles = []
        try:
            for layer in range(self.n_layers):

                def hook(module, args, out, layer=layer):
                    if record is not None:
                        record[layer] = out.detach()
                    if frozen is not None and layer in frozen:
                        return frozen[layer].repeat(repeat, 1, 1)
                    return None

                handles.append(self.mlp(layer).register_forward_hook(hook))
            yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def _blocks(
        self, keep: dict[int, Tensor] | None, resume: tuple[int, Tensor] | None
    ) -> Iterator[None]:
        """Keep block outputs, and/or skip the blocks before ``resume[0]``, for one forward."""
        if keep is None and resume is None:
            yield
            return
        blocks = self.blocks()
        handles, skipped = [], []
        try:
            if keep is not None:
                for i, blk in enumerate(blocks):

                    def kept(module, args, out, i=i):
                        # [batch, pos, d_model]
                        keep[i] = (out[0] if isinstance(out, tuple) else out).detach()

                    handles.append(blk.register_forward_hook(kept))
            if resume is not None:
                start, hidden = resume
                if not 0 < start < self.n_layers:
                    raise HeadscopeError(
                        f"Cannot resume at block {start}; use 1..{self.n_layers - 1}."
                    )
                for blk in blocks[:start]:  # each returns the kept output of block start - 1
                    blk.forward = lambda *args, _h=hidden, **kwargs: _h
                    skipped.append(blk)
            yield
        finally:
            for h in handles:
                h.remove()
            for blk in skipped:
                del blk.forward  # the class's forward again

    def greedy(
        self, prompt: Sequence[int], n_new: int, handler: Handler | None = None
    ) -> list[int]:
        """``n_new`` tokens decoded greedily after ``prompt``, with a KV cache, attention calls
        routed through ``handler`` (None: the model's own attention) in the prompt's pass and
        every step."""
        if handler is not None and not self.attention_interface:
            raise HeadscopeError(
                f"{self.name}: its attention does not run through transformers' "
                "attention interface, so headscope cannot reach inside it."
            )
        cache_arg = self._cache_arg()
        out_ids: list[int] = []
        with (
            self._lock,
            torch.inference_mode(),
            _eval_mode(self.hf),
            self._our_attention(),
            attention.intercept(handler),
        ):
            x = torch.tensor([list(prompt)], device=self.device)
            out = self.hf(input_ids=x, use_cache=True, logits_to_keep=1)
            for step in range(n_new):
                nxt = int(out.logits[0, -1].argmax())
                out_ids.append(nxt)
                if step + 1 < n_new:
                    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
                    out = self.hf(
                        input_ids=torch.tensor([[nxt]], device=self.device),
                        use_cache=True,
                        **{cache_arg: cache},
                    )
        return out_ids

    def _cache_arg(self) -> str:
        """The keyword the forward takes its KV cache by: ``cache`` (transformers 5.2x), else
        ``past_key_values``."""
        import inspect

        params = inspect.signature(self.hf.forward).parameters
        return "cache" if "cache" in params else "past_key_values"

    def prefix_cache(self, prefix: Sequence[int]):
        """The KV cache of one forward over ``prefix`` (a prompt without its last token), for
        :meth:`run_last`; headscope's attention function runs it, no intervention active."""
        with (
            self._lock,
            torch.inference_mode(),
            _eval_mode(self.hf),
            self._our_attention(),
        ):
            x = torch.tensor([list(prefix)], device=self.device)
            out = self.hf(input_ids=x, use_cache=True, logits_to_keep=1)
        return getattr(out, "cache", None) or out.past_key_values

    def run_last(
        self, cache, last: int, copies: int, interventions: Sequence[Intervention] = ()
    ) -> Float[Tensor, "copy vocab"]:
        """Logits at a prompt's last position, for ``copies`` copies of it run in one batch with
        ``interventions`` (which may act per row): the copies read the prompt's earlier positions
        from ``cache`` (:meth:`prefix_cache`, left as it was) and compute the last token alone.

        What the full forward gives when the interventions act at the last position only: the
        earlier positions' keys and values do not depend on it (a causal model). Equal to the full
        forward to float rounding (``tests/effects/test_function_vectors.py``)."""
        if not self.causal:
            raise HeadscopeError(f"{self.name} is not a causal model; run_last needs a decoder.")
        batch_cache = _batch_view(cache, copies)
        with (
            self._lock,
            torch.inference_mode(),
            _eval_mode(self.hf),
            self._our_attention(),
            attention.intercept(None, interventions),
        ):
            x = torch.full((copies, 1), int(last), device=self.device)
            out = self.hf(input_ids=x, use_cache=True, **{self._cache_arg(): batch_cache})
        return out.logits[:, -1]

    def logits(
        self, tokens: Int[Tensor, "batch pos"], mask: Bool[Tensor, "batch pos"] | None = None
    ) -> Float[Tensor, "batch pos vocab"]:
        """Plain logits (eval mode, no grad)."""
        return self.run(tokens, mask, output="logits")

    @contextlib.contextmanager
    def _our_attention(self) -> Iterator[None]:
        """Make the HF model call headscope's attention function during one forward.

        Models loaded by name run it always (with no handler active it is the model's own
        attention); an in-memory model a user handed over is switched for the call and switched
        back after (under the model's lock: one forward at a time).
        """
        old = getattr(self.hf.config, "_attn_implementation", None)
        if not self.attention_interface or old == IMPLEMENTATION:
            yield
            return
        self.hf.set_attn_implementation(IMPLEMENTATION)
        if getattr(self.hf.config, "_attn_implementation", None) != IMPLEMENTATION:
            raise HeadscopeError(
                f"{self.name}: transformers would not switch this model's attention implementation "
                "(a class defined outside transformers?), so headscope cannot reach inside it; "
                "use --engine hooks, or save it and load the folder."
            )
        try:
            yield
        finally:
            self.hf.set_attn_implementation(old)

    def run_patterns(
        self,
        tokens: Int[Tensor, "batch pos"],
        mask: Bool[Tensor, "batch pos"],
        on_pattern: Callable[[int, Float[Tensor, "batch head query key"]], None],
        layers: Sequence[int] | None = None,
        token_types: Int[Tensor, "batch pos"] | None = None,
    ) -> None:
        """One bridge forward; ``on_pattern(layer, pattern)`` gets each wanted layer's pattern.

        The pattern is post-softmax ``[batch, head, query, key]``, read at transformer-lens'
        ``blocks.{L}.attn.hook_pattern``. The forward stops right after the last wanted layer's
        pattern (no later MLP, no unembedding), runs in eval mode under ``torch.inference_mode()``,
        and leaves no hook installed. The bridge's fused-QKV attention modules keep each layer's
        last pattern in a private ``attn._pattern`` (1.15 GB at 2 x 1024 tokens on a GPT-2-small
        shape); it is cleared as soon as the next layer runs and at the end, so at most one layer's
        pattern is alive at a time (``tests/models/test_model.py`` checks that no attention module
        holds a pattern-shaped tensor afterwards, so a rename upstream cannot go unnoticed).
        """
        layers = self._check_layers(layers)
        attns = [blk.attn for blk in self.bridge.blocks]

        def hook(pattern: Tensor, hook) -> None:
            layer = int(hook.name.split(".")[1])
            if layer > 0 and hasattr(attns[layer - 1], "_pattern"):
                attns[layer - 1]._pattern = None
            on_pattern(layer, pattern)
            if layer == layers[-1]:
                raise StopForward

        try:
            self._run_bridge(
                tokens,
                mask,
                [(f"blocks.{layer}.attn.hook_pattern", hook) for layer in layers],
                token_types,
            )
        finally:
            for attn in attns:
                if hasattr(attn, "_pattern"):
                    attn._pattern = None

    def _run_bridge(
        self, tokens: Tensor, mask: Tensor | None, hooks: list, token_types: Tensor | None = None
    ) -> None:
        """The bridge's forward with ``hooks`` (name, fn) scoped to it; StopForward ends it
        early."""
        bridge = self.bridge
        kwargs = {} if mask is None else {"attention_mask": mask.to(self.device).long()}
        if token_types is not None:
            kwargs["token_type_ids"] = token_types.to(self.device)
        with (
            self._lock,
            torch.inference_mode(),
            _eval_mode(bridge),
            contextlib.suppress(StopForward),
        ):
            bridge.run_with_hooks(
                tokens.to(self.device), fwd_hooks=hooks, return_type=None, **kwargs
            )

    def _check_layers(self, layers: Sequence[int] | None) -> list[int]:
        layers = sorted(set(range(self.n_layers) if layers is None else layers))
        if not layers or layers[0] < 0 or layers[-1] >= self.n_layers:
            raise HeadscopeError(
                f"Layers {layers} are not in 0..{self.n_layers - 1}; give at least one valid layer."
            )
        return layers

    # ------------------------------------------------------------------ activations and weights

    #: attention_activations' names -> transformer-lens 4.x hooks under blocks.{L}.attn
    _ACTIVATIONS = {
        "q": "hook_q",  # [batch, pos, head, d_head], before any rotary embedding
        "k": "hook_k",  # [batch, pos, kv_head, d_head]
        "v": "hook_v",  # [batch, pos, kv_head, d_head]
        "rot_q": "hook_rot_q",  # rotary models only: q after RoPE, what the scores use
        "rot_k": "hook_rot_k",
        "pattern": "hook_pattern",  # [batch, head, query, key], post-softmax
        "z": "hook_z",  # [batch, pos, head, d_head]: pattern @ v, per head, before W_O
    }

    def attention_activations(
        self, ids: Sequence[int], layers: Sequence[int]
    ) -> dict[int, dict[str, Tensor]]:
        """One forward of one sequence; each wanted layer's attention tensors, heads first.

        Returns ``{layer: {"q", "k", "v", "pattern", "z"[, "rot_q", "rot_k"]}}`` with ``q``/``z`` as
        ``[head, pos, d_head]``, ``k``/``v`` (and ``rot_k``) as ``[kv_head, pos, d_head]`` and
        ``pattern`` as ``[head, query, key]``, float32 on the CPU (``rot_*`` for rotary models
        only). Stops as soon as the last wanted layer has given all its tensors.
        """
        layers = self._check_layers(layers)
        known = self.bridge.hook_dict
        wanted = [
            (layer, key, f"blocks.{layer}.attn.{hook}")
            for layer in layers
            for key, hook in self._ACTIVATIONS.items()
        ]
        wanted = [w for w in wanted if w[2] in known]
        acts: dict[int, dict[str, Tensor]] = {layer: {} for layer in layers}
        n_last = sum(1 for w in wanted if w[0] == layers[-1])  # hook order differs between models

        def make_hook(layer: int, key: str):
            def hook(x: Tensor, hook) -> None:
                x = x.detach().float().cpu()[0]
                # [pos, head, d] -> [head, pos, d]
                acts[layer][key] = x if key == "pattern" else x.transpose(0, 1)
                if layer == layers[-1] and len(acts[layer]) == n_last:
                    raise StopForward

            return hook

        tokens = torch.tensor([list(ids)], dtype=torch.long)  # [1, pos]
        self._run_bridge(
            tokens, None, [(name, make_hook(layer, key)) for layer, key, name in wanted]
        )
        for layer, got in acts.items():
            missing = {"q", "k", "v", "pattern", "z"} - set(got)
            if missing:
                raise HeadscopeError(
                    f"Layer {layer} of {self.name} exposed no {sorted(missing)} "
                    "activations; its transformer-lens bridge lacks hook_q/k/v/pattern/z."
                )
        return acts

    def attention_inputs(
        self, tokens: Int[Tensor, "batch pos"], layers: Sequence[int]
    ) -> dict[int, Tensor]:
        """The post-norm input of each wanted layer's attention, ``{layer: [batch, pos, d_model]}``.

        This is what ``W_V`` multiplies (transformer-lens ``blocks.{L}.ln1.hook_out``), float32 on
        the CPU. The forward stops after the last wanted layer's norm.
        """
        layers = self._check_layers(layers)
        kept: dict[int, Tensor] = {}

        def hook(x: Tensor, hook) -> None:
            layer = int(hook.name.split(".")[1])
            kept[layer] = x.detach().float().cpu().clone()  # [batch, pos, d_model]
            if layer == layers[-1]:
                raise StopForward

        self._run_bridge(tokens, None, [(f"blocks.{layer}.ln1.hook_out", hook) for layer in layers])
        return kept

    def output_weights(self) -> Float[Tensor, "layer head d_head d_model"]:
        """Each head's slice of its layer's output projection, ``W_O`` (float32, CPU): head ``h``
        adds ``z_h W_O[l, h]`` to the residual stream (any architecture the bridge knows)."""
        with torch.no_grad():
            return self.bridge.W_O.detach().float().cpu()

    def circuit_weights(self) -> CircuitWeights:
        """``W_E``, ``W_U``, ``W_V``, ``W_O`` and the norm gains of a pre-norm decoder.

        Gains are what each norm multiplies by: its weight ``w``, or ``1 + w`` where the model's
        norm applies ``x (1 + w)`` (Gemma's RMSNorm, whose weights sit around 0; transformer-lens
        hands over ``w``). Gemma 2/3 also normalise the attention output before the residual add
        (a sandwich norm): that norm's gain is ``post_attn``; its division by the RMS of the
        layer's output is one positive factor per position, left out like the final norm's."""
        if not self.causal:
            raise HeadscopeError(
                f"{self.name} is an encoder (post-norm, BERT-style); circuit weights are read here "
                "for decoders with a norm before each attention layer, e.g. smollm2-135m."
            )
        bridge = self.bridge
        cfg = bridge.cfg
        rms = (
            bool(getattr(cfg, "uses_rms_norm", False))
            or getattr(cfg, "normalization_type", "") == "RMS"
        )
        plus = self._gain_offset() if rms else 0.0  # 1.0 for Gemma's x (1 + w)

        def gain(w: Tensor) -> Tensor:
            w = w.detach().float().cpu()
            return w + plus if plus else w  # unchanged (bit for bit) where the norm multiplies by w

        with torch.no_grad():
            return CircuitWeights(
                W_E=bridge.W_E.detach().float().cpu(),  # [d_vocab, d_model]
                W_U=bridge.W_U.detach().float().cpu(),  # [d_model, d_vocab]
                W_V=bridge.W_V.detach().float().cpu(),  # [layer, kv_head, d_model, d_head]
                W_O=bridge.W_O.detach().float().cpu(),  # [layer, head, d_head, d_model]
                ln1=torch.stack([gain(blk.ln1.w) for blk in bridge.blocks]),  # [layer, d_model]
                ln_final=gain(bridge.ln_final.w),  # [d_model]
                rms=rms,
                eps=float(getattr(cfg, "eps", 1e-5)),
                post_attn=self._post_attention_gains(gain),  # [layer, d_model] or None
            )

    def _final_norm(self):
        """The Hugging Face module of the final norm (before the unembedding), or None."""
        base = self.hf.base_model
        return next(
            (
                getattr(base, n)
                for n in ("norm", "ln_f", "final_layernorm", "final_layer_norm")
                if isinstance(getattr(base, n, None), torch.nn.Module)
            ),
            None,
        )

    def _gain_offset(self) -> float:
        """1.0 when the model's RMS norms multiply by ``1 + w`` (Gemma), else 0.0: told apart by
        the final norm's own output on a vector of ones (``g / sqrt(1 + eps)``, ``g`` its gain)."""
        norm = self._final_norm()
        w = getattr(norm, "weight", None)
        if not isinstance(w, Tensor):
            return 0.0
        with torch.no_grad():
            # [d_model]
            y = norm(torch.ones(1, w.numel(), dtype=w.dtype, device=w.device))[0].float().cpu()
        w = w.detach().float().cpu()
        return 1.0 if (y - (1 + w)).abs().sum() < (y - w).abs().sum() else 0.0

    def _post_attention_gains(self, gain: Callable[[Tensor], Tensor]) -> Tensor | None:
        """Per layer, the gain of a norm between the attention output and the residual add, or None.

        Gemma 2/3 blocks name it ``post_attention_layernorm`` beside a
        ``pre_feedforward_layernorm``; in Llama-style blocks ``post_attention_layernorm`` is the
        norm before the MLP (it reads the
        residual stream, not the attention output), so a block counts only when it has both."""
        blocks = self.blocks()
        if not all(
            hasattr(b, "pre_feedforward_layernorm") and hasattr(b, "post_attention_layernorm")
            for b in blocks
        ):
            return None
        # [layer, d_model]
        return torch.stack([gain(b.post_attention_layernorm.weight) for b in blocks])


@contextlib.contextmanager
def _eval_mode(module) -> Iterator[None]:
    """Dropout off for one forward; a model handed over in training mode is left in training
    mode."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


# ---------------------------------------------------------------------------- the attention
# function


def _attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
):
    """transformers' attention interface -> headscope's seam (:mod:`headscope.models.attention`).

    With no handler active this is the model's own attention: transformers' ``sdpa``, or, when
    the call carries a softmax change sdpa cannot do (soft-capping, learned sinks, position
    biases), the model's own eager attention. Otherwise the call is packed into an
    :class:`AttentionCall` whose ``output()`` is that same function, applied to the call as the
    interventions left it.
    """
    extras = {k: kwargs[k] for k in UNMODELLED if kwargs.get(k) is not None}
    own = _own_attention(module, extras)
    handler = attention.active()
    if handler is None:
        return own(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    # the call's own flag wins over the module's; transformers' sdpa defaults to causal
    causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))

    def compute(call: AttentionCall) -> Tensor:  # [batch, query, head, dim_v]
        # an intervention's edits to scale or causality win; unedited, the call is passed on as it
        # came
        return own(
            module,
            call.query,
            call.key,
            call.value,
            call.mask,
            dropout=dropout,
            scaling=scaling if call.scale == scale else call.scale,
            is_causal=is_causal if call.causal == causal else call.causal,
            **kwargs,
        )[0]

    layer = getattr(module, "layer_idx", None)
    if not isinstance(layer, int):
        layer = _LAYER_OF[module]  # a family whose attention modules carry no index (DistilBERT)
    call = AttentionCall(
        layer=layer,
        query=query,
        key=key,
        value=value,
        mask=attention_mask,
        scale=scale,
        causal=causal,
        extras=extras,
        compute=compute,
    )
    return handler(call), None


def _own_attention(module, extras: dict) -> Callable:
    """The attention function the model would run itself: sdpa, or its eager attention when the
    softmax carries something sdpa cannot do (every transformers modeling file defines one)."""
    if not extras:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        raise HeadscopeError(
            f"This model's attention uses {', '.join(extras)}, and its modeling "
            "file has no eager attention to reproduce it; use --engine hooks."
        )

    def run(module, query, key, value, attention_mask, *, is_causal=None, **kwargs):
        # headscope's attention is registered with sdpa-style masks: booleans (True = may attend),
        # or None where plain causality suffices. Eager attention adds its mask to the scores, so it
        # gets the additive form, causality spelled out (keys before the first query all visible).
        mask = attention_mask
        n_q, n_k = query.shape[-2], key.shape[-2]
        causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))
        if mask is None and causal:
            mask = torch.ones(n_q, n_k, dtype=torch.bool, device=query.device).tril(n_k - n_q)[
                None, None
            ]
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~mask, torch.finfo(query.dtype).min
            )  # [batch or 1, 1 or head, query, key]
        return eager(module, query, key, value, mask, **kwargs)

    return run


def register_attention() -> None:
    """Make ``attn_implementation="headscope"`` known to transformers (sdpa-style masks)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)


#: Layer numbers of attention modules that carry no ``layer_idx`` (DistilBERT), without touching
# them.
_LAYER_OF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def attention_layers(hf, n_layers: int) -> list[int]:
    """The layers whose attention module headscope can name: by their ``layer_idx``, or, for a
    family without one, by order when there is exactly one distinct innermost attention module per
    layer (a family that shares one module across layers, as ALBERT does, gets none)."""
    named = sorted(
        {
            m.layer_idx
            for m in hf.modules()
            if "Attention" in type(m).__name__ and isinstance(getattr(m, "layer_idx", None), int)
        }
    )
    if named:
        return named
    attn = [m for m in hf.modules() if "Attention" in type(m).__name__]
    leaves = [
        m
        for m in attn
        if not any(c is not m and "Attention" in type(c).__name__ for c in m.modules())
    ]
    if len(leaves) != n_layers or len({id(m) for m in leaves}) != n_layers:
        return []
    for i, m in enumerate(leaves):
        _LAYER_OF[m] = i
    return list(range(n_layers))


def _state_sha256(hf) -> str:
    """sha256 over the state dict's names, shapes, dtypes and bytes (an in-memory model has no
    file). Tensors that hold no data here (meta, offloaded) are hashed by name and shape only."""
    h = hashlib.sha256()
    for name, t in sorted(hf.state_dict().items()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        if t.device.type == "meta" or not t.numel():
            continue
        flat = t.detach().reshape(-1).cpu().contiguous()  # 0-dim tensors too
        h.update(memoryview(flat.view(torch.uint8).numpy()))
    return h.hexdigest()
