"""The one module that knows how transformers and transformer-lens load and run a model.

Everything else sees a :class:`Model`: its shape (``n_layers``, ``n_heads``, ``n_kv_heads``,
``d_head``, ``n_ctx``), whether it is causal, its special tokens, and a few methods:

* :meth:`Model.run`: one forward of the Hugging Face model in which every attention call goes
  through headscope's seam (:mod:`headscope.attention`): engines read it, interventions change it;
* :meth:`Model.run_patterns`: one forward of the transformer-lens ``TransformerBridge`` that hands
  each layer's post-softmax pattern (``blocks.{L}.attn.hook_pattern``) to a callback;
* :meth:`Model.attention_activations`, :meth:`Model.attention_inputs`, :meth:`Model.circuit_weights`:
  what the analysis helpers need from the bridge, by meaning rather than by hook name.

When transformer-lens or transformers change their APIs again (they have, twice), this file changes
and nothing else. A model comes from a name (offline model, hub name with an optional
``@revision``, local folder; see :mod:`headscope.sources`) or from memory: a Hugging Face model plus
its tokenizer, or a ``TransformerBridge`` (see :func:`load_model`).

transformer-lens 4.x: ``TransformerBridge.boot_transformers(name, hf_model=..., tokenizer=...)``
wraps an already-loaded HF model in place and switches it to eager attention, so the bridge always
gets a copy of its own, built on first use.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import shutil
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope import attention
from headscope.attention import AttentionCall, Handler, Intervention, StopForward
from headscope.errors import HeadscopeError
from headscope.sources import (
    DTYPE_NAMES,
    Source,
    cached_snapshot,
    check_dtype,
    materialize,
    resolve,
    sha256_file,
)

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))
_ENCODER_TYPES = {"bert", "roberta", "distilbert", "albert", "electra", "xlm-roberta", "mpnet",
                  "deberta", "deberta-v2", "camembert", "modernbert"}
#: Softmax changes passed to the attention function that plain ``softmax(q k^T * scale + mask)``
#: does not capture: logit soft-capping (Gemma 2), learned sinks (gpt-oss), T5-style position biases.
UNMODELLED = ("position_bias", "softcap", "s_aux", "sinks")
IMPLEMENTATION = "headscope"  # the name our attention function is registered under in transformers


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks cuda, then mps, then cpu; anything else must be available."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise HeadscopeError(f"Unknown device '{device}'; use auto, cpu, cuda or cuda:N.") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise HeadscopeError(f"Device '{device}' asked for but no CUDA GPU is visible; use --device cpu.")
    return dev


def resolve_dtype(dtype: str) -> torch.dtype:
    check_dtype(dtype)
    return DTYPES[dtype]


#: ``device_map`` strategies accelerate places a model by (besides an explicit ``{module: device}`` dict).
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def check_device_map(device_map, max_memory=None) -> None:
    """One line for a ``device_map`` / ``max_memory`` accelerate cannot use (before any loading)."""
    if device_map is None:
        if max_memory is not None:
            raise HeadscopeError("max_memory (--max-memory) goes with a device map; add --device-map auto.")
        return
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise HeadscopeError(f"Unknown device map '{device_map}'; use {', '.join(DEVICE_MAPS)} "
                             "(or, from Python, a {module name: device} dict).")
    if not isinstance(device_map, (str, dict)):
        raise HeadscopeError(f"A device map is one of {', '.join(DEVICE_MAPS)} or a {{module name: device}} dict, "
                             f"not a {type(device_map).__name__}.")
    if max_memory is not None and not isinstance(max_memory, dict):
        raise HeadscopeError("max_memory is a {device: size} dict, e.g. {0: '20GiB', 'cpu': '60GiB'}.")
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise HeadscopeError("--device-map needs accelerate: pip install 'accelerate>=1.0'.") from None


def parse_max_memory(text: str | None) -> dict | None:
    """``"0=20GiB,1=20GiB,cpu=60GiB"`` -> ``{0: 20 GiB, 1: 20 GiB, "cpu": 60 GiB}`` in bytes (None stays None).

    >>> parse_max_memory("0=2GiB,cpu=500MB")
    {0: 2147483648, 'cpu': 500000000}
    """
    if text is None:
        return None
    out: dict = {}
    for part in text.split(","):
        key, sep, size = part.strip().partition("=")
        key, size = key.strip(), size.strip().upper().replace(" ", "")
        num = size.rstrip("KMGIB")
        unit = size[len(num):]
        if not sep or not key or unit not in _SIZE_UNITS or not num.replace(".", "", 1).isdigit():
            raise HeadscopeError(f"--max-memory '{part.strip()}' is not DEVICE=SIZE; write it like "
                                 "0=20GiB,1=20GiB,cpu=60GiB (DEVICE: a GPU index, cpu or mps).")
        if not (key.isdigit() or key in ("cpu", "mps", "disk")):
            raise HeadscopeError(f"--max-memory device '{key}' is not a GPU index, cpu or mps.")
        out[int(key) if key.isdigit() else key] = int(float(num) * _SIZE_UNITS[unit])
    return out


def _map_device(placement) -> torch.device:
    """The torch device accelerate executes a ``hf_device_map`` entry on (offloaded ones: the CPU)."""
    if isinstance(placement, int):
        return torch.device("cuda", placement)
    if placement in ("disk", "meta"):
        return torch.device("cpu")
    return torch.device(placement)


@dataclass(frozen=True)
class CircuitWeights:
    """A pre-norm decoder's weights, as its heads' OV circuits read them (float32, CPU).

    ``W_V`` has one entry per KV head; query head ``h`` reads KV head ``h // (n_heads / n_kv)``.
    """

    W_E: Float[Tensor, "vocab d_model"]  # token embeddings, before any norm
    W_U: Float[Tensor, "d_model vocab"]  # unembedding (no final norm folded in)
    W_V: Float[Tensor, "layer kv_head d_model d_head"]
    W_O: Float[Tensor, "layer head d_head d_model"]
    ln1: Float[Tensor, "layer d_model"]  # each layer's pre-attention norm weight
    ln_final: Float[Tensor, " d_model"]  # the final norm's weight
    rms: bool  # RMSNorm (scale only) rather than LayerNorm (centre, then scale)
    eps: float


@dataclass
class Model:
    """A loaded model, as the rest of headscope sees it.

    ``hf`` is the Hugging Face model (running headscope's attention function, plain ``sdpa`` when no
    handler is active); ``bridge`` a transformer-lens ``TransformerBridge`` over a second, eager copy,
    built on first use for hook-level work.
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
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)  # one forward at a time
    _fingerprint: str | None = field(default=None, repr=False)

    @property
    def has_bridge(self) -> bool:
        """Whether a transformer-lens bridge exists or can be built (the hooks engine needs one)."""
        return self._bridge is not None or self._make_bridge is not None

    def fingerprint(self) -> str:
        """sha256 over the parameters' names, shapes, dtypes and bytes (computed once, on first use):
        what identifies an in-memory model that has no weights file."""
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
                arch = ", ".join(getattr(self.hf.config, "architectures", None) or [type(self.hf).__name__])
                why = str(exc).split(". ")[0].splitlines()[0][:120]
                hint = "use --engine blocked" if self.attention_interface else "no headscope engine can read it"
                self._bridge_error = f"transformer-lens cannot build a bridge for {arch} ({why})"
                raise HeadscopeError(f"{self._bridge_error}; {hint}.") from None
        return self._bridge

    @property
    def n_params(self) -> int:
        """Parameters of the model, tied weights counted once."""
        return sum({p.data_ptr() or id(p): p.numel() for p in self.hf.parameters()}.values())  # offloaded: meta, ptr 0

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
        user, ``b`` from the assistant (with whatever the template adds, e.g. a default system turn)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise HeadscopeError(f"{self.name}'s tokenizer has no chat template; use the plain join (--text-join plain).")
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": a}, {"role": "assistant", "content": b}],
                                                 tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def pair_token_types(self, a: str, b: str) -> list[int]:
        """The segment ids (token types) of ``join_pair(a, b)`` for a BERT-style encoder: 0 for
        ``[CLS] a [SEP]``, 1 for ``b [SEP]``."""
        if self.causal:
            raise HeadscopeError("Token types are segment ids of encoder pairs; this model is a decoder.")
        return list(self.tokenizer(a, b, add_special_tokens=True, return_token_type_ids=True)["token_type_ids"])

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
        """One forward of the Hugging Face model with its attention calls routed through ``handler``.

        ``handler(call) -> [batch, query, head, dim]`` gets every layer's
        :class:`~headscope.attention.AttentionCall` (None: the model's own attention) and may raise
        :class:`~headscope.attention.StopForward` to end the pass early (then nothing is returned);
        ``interventions`` change the calls around it. ``output``: None, ``"logits"`` or ``"hidden"``
        (the base model's last hidden state, ``[batch, pos, d_model]``).

        ``keep_blocks`` (a dict) receives each block's output, the residual stream after layer ``l``
        (``[batch, pos, d_model]``). ``resume=(l, h)`` starts at block ``l`` from ``h``, the output of
        block ``l - 1`` kept from an earlier pass on the same tokens: blocks before ``l`` are not
        computed, and the result is what the full forward gives (block ``l`` sees the same input).

        ``logits_from``: logits only for positions ``logits_from ..`` (``[batch, pos - logits_from,
        vocab]``): the unembedding is a large share of a small model's forward, and a loss often
        needs only the last positions. ``token_types``: segment ids for encoder pairs (default: none
        passed, i.e. all zero).

        Eval mode, under ``torch.inference_mode()`` unless ``grad`` (then autograd records the pass,
        for attribution). The handler is active only during this call.
        """
        if (handler is not None or interventions) and not self.attention_interface:
            raise HeadscopeError(f"{self.name}: its attention does not run through transformers' attention "
                                 "interface, so headscope cannot reach inside it; use --engine hooks.")
        if output not in (None, "logits", "hidden"):
            raise HeadscopeError(f"Unknown output '{output}'; use None, 'logits' or 'hidden'.")
        mask = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask
        kwargs = {"input_ids": tokens.to(self.device), "attention_mask": mask.to(self.device).long(),
                  "use_cache": False}
        if token_types is not None:
            kwargs["token_type_ids"] = token_types.to(self.device)
        autograd = torch.enable_grad() if grad else torch.inference_mode()
        with (self._lock, autograd, _eval_mode(self.hf), self._our_attention(), self._blocks(keep_blocks, resume),
              attention.intercept(handler, interventions), contextlib.suppress(StopForward)):
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
                ok = all(any(getattr(m, "layer_idx", None) == i for m in blk.modules()) for i, blk in enumerate(module))
                if ok:
                    return list(module)
        raise HeadscopeError(f"{self.name}: cannot find its list of {self.n_layers} transformer blocks.")

    @contextlib.contextmanager
    def _blocks(self, keep: dict[int, Tensor] | None, resume: tuple[int, Tensor] | None) -> Iterator[None]:
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
                        keep[i] = (out[0] if isinstance(out, tuple) else out).detach()  # [batch, pos, d_model]
                    handles.append(blk.register_forward_hook(kept))
            if resume is not None:
                start, hidden = resume
                if not 0 < start < self.n_layers:
                    raise HeadscopeError(f"Cannot resume at block {start}; use 1..{self.n_layers - 1}.")
                for blk in blocks[:start]:  # each returns the kept output of block start - 1
                    blk.forward = lambda *args, _h=hidden, **kwargs: _h
                    skipped.append(blk)
            yield
        finally:
            for h in handles:
                h.remove()
            for blk in skipped:
                del blk.forward  # the class's forward again

    def greedy(self, prompt: Sequence[int], n_new: int, handler: Handler | None = None) -> list[int]:
        """``n_new`` tokens decoded greedily after ``prompt``, with a KV cache, attention calls routed
        through ``handler`` (None: the model's own attention) in the prompt's pass and every step."""
        if handler is not None and not self.attention_interface:
            raise HeadscopeError(f"{self.name}: its attention does not run through transformers' attention "
                                 "interface, so headscope cannot reach inside it.")
        import inspect

        # the keyword the forward takes its KV cache by: ``cache`` (transformers 5.2x), else ``past_key_values``
        cache_arg = "cache" if "cache" in inspect.signature(self.hf.forward).parameters else "past_key_values"
        out_ids: list[int] = []
        with (self._lock, torch.inference_mode(), _eval_mode(self.hf), self._our_attention(),
              attention.intercept(handler)):
            x = torch.tensor([list(prompt)], device=self.device)
            out = self.hf(input_ids=x, use_cache=True, logits_to_keep=1)
            for step in range(n_new):
                nxt = int(out.logits[0, -1].argmax())
                out_ids.append(nxt)
                if step + 1 < n_new:
                    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
                    out = self.hf(input_ids=torch.tensor([[nxt]], device=self.device), use_cache=True,
                                  **{cache_arg: cache})
        return out_ids

    def logits(self, tokens: Int[Tensor, "batch pos"], mask: Bool[Tensor, "batch pos"] | None = None
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
            raise HeadscopeError(f"{self.name}: transformers would not switch this model's attention implementation "
                                 "(a class defined outside transformers?), so headscope cannot reach inside it; "
                                 "use --engine hooks, or save it and load the folder.")
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
        pattern is alive at a time (``tests/test_models.py`` checks that no attention module holds
        a pattern-shaped tensor afterwards, so a rename upstream cannot go unnoticed).
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
            self._run_bridge(tokens, mask, [(f"blocks.{layer}.attn.hook_pattern", hook) for layer in layers],
                             token_types)
        finally:
            for attn in attns:
                if hasattr(attn, "_pattern"):
                    attn._pattern = None

    def _run_bridge(self, tokens: Tensor, mask: Tensor | None, hooks: list, token_types: Tensor | None = None) -> None:
        """The bridge's forward with ``hooks`` (name, fn) scoped to it; StopForward ends it early."""
        bridge = self.bridge
        kwargs = {} if mask is None else {"attention_mask": mask.to(self.device).long()}
        if token_types is not None:
            kwargs["token_type_ids"] = token_types.to(self.device)
        with self._lock, torch.inference_mode(), _eval_mode(bridge), contextlib.suppress(StopForward):
            bridge.run_with_hooks(tokens.to(self.device), fwd_hooks=hooks, return_type=None, **kwargs)

    def _check_layers(self, layers: Sequence[int] | None) -> list[int]:
        layers = sorted(set(range(self.n_layers) if layers is None else layers))
        if not layers or layers[0] < 0 or layers[-1] >= self.n_layers:
            raise HeadscopeError(f"Layers {layers} are not in 0..{self.n_layers - 1}; give at least one valid layer.")
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

    def attention_activations(self, ids: Sequence[int], layers: Sequence[int]) -> dict[int, dict[str, Tensor]]:
        """One forward of one sequence; each wanted layer's attention tensors, heads first.

        Returns ``{layer: {"q", "k", "v", "pattern", "z"[, "rot_q", "rot_k"]}}`` with ``q``/``z`` as
        ``[head, pos, d_head]``, ``k``/``v`` (and ``rot_k``) as ``[kv_head, pos, d_head]`` and
        ``pattern`` as ``[head, query, key]``, float32 on the CPU (``rot_*`` for rotary models only).
        Stops as soon as the last wanted layer has given all its tensors.
        """
        layers = self._check_layers(layers)
        known = self.bridge.hook_dict
        wanted = [(layer, key, f"blocks.{layer}.attn.{hook}") for layer in layers
                  for key, hook in self._ACTIVATIONS.items()]
        wanted = [w for w in wanted if w[2] in known]
        acts: dict[int, dict[str, Tensor]] = {layer: {} for layer in layers}
        n_last = sum(1 for w in wanted if w[0] == layers[-1])  # hook order differs between models

        def make_hook(layer: int, key: str):
            def hook(x: Tensor, hook) -> None:
                x = x.detach().float().cpu()[0]
                acts[layer][key] = x if key == "pattern" else x.transpose(0, 1)  # [pos, head, d] -> [head, pos, d]
                if layer == layers[-1] and len(acts[layer]) == n_last:
                    raise StopForward
            return hook

        tokens = torch.tensor([list(ids)], dtype=torch.long)  # [1, pos]
        self._run_bridge(tokens, None, [(name, make_hook(layer, key)) for layer, key, name in wanted])
        for layer, got in acts.items():
            missing = {"q", "k", "v", "pattern", "z"} - set(got)
            if missing:
                raise HeadscopeError(f"Layer {layer} of {self.name} exposed no {sorted(missing)} activations; "
                                     "its transformer-lens bridge lacks hook_q/k/v/pattern/z.")
        return acts

    def attention_inputs(self, tokens: Int[Tensor, "batch pos"], layers: Sequence[int]) -> dict[int, Tensor]:
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
        """``W_E``, ``W_U``, ``W_V``, ``W_O`` and the norm weights of a pre-norm decoder."""
        if not self.causal:
            raise HeadscopeError(
                f"{self.name} is an encoder (post-norm, BERT-style); circuit weights are read here for "
                "decoders with a norm before each attention layer, e.g. smollm2-135m.")
        bridge = self.bridge
        cfg = bridge.cfg
        with torch.no_grad():
            return CircuitWeights(
                W_E=bridge.W_E.detach().float().cpu(),  # [d_vocab, d_model]
                W_U=bridge.W_U.detach().float().cpu(),  # [d_model, d_vocab]
                W_V=bridge.W_V.detach().float().cpu(),  # [layer, kv_head, d_model, d_head]
                W_O=bridge.W_O.detach().float().cpu(),  # [layer, head, d_head, d_model]
                ln1=torch.stack([blk.ln1.w.detach().float().cpu() for blk in bridge.blocks]),  # [layer, d_model]
                ln_final=bridge.ln_final.w.detach().float().cpu(),  # [d_model]
                rms=bool(getattr(cfg, "uses_rms_norm", False)) or getattr(cfg, "normalization_type", "") == "RMS",
                eps=float(getattr(cfg, "eps", 1e-5)),
            )


@contextlib.contextmanager
def _eval_mode(module) -> Iterator[None]:
    """Dropout off for one forward; a model handed over in training mode is left in training mode."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


# ---------------------------------------------------------------------------- the attention function


def _attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
               is_causal: bool | None = None, **kwargs):
    """transformers' attention interface -> headscope's seam (:mod:`headscope.attention`).

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
        return own(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                   is_causal=is_causal, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    # the call's own flag wins over the module's; transformers' sdpa defaults to causal
    causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))

    def compute(call: AttentionCall) -> Tensor:  # [batch, query, head, dim_v]
        # an intervention's edits to scale or causality win; unedited, the call is passed on as it came
        return own(module, call.query, call.key, call.value, call.mask, dropout=dropout,
                   scaling=scaling if call.scale == scale else call.scale,
                   is_causal=is_causal if call.causal == causal else call.causal, **kwargs)[0]

    layer = getattr(module, "layer_idx", None)
    if not isinstance(layer, int):
        layer = _LAYER_OF[module]  # a family whose attention modules carry no index (DistilBERT)
    call = AttentionCall(layer=layer, query=query, key=key, value=value, mask=attention_mask,
                         scale=scale, causal=causal, extras=extras, compute=compute)
    return handler(call), None


