"""The one module that knows how transformer-lens and transformers load and run a model.

Everything else sees a :class:`Model`: its shape (``n_layers``, ``n_heads``, ``n_ctx``), whether it
is causal, its special tokens, and one method, :meth:`Model.run_patterns`, that runs a forward pass
and hands each layer's post-softmax pattern to a callback. When transformer-lens changes its API
again, this file changes and nothing else.

transformer-lens 4.x: ``TransformerBridge.boot_transformers(name, hf_model=..., tokenizer=...)``
wraps an already-loaded HF model (always eager attention). Patterns arrive at
``blocks.{L}.attn.hook_pattern`` as ``[batch, head, query, key]``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.errors import HeadscopeError
from headscope.sources import Source, materialize, resolve

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ENCODER_TYPES = {"bert", "roberta", "distilbert", "albert", "electra", "xlm-roberta", "mpnet",
                  "deberta", "deberta-v2", "camembert", "modernbert"}


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
    if dtype not in DTYPES:
        raise HeadscopeError(f"Unknown dtype '{dtype}'; use one of {', '.join(DTYPES)}.")
    return DTYPES[dtype]


class _StopForward(Exception):
    """Raised from the last wanted pattern hook: the rest of the forward is not needed."""


@dataclass
class Model:
    """A loaded model, as the rest of headscope sees it.

    ``hf`` is the plain Hugging Face model running the ``headscope`` attention implementation (fused
    ``sdpa`` plus blocked patterns while scoring). ``bridge`` is a transformer-lens
    ``TransformerBridge`` over a second, eager copy, built on first use, for hook-level work.
    """

    name: str  # as the user typed it
    source: Source
    provenance: dict  # where the weights came from, for metadata.json
    hf: object  # transformers PreTrainedModel (attn_implementation="headscope")
    tokenizer: object
    n_layers: int
    n_heads: int
    n_ctx: int
    causal: bool
    bos_id: int  # token at position 0: BOS, or [CLS] for encoders
    sep_id: int  # the separator: sep_token_id, else eos_token_id
    pad_id: int
    eos_id: int | None  # appended at the end by encoders ([SEP]); None for decoders
    device: torch.device
    dtype: torch.dtype
    special_ids: frozenset[int] = field(default_factory=frozenset)
    supports_blocked: bool = False  # every layer's attention goes through the attention interface
    _make_bridge: Callable[[], object] | None = field(default=None, repr=False)
    _bridge: object | None = field(default=None, repr=False)

    @property
    def bridge(self):
        """The transformer-lens bridge (eager attention, every hook point); loaded on first use."""
        if self._bridge is None:
            if self._make_bridge is None:
                raise HeadscopeError("This model has no transformer-lens bridge.")
            self._bridge = self._make_bridge()
        return self._bridge

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

    # ------------------------------------------------------------------ forward

    def run_patterns(
        self,
        tokens: Int[Tensor, "batch pos"],
        attention_mask: Bool[Tensor, "batch pos"],
        on_pattern: Callable[[int, Float[Tensor, "batch head query key"]], None],
        layers: list[int] | None = None,
    ) -> None:
        """One forward pass; ``on_pattern(layer, pattern)`` gets each wanted layer's pattern.

        The pattern is post-softmax ``[batch, head, query, key]``. The forward stops right after the
        last wanted layer's pattern (no later MLP, no unembedding), runs in eval mode under
        ``torch.inference_mode()``, and leaves no hook installed. The bridge's fused-QKV attention
        keeps each layer's last pattern in ``attn._pattern``; it is cleared as soon as the next
        layer runs and at the end, so at most one layer's pattern is alive at a time.
        """
        layers = self._check_layers(layers)
        last = layers[-1]
        attns = [blk.attn for blk in self.bridge.blocks]

        def hook(pattern: Tensor, hook) -> None:
            layer = int(hook.name.split(".")[1])
            if layer > 0 and hasattr(attns[layer - 1], "_pattern"):
                attns[layer - 1]._pattern = None
            on_pattern(layer, pattern)
            if layer == last:
                raise _StopForward

        fwd_hooks = [(f"blocks.{layer}.attn.hook_pattern", hook) for layer in layers]
        self.bridge.eval()
        try:
            with torch.inference_mode(), contextlib.suppress(_StopForward):
                self.bridge.run_with_hooks(
                    tokens.to(self.device),
                    attention_mask=attention_mask.to(self.device).long(),
                    fwd_hooks=fwd_hooks,
                    return_type=None,
                )
        finally:
            for attn in attns:
                if hasattr(attn, "_pattern"):
                    attn._pattern = None

    def run_pattern_blocks(
        self,
        tokens: Int[Tensor, "batch pos"],
        attention_mask: Bool[Tensor, "batch pos"],
        on_block: Callable[..., None],
        layers: list[int] | None = None,
        block_bytes: int | None = None,
        fused_flags: dict[str, Tensor] | None = None,
    ) -> None:
        """One fused-attention forward; ``on_block(layer, block, q_start, log_block)`` gets exact blocks.

        Each block is ``softmax(q k^T * scale + mask)`` for query rows ``q_start..q_start+rows-1``
        (causal models: keys ``0..q_start+rows-1`` only), and ``log_block`` is its natural log
        (finite: masked entries hold the most negative float). No full pattern is ever held; the forward
        stops right after the last wanted layer's attention scores.

        With ``fused_flags`` (name -> ``[batch, key]`` key sets), layers whose attention the fused
        kernel can take get one :class:`~headscope.metrics.stats.HeadStats` each instead of blocks.
        """
        from headscope.blocked import BLOCK_BYTES, BlockScorer, StopForward, scoring

        if not self.supports_blocked:
            raise HeadscopeError(f"{self.name}: its attention does not use the transformers attention interface; use the hooks engine.")
        layers = self._check_layers(layers)
        scorer = BlockScorer(on_block, frozenset(layers), layers[-1], block_bytes or BLOCK_BYTES, fused_flags)
        self.hf.eval()
        with torch.inference_mode(), scoring(scorer), contextlib.suppress(StopForward):
            self.hf(input_ids=tokens.to(self.device), attention_mask=attention_mask.to(self.device).long(),
                    use_cache=False)

    def _check_layers(self, layers: list[int] | None) -> list[int]:
        layers = sorted(set(range(self.n_layers) if layers is None else layers))
        if not layers or layers[0] < 0 or layers[-1] >= self.n_layers:
            raise HeadscopeError(f"Layers {layers} are not in 0..{self.n_layers - 1}; give at least one valid layer.")
        return layers

    def forward_logits(
        self, tokens: Int[Tensor, "batch pos"], attention_mask: Bool[Tensor, "batch pos"] | None = None
    ) -> Float[Tensor, "batch pos vocab"]:
        """Plain logits (for the notebooks' loss curves), eval mode, no grad."""
        self.hf.eval()
        with torch.inference_mode():
            kwargs = {} if attention_mask is None else {"attention_mask": attention_mask.long().to(self.device)}
            return self.hf(input_ids=tokens.to(self.device), use_cache=False, **kwargs).logits


# ---------------------------------------------------------------------------- loading


@contextlib.contextmanager
def _quiet_loading():
    """Silence transformers' load reports (e.g. the random MLM head of a BertModel checkpoint)."""
    from transformers.utils import logging as tf_logging

    old = tf_logging.get_verbosity()
    tf_logging.set_verbosity_error()
    tf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tf_logging.set_verbosity(old)
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
    name: str,
    device: str = "auto",
    dtype: str = "float32",
    progress: Callable[[str], None] | None = None,
) -> Model:
    """Load ``name`` (offline model, hub name/alias, repo id or local folder) for scanning.

    >>> model = load_model("all-minilm-l6-v2")          # doctest: +SKIP
    >>> model.n_layers, model.n_heads, model.causal      # doctest: +SKIP
    (6, 12, False)
    """
    progress = progress or (lambda _msg: None)
    source = resolve(name)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    ref, provenance = materialize(source, progress)
    local_only = source.kind != "hub" or bool(provenance.get("cached"))
    if local_only:
        # Nothing needs the hub: lookups would otherwise hang for ~20 s before failing offline.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    progress(f"loading {name}")
    ref_s = str(ref)
    with _quiet_loading():
        from transformers import AutoConfig, AutoTokenizer

        _register_attention()
        try:
            config = AutoConfig.from_pretrained(ref_s, local_files_only=local_only)
            tok = AutoTokenizer.from_pretrained(ref_s, local_files_only=local_only)
        except OSError as exc:
            raise HeadscopeError(f"Could not load '{name}' from {ref_s}: {str(exc).splitlines()[0]}") from None
        cls, causal = _model_class(config)
        hf = cls.from_pretrained(ref_s, config=config, dtype=torch_dtype, attn_implementation="headscope",
                                 local_files_only=local_only)
    hf.to(dev).eval()

    def make_bridge():
        with _quiet_loading():
            from transformer_lens.model_bridge import TransformerBridge

            eager = cls.from_pretrained(ref_s, dtype=torch_dtype, attn_implementation="eager",
                                        local_files_only=local_only)
            eager.eval()
            bridge = TransformerBridge.boot_transformers(ref_s, hf_model=eager, tokenizer=tok,
                                                         device=str(dev), dtype=torch_dtype)
        bridge.eval()
        return bridge

    cfg = hf.config
    provenance = dict(provenance)
    if source.kind in ("local", "hub"):
        weights = _find_weights(ref_s)
        if weights is not None and "weights_sha256" not in provenance:
            from headscope.sources import sha256_file

            provenance["weights_sha256"] = sha256_file(weights)
            provenance["weights_file"] = weights.name
    attn_layers = sorted({m.layer_idx for m in hf.modules()
                          if "Attention" in type(m).__name__ and isinstance(getattr(m, "layer_idx", None), int)})
    n_layers = int(cfg.num_hidden_layers)
    return Model(
        name=name,
        source=source,
        provenance=provenance,
        hf=hf,
        tokenizer=tok,
        n_layers=n_layers,
        n_heads=int(cfg.num_attention_heads),
        n_ctx=int(getattr(cfg, "max_position_embeddings", None) or cfg.n_positions),
        causal=causal,
        **_special_tokens(tok, causal),
        device=dev,
        dtype=torch_dtype,
        supports_blocked=attn_layers == list(range(n_layers)),
        _make_bridge=make_bridge,
    )


def _register_attention() -> None:
    """Make ``attn_implementation="headscope"`` known to transformers (sdpa-style masks)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    from headscope.blocked import attention

    AttentionInterface.register("headscope", attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register("headscope", sdpa_mask)


def _find_weights(ref: str) -> Path | None:
    """The weights file of a local folder or cached hub snapshot (for its sha256)."""
    from headscope.sources import cached_snapshot

    folder = Path(ref) if Path(ref).is_dir() else cached_snapshot(ref)
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