def _own_attention(module, extras: dict) -> Callable:
    """The attention function the model would run itself: sdpa, or its eager attention when the
    softmax carries something sdpa cannot do (every transformers modeling file defines one)."""
    if not extras:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        raise HeadscopeError(f"This model's attention uses {', '.join(extras)}, and its modeling file has no eager "
                             "attention to reproduce it; use --engine hooks.")

    def run(module, query, key, value, attention_mask, *, is_causal=None, **kwargs):
        # headscope's attention is registered with sdpa-style masks: booleans (True = may attend), or
        # None where plain causality suffices. Eager attention adds its mask to the scores, so it
        # gets the additive form, causality spelled out (keys before the first query all visible).
        mask = attention_mask
        n_q, n_k = query.shape[-2], key.shape[-2]
        causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))
        if mask is None and causal:
            mask = torch.ones(n_q, n_k, dtype=torch.bool, device=query.device).tril(n_k - n_q)[None, None]
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~mask, torch.finfo(query.dtype).min)  # [batch or 1, 1 or head, query, key]
        return eager(module, query, key, value, mask, **kwargs)

    return run


def _register_attention() -> None:
    """Make ``attn_implementation="headscope"`` known to transformers (sdpa-style masks)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)


# ---------------------------------------------------------------------------- loading


@contextlib.contextmanager
def _quiet_loading():
    """Silence transformers' load reports and progress bars (e.g. the random MLM head of a BertModel)."""
    from transformers.utils import logging as tf_logging

    old, bars = tf_logging.get_verbosity(), tf_logging.is_progress_bar_enabled()
    tf_logging.set_verbosity_error()
    tf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tf_logging.set_verbosity(old)
        if bars:  # as the caller had them: a notebook that turned them off keeps them off
            tf_logging.enable_progress_bar()


def _model_class(config):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    archs = list(getattr(config, "architectures", None) or [])
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return AutoModelForCausalLM, True
    if config.model_type in _ENCODER_TYPES:
        # BertModel checkpoints (sentence-transformers) have no MLM head; the bridge wants one.
        # It is initialised at random, which does not touch attention.
        return AutoModelForMaskedLM, False
    return AutoModelForCausalLM, True


def load_model(
    model,
    tokenizer=None,
    *,
    device: str = "auto",
    dtype: str | None = None,
    progress: Callable[[str], None] | None = None,
    name: str | None = None,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | os.PathLike | None = None,
) -> Model:
    """A :class:`Model` from a name, or from a model you already hold in memory.

    ``model`` is one of:

    * a name: an offline model (``smollm2-135m``, ``all-minilm-l6-v2``), a transformer-lens name or
      Hugging Face repo id with an optional ``@revision`` (``EleutherAI/pythia-70m@step1000``), or
      a local checkpoint folder. ``device`` and ``dtype`` (default float32) choose where and how
      it loads;
    * a Hugging Face ``PreTrainedModel`` plus its ``tokenizer`` (a fine-tuned or patched model in a
      notebook). It is used where it is, in its own dtype, and never modified: during a scan it is
      switched to headscope's attention function and switched back after;
    * a transformer-lens ``TransformerBridge`` (its own tokenizer). Its attention modules are
      transformer-lens components, so it is scanned with the hooks engine.

    ``name`` labels an in-memory model in tables (default: its ``name_or_path``, else its class).
    A :class:`Model` is returned as it is.

    ``device_map`` (a named model too big for one device): ``auto``, ``balanced``,
    ``balanced_low_0``, ``sequential`` or a ``{module name: device}`` dict, placed by accelerate
    (``max_memory``: ``{0: "20GiB", "cpu": "60GiB"}``; what fits nowhere is offloaded to
    ``offload_folder``; by default a temporary folder, removed when the model is freed). Its layers may then sit on different
    devices (or be offloaded, their weights brought in for each forward); the blocked and fused
    engines score every layer where it runs. The hooks engine (a second, one-device copy through
    transformer-lens) and ``--effects`` (they read weights directly) are refused with one line.

    >>> model = load_model("all-minilm-l6-v2")          # doctest: +SKIP
    >>> model.n_layers, model.n_heads, model.causal      # doctest: +SKIP
    (6, 12, False)
    """
    if isinstance(model, Model):
        return model  # already loaded
    if isinstance(model, (str, os.PathLike)):
        if tokenizer is not None:
            raise HeadscopeError("tokenizer= goes with an in-memory model; a named model brings its own.")
        check_device_map(device_map, max_memory)
        placement = None if device_map is None else (device_map, max_memory, offload_folder)
        return _load_named(str(model), device, dtype or "float32", progress or (lambda _msg: None), placement)
    if device_map is not None or max_memory is not None:
        raise HeadscopeError("device_map= loads a model by name; an in-memory model is used where it is "
                             "(dispatch it with accelerate first).")
    if _is_bridge(model):
        return _wrap_bridge(model, name, device)
    if hasattr(model, "config") and hasattr(model, "forward") and hasattr(model, "parameters"):
        if tokenizer is None:
            raise HeadscopeError("An in-memory model needs its tokenizer: load_model(model, tokenizer).")
        return _wrap_hf(model, tokenizer, name, device, dtype)
    raise HeadscopeError(f"Cannot load a {type(model).__name__}; give a model name or folder, a Hugging Face "
                         "model with its tokenizer, or a transformer-lens TransformerBridge.")


def _load_named(name: str, device: str, dtype: str, progress: Callable[[str], None], placement=None) -> Model:
    source = resolve(name)
    if placement is not None and device != "auto":
        raise HeadscopeError(f"--device {device} and --device-map both place the model; give one of them.")
    dev = resolve_device(device) if placement is None else None
    torch_dtype = resolve_dtype(dtype)
    ref, provenance = materialize(source, progress, convert_gguf=_dequantize_gguf)
    local_only = source.kind != "hub" or bool(provenance.get("cached"))
    if local_only:
        # Nothing needs the hub: lookups would otherwise hang for ~20 s before failing offline.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    progress(f"loading {name}")
    ref_s = str(ref)
    at = {"revision": source.revision} if source.revision else {}
    with _quiet_loading():
        from transformers import AutoConfig, AutoTokenizer

        _register_attention()
        try:
            config = AutoConfig.from_pretrained(ref_s, local_files_only=local_only, **at)
            tok = AutoTokenizer.from_pretrained(ref_s, local_files_only=local_only, **at)
        except OSError as exc:
            raise HeadscopeError(f"Could not load '{name}' from {ref_s}: {str(exc).splitlines()[0]}") from None
        cls, causal = _model_class(config)
        spread, scratch = ({}, None) if placement is None else _placement_kwargs(*placement)
        try:
            hf = cls.from_pretrained(ref_s, config=config, dtype=torch_dtype, attn_implementation=IMPLEMENTATION,
                                     local_files_only=local_only, **at, **spread)
        except BaseException:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            raise
    if scratch is not None:
        # the offload folder headscope made goes when the model does (or when Python exits)
        weakref.finalize(hf, shutil.rmtree, scratch, ignore_errors=True)
    if placement is None:
        hf.to(dev)
    else:  # accelerate placed it: inputs go where the embeddings run, its hooks move them on
        devmap = getattr(hf, "hf_device_map", None) or {"": "cpu"}
        dev = _map_device(next(iter(devmap.values())))
        progress("placed by device_map: " + ", ".join(f"{k or 'all'} -> {v}" for k, v in devmap.items()))
    hf.eval()

    def make_bridge():
        with _quiet_loading():
            from transformer_lens.model_bridge import TransformerBridge

            eager = cls.from_pretrained(ref_s, dtype=torch_dtype, attn_implementation="eager",
                                        local_files_only=local_only, **at)
            eager.eval()
            bridge = TransformerBridge.boot_transformers(ref_s, hf_model=eager, tokenizer=tok,
                                                         device=str(dev), dtype=torch_dtype)
        bridge.eval()
        return bridge

    provenance = dict(provenance)
    if source.kind in ("local", "hub"):
        weights = _find_weights(source, ref_s)
        if weights is not None and "weights_sha256" not in provenance:
            provenance["weights_sha256"] = sha256_file(weights)
            provenance["weights_file"] = weights.name
    model = _model(name, source, provenance, hf, tok, causal, dev, torch_dtype, make_bridge)
    if placement is not None:
        model.device_map = {k: str(v) for k, v in hf.hf_device_map.items()} if hasattr(hf, "hf_device_map") else {}
        # the bridge would be a second full copy on one device, which is what a device map avoids
        model._bridge_error = ("a --device-map model has no transformer-lens bridge (the hooks engine needs a second "
                               "full copy on one device)")
    return model


def _placement_kwargs(device_map, max_memory, offload_folder) -> tuple[dict, str | None]:
    """``from_pretrained`` arguments that let accelerate place the model (and offload what fits nowhere),
    and the temporary offload folder headscope made for it (None when the caller gave one: that folder
    is the caller's and is never removed)."""
    import tempfile

    scratch = None
    if offload_folder is None:
        offload_folder = scratch = tempfile.mkdtemp(prefix="headscope-offload-")
    kwargs = {"device_map": device_map, "offload_folder": str(offload_folder), "offload_state_dict": True}
    if max_memory is not None:
        kwargs["max_memory"] = max_memory
    return kwargs, scratch


def _wrap_hf(hf, tokenizer, name: str | None, device: str, dtype: str | None) -> Model:
    """A Model over a Hugging Face model the caller holds (used in place, never modified)."""
    param = next(hf.parameters())
    dev, torch_dtype = param.device, param.dtype
    if device != "auto" and resolve_device(device) != dev:
        raise HeadscopeError(f"The model is on {dev}, not {device}; move it first (model.to('{device}')) "
                             "or leave device='auto'.")
    if dtype is not None and resolve_dtype(dtype) != torch_dtype:
        raise HeadscopeError(f"The model is in {str(torch_dtype).replace('torch.', '')}, not {dtype}; convert it "
                             "first or leave dtype unset.")
    label = name or getattr(hf.config, "_name_or_path", None) or type(hf).__name__
    with _quiet_loading():
        _register_attention()
    causal = _is_causal_lm(hf)

    def make_bridge():
        with _quiet_loading():
            from transformer_lens.model_bridge import TransformerBridge

            eager = copy.deepcopy(hf)  # boot_transformers switches its model to eager in place
            eager.eval()
            bridge = TransformerBridge.boot_transformers(label, hf_model=eager, tokenizer=_bridge_tokenizer(tokenizer),
                                                         device=str(dev), dtype=torch_dtype)
        bridge.eval()
        return bridge

    source = Source(typed=label, kind="memory", ref=type(hf).__name__)
    provenance = {"source": f"in-memory {type(hf).__name__}", "name_or_path": getattr(hf.config, "_name_or_path", "")}
    model = _model(label, source, provenance, hf, tokenizer, causal, dev, torch_dtype, make_bridge)
    # transformers only switches the implementation of classes it can (not ones defined elsewhere)
    switchable = getattr(hf, "_can_set_attn_implementation", lambda: True)()
    model.attention_interface = model.attention_interface and (
        hf.config._attn_implementation == IMPLEMENTATION or bool(switchable))
    return model


def _wrap_bridge(bridge, name: str | None, device: str) -> Model:
    """A Model over a TransformerBridge the caller holds: hooks engine only (see :func:`load_model`)."""
    hf = bridge.original_model
    label = name or getattr(hf.config, "_name_or_path", None) or type(hf).__name__
    param = next(hf.parameters())
    if device != "auto" and resolve_device(device) != param.device:
        raise HeadscopeError(f"The bridge is on {param.device}, not {device}; move it first or leave device='auto'.")
    source = Source(typed=label, kind="memory", ref="TransformerBridge")
    provenance = {"source": f"in-memory TransformerBridge over {type(hf).__name__}",
                  "name_or_path": getattr(hf.config, "_name_or_path", "")}
    model = _model(label, source, provenance, hf, bridge.tokenizer, _is_causal_lm(hf), param.device, param.dtype,
                   None)
    model._bridge = bridge
    model.attention_interface = False  # its attention modules are transformer-lens components
    return model


#: Layer numbers of attention modules that carry no ``layer_idx`` (DistilBERT), without touching them.
_LAYER_OF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _attention_layers(hf, n_layers: int) -> list[int]:
    """The layers whose attention module headscope can name: by their ``layer_idx``, or, for a
    family without one, by order when there is exactly one distinct innermost attention module per
    layer (a family that shares one module across layers, as ALBERT does, gets none)."""
    named = sorted({m.layer_idx for m in hf.modules()
                    if "Attention" in type(m).__name__ and isinstance(getattr(m, "layer_idx", None), int)})
    if named:
        return named
    attn = [m for m in hf.modules() if "Attention" in type(m).__name__]
    leaves = [m for m in attn if not any(c is not m and "Attention" in type(c).__name__ for c in m.modules())]
    if len(leaves) != n_layers or len({id(m) for m in leaves}) != n_layers:
        return []
    for i, m in enumerate(leaves):
        _LAYER_OF[m] = i
    return list(range(n_layers))


def _model(name, source, provenance, hf, tok, causal, dev, torch_dtype, make_bridge) -> Model:
    cfg = hf.config
    n_layers = int(cfg.num_hidden_layers)
    attn_layers = _attention_layers(hf, n_layers)
    n_heads = int(cfg.num_attention_heads)
    d_model = int(getattr(cfg, "hidden_size", 0) or getattr(cfg, "n_embd", 0))
    return Model(
        name=name,
        source=source,
        provenance=provenance,
        hf=hf,
        tokenizer=tok,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or n_heads),
        d_model=d_model,
        d_head=int(getattr(cfg, "head_dim", None) or d_model // n_heads),
        n_ctx=_context_length(cfg),
        causal=causal,
        **_special_tokens(tok, causal),
        device=torch.device(dev),
        dtype=torch_dtype,
        attention_interface=attn_layers == list(range(n_layers)),
        reach=attention_reach(cfg, n_layers),
        _make_bridge=make_bridge,
    )


#: The context of a model whose config names none (ALiBi models such as BLOOM have no learned
#: positions): what headscope lets a probe use.
UNBOUNDED_CONTEXT = 8192


def _context_length(cfg) -> int:
    for key in ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return UNBOUNDED_CONTEXT


def attention_reach(cfg, n_layers: int) -> tuple[int | None, ...]:
    """Per layer, the largest ``|q - k|`` a query can attend over (None: no window), from the config.

    The rules transformers' masks follow (checked against each family's eager attention by the
    conformance suite, ``scripts/conformance.py``):

    * ``layer_types`` naming ``sliding_attention`` layers: causal models see ``q - w < k <= q``
      (``w = sliding_window``), so the reach is ``w - 1``; ModernBERT's bidirectional local layers
      see ``|q - k| <= sliding_window`` (its config stores half the local window there);
    * no ``layer_types`` but a ``sliding_window`` (Mistral, Mixtral, Phi-3, Starcoder2): every layer;
    * GPT-Neo: its ``local`` layers see ``q - window_size < k <= q``.

    >>> from types import SimpleNamespace as NS
    >>> attention_reach(NS(model_type="gemma3", sliding_window=4,
    ...                    layer_types=["sliding_attention", "full_attention"]), 2)
    (3, None)
    >>> attention_reach(NS(model_type="llama"), 2)
    (None, None)
    """
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if cfg.model_type == "gpt_neo":
        kinds = list(getattr(cfg, "attention_layers", None) or [])
        return tuple(int(cfg.window_size) - 1 if k == "local" else None for k in kinds[:n_layers]) + \
            (None,) * max(0, n_layers - len(kinds))
    if types is not None:
        if len(types) != n_layers:
            raise HeadscopeError(f"The config names {len(types)} layer types for {n_layers} layers.")
        if any(t == "sliding_attention" for t in types) and window is None:
            raise HeadscopeError("The config has sliding-attention layers but no sliding_window.")
        unknown = sorted({t for t in types} - {"sliding_attention", "full_attention"})
        if unknown:  # chunked or other masks: not modelled, so never scored as if they were full
            raise HeadscopeError(f"This model has {', '.join(unknown)} layers, whose mask headscope does not "
                                 "model (it knows full_attention and sliding_attention).")
        reach = int(window) if cfg.model_type == "modernbert" else (None if window is None else int(window) - 1)
        return tuple(reach if t == "sliding_attention" else None for t in types)
    if window is not None and getattr(cfg, "use_sliding_window", True):
        return (int(window) - 1,) * n_layers
    return (None,) * n_layers


def _is_bridge(obj) -> bool:
    return type(obj).__name__ == "TransformerBridge" and hasattr(obj, "original_model")


def _is_causal_lm(hf) -> bool:
    """Decoders (with or without their LM head) are causal; the encoder families are not, unless
    configured as decoders."""
    if hf.config.model_type in _ENCODER_TYPES:
        return bool(getattr(hf.config, "is_decoder", False))
    return True


def _bridge_tokenizer(tok):
    """A copy of an in-memory tokenizer the bridge accepts: it reloads tokenizers by
    ``init_kwargs["name_or_path"]`` unless ``add_bos_token`` is set (headscope feeds token ids)."""
    tok = copy.deepcopy(tok)
    tok.init_kwargs.setdefault("name_or_path", "")
    tok.init_kwargs["add_bos_token"] = True
    return tok


def _state_sha256(hf) -> str:
    """sha256 over the state dict's names, shapes, dtypes and bytes (an in-memory model has no file).
    Tensors that hold no data here (meta, offloaded) are hashed by name and shape only."""
    h = hashlib.sha256()
    for name, t in sorted(hf.state_dict().items()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        if t.device.type == "meta" or not t.numel():
            continue
        flat = t.detach().reshape(-1).cpu().contiguous()  # 0-dim tensors too
        h.update(memoryview(flat.view(torch.uint8).numpy()))
    return h.hexdigest()


def _find_weights(source: Source, ref: str) -> Path | None:
    """The weights file of a local folder or cached hub snapshot (for its sha256)."""
    folder = Path(ref) if Path(ref).is_dir() else cached_snapshot(ref, source.revision)
    if folder is None:
        return None
    for pattern in ("model.safetensors", "*.safetensors", "pytorch_model.bin"):
        found = sorted(folder.glob(pattern))
        if found:
            return found[0].resolve()
    return None


def _special_tokens(tok, causal: bool) -> dict:
    """BOS/[CLS], separator, padding and the set of ids that are not ordinary tokens."""
    special = set(getattr(tok, "all_special_ids", []) or [])
    special |= {int(i) for i in (getattr(tok, "added_tokens_decoder", None) or {})}
    sep = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    if causal:
        bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        eos = None
    else:
        bos = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
        eos = sep
    if bos is None or sep is None:
        raise HeadscopeError(
            "The tokenizer has no BOS/[CLS] or separator token (sep or eos); headscope needs both "
            "to build its probes."
        )
    pad = tok.pad_token_id if tok.pad_token_id is not None else sep
    return {"bos_id": int(bos), "sep_id": int(sep), "pad_id": int(pad),
            "eos_id": None if eos is None else int(eos), "special_ids": frozenset(special)}


def _dequantize_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint to an fp32 safetensors folder with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _quiet_loading():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
        )
        # A GGUF-loaded model refuses save_pretrained (it carries a quantization config); copy its
        # dequantized weights into a plain model of the same config and save that instead.
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg.pop("_model_name_or_path", None)
        config = type(model.config).from_dict(cfg)
        config.architectures = [type(model).__name__]
        plain = type(model)(config)
        plain.load_state_dict(model.state_dict())
        plain.save_pretrained(out)
        tok.save_pretrained(out)
