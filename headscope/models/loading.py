"""How a :class:`~headscope.models.model.Model` is made: :func:`load_model`.

From a name (an offline model, a transformer-lens or hub name with an optional ``@revision``, a
local checkpoint folder; see :mod:`headscope.models.sources`), optionally placed across devices by
accelerate (``device_map``), or from a model you already hold in memory (a Hugging Face model plus
its tokenizer, or a transformer-lens ``TransformerBridge``). Here too: what a config says about the
model's shape, context, sliding windows and special tokens, and the one-time GGUF dequantization of
the offline models.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

from headscope.errors import HeadscopeError
from headscope.models.model import IMPLEMENTATION, Model, attention_layers, register_attention
from headscope.models.placement import DEVICE_MAPS, check_device_map, parse_max_memory  # noqa: F401
from headscope.models.sources import (
    DTYPE_NAMES,
    Source,
    cached_snapshot,
    check_dtype,
    materialize,
    resolve,
    sha256_file,
)

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))
_ENCODER_TYPES = {
    "bert",
    "roberta",
    "distilbert",
    "albert",
    "electra",
    "xlm-roberta",
    "mpnet",
    "deberta",
    "deberta-v2",
    "camembert",
    "modernbert",
}


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
        raise HeadscopeError(
            f"Device '{device}' asked for but no CUDA GPU is visible; use --device cpu."
        )
    return dev


def resolve_dtype(dtype: str) -> torch.dtype:
    check_dtype(dtype)
    return DTYPES[dtype]


def _map_device(placement) -> torch.device:
    """The torch device accelerate executes a ``hf_device_map`` entry on (offloaded ones: the
    CPU)."""
    if isinstance(placement, int):
        return torch.device("cuda", placement)
    if placement in ("disk", "meta"):
        return torch.device("cpu")
    return torch.device(placement)


# ---------------------------------------------------------------------------- loading


@contextlib.contextmanager
def _quiet_loading():
    """Silence transformers' load reports and progress bars (e.g. the random MLM head of a
    BertModel)."""
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
    ``offload_folder``; by default a temporary folder, removed when the model is freed). Its layers
    may then sit on different devices (or be offloaded, their weights brought in for each forward);
    the blocked and fused engines score every layer where it runs. The hooks engine (a second,
    one-device copy through transformer-lens) and ``--effects`` (they read weights directly) are
    refused with one line.

    >>> model = load_model("all-minilm-l6-v2")          # doctest: +SKIP
    >>> model.n_layers, model.n_heads, model.causal      # doctest: +SKIP
    (6, 12, False)
    """
    if isinstance(model, Model):
        return model  # already loaded
    if isinstance(model, (str, os.PathLike)):
        if tokenizer is not None:
            raise HeadscopeError(
                "tokenizer= goes with an in-memory model; a named model brings its own."
            )
        check_device_map(device_map, max_memory)
        placement = None if device_map is None else (device_map, max_memory, offload_folder)
        return _load_named(
            str(model), device, dtype or "float32", progress or (lambda _msg: None), placement
        )
    if device_map is not None or max_memory is not None:
        raise HeadscopeError(
            "device_map= loads a model by name; an in-memory model is used where it is "
            "(dispatch it with accelerate first)."
        )
    if _is_bridge(model):
        return _wrap_bridge(model, name, device)
    if hasattr(model, "config") and hasattr(model, "forward") and hasattr(model, "parameters"):
        if tokenizer is None:
            raise HeadscopeError(
                "An in-memory model needs its tokenizer: load_model(model, tokenizer)."
            )
        return _wrap_hf(model, tokenizer, name, device, dtype)
    raise HeadscopeError(
        f"Cannot load a {type(model).__name__}; give a model name or folder, a "
        "Hugging Face model with its tokenizer, or a transformer-lens TransformerBridge."
    )


def _load_named(
    name: str, device: str, dtype: str, progress: Callable[[str], None], placement=None
) -> Model:
    source = resolve(name)
    if placement is not None and device != "auto":
        raise HeadscopeError(
            f"--device {device} and --device-map both place the model; give one of them."
        )
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

        register_attention()
        try:
            config = AutoConfig.from_pretrained(ref_s, local_files_only=local_only, **at)
            tok = AutoTokenizer.from_pretrained(ref_s, local_files_only=local_only, **at)
        except OSError as exc:
            raise HeadscopeError(
                f"Could not load '{name}' from {ref_s}: {str(exc).splitlines()[0]}"
            ) from None
        cls, causal = _model_class(config)
        spread, scratch = ({}, None) if placement is None else _placement_kwargs(*placement)
        try:
            hf = cls.from_pretrained(
                ref_s,
                config=config,
                dtype=torch_dtype,
                attn_implementation=IMPLEMENTATION,
                local_files_only=local_only,
                **at,
                **spread,
            )
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
        progress(
            "placed by device_map: " + ", ".join(f"{k or 'all'} -> {v}" for k, v in devmap.items())
        )
    hf.eval()

    def make_bridge():
        with _quiet_loading():
            from transformer_lens.model_bridge import TransformerBridge

            eager = cls.from_pretrained(
                ref_s,
                dtype=torch_dtype,
                attn_implementation="eager",
                local_files_only=local_only,
                **at,
            )
            eager.eval()
            bridge = TransformerBridge.boot_transformers(
                ref_s, hf_model=eager, tokenizer=tok, device=str(dev), dtype=torch_dtype
            )
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
        model.device_map = (
            {k: str(v) for k, v in hf.hf_device_map.items()} if hasattr(hf, "hf_device_map") else {}
        )
        # the bridge would be a second full copy on one device, which is what a device map avoids
        model._bridge_error = (
            "a --device-map model has no transformer-lens bridge (the hooks engine needs a second "
            "full copy on one device)"
        )
    return model


def _placement_kwargs(device_map, max_memory, offload_folder) -> tuple[dict, str | None]:
    """``from_pretrained`` arguments that let accelerate place the model (and offload what fits
    nowhere), and the temporary offload folder headscope made for it (None when the caller gave
    one: that folder is the caller's and is never removed)."""
    import tempfile

    scratch = None
    if offload_folder is None:
        offload_folder = scratch = tempfile.mkdtemp(prefix="headscope-offload-")
    kwargs = {
        "device_map": device_map,
        "offload_folder": str(offload_folder),
        "offload_state_dict": True,
    }
    if max_memory is not None:
        kwargs["max_memory"] = max_memory
    return kwargs, scratch


def _wrap_hf(hf, tokenizer, name: str | None, device: str, dtype: str | None) -> Model:
    """A Model over a Hugging Face model the caller holds (used in place, never modified)."""
    param = next(hf.parameters())
    dev, torch_dtype = param.device, param.dtype
    if device != "auto" and resolve_device(device) != dev:
        raise HeadscopeError(
            f"The model is on {dev}, not {device}; move it first (model.to('{device}')) "
            "or leave device='auto'."
        )
    if dtype is not None and resolve_dtype(dtype) != torch_dtype:
        raise HeadscopeError(
            f"The model is in {str(torch_dtype).replace('torch.', '')}, not {dtype}; convert it "
            "first or leave dtype unset."
        )
    label = name or getattr(hf.config, "_name_or_path", None) or type(hf).__name__
    with _quiet_loading():
        register_attention()
    causal = _is_causal_lm(hf)

    def make_bridge():
        with _quiet_loading():
            from transformer_lens.model_bridge import TransformerBridge

            eager = copy.deepcopy(hf)  # boot_transformers switches its model to eager in place
            eager.eval()
            bridge = TransformerBridge.boot_transformers(
                label,
                hf_model=eager,
                tokenizer=_bridge_tokenizer(tokenizer),
                device=str(dev),
                dtype=torch_dtype,
            )
        bridge.eval()
        return bridge

    source = Source(typed=label, kind="memory", ref=type(hf).__name__)
    provenance = {
        "source": f"in-memory {type(hf).__name__}",
        "name_or_path": getattr(hf.config, "_name_or_path", ""),
    }
    model = _model(label, source, provenance, hf, tokenizer, causal, dev, torch_dtype, make_bridge)
    # transformers only switches the implementation of classes it can (not ones defined elsewhere)
    switchable = getattr(hf, "_can_set_attn_implementation", lambda: True)()
    model.attention_interface = model.attention_interface and (
        hf.config._attn_implementation == IMPLEMENTATION or bool(switchable)
    )
    return model


def _wrap_bridge(bridge, name: str | None, device: str) -> Model:
    """A Model over a TransformerBridge the caller holds: hooks engine only (see
    :func:`load_model`)."""
    hf = bridge.original_model
    label = name or getattr(hf.config, "_name_or_path", None) or type(hf).__name__
    param = next(hf.parameters())
    if device != "auto" and resolve_device(device) != param.device:
        raise HeadscopeError(
            f"The bridge is on {param.device}, not {device}; move it first or leave device='auto'."
        )
    source = Source(typed=label, kind="memory", ref="TransformerBridge")
    provenance = {
        "source": f"in-memory TransformerBridge over {type(hf).__name__}",
        "name_or_path": getattr(hf.config, "_name_or_path", ""),
    }
    model = _model(
        label,
        source,
        provenance,
        hf,
        bridge.tokenizer,
        _is_causal_lm(hf),
        param.device,
        param.dtype,
        None,
    )
    model._bridge = bridge
    model.attention_interface = False  # its attention modules are transformer-lens components
    return model


def _model(name, source, provenance, hf, tok, causal, dev, torch_dtype, make_bridge) -> Model:
    cfg = hf.config
    n_layers = int(cfg.num_hidden_layers)
    attn_layers = attention_layers(hf, n_layers)
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
    """Per layer, the largest ``|q - k|`` a query can attend over (None: no window), from the
    config.

    The rules transformers' masks follow (checked against each family's eager attention by the
    conformance suite, ``tests/oracles/conformance.py``):

    * ``layer_types`` naming ``sliding_attention`` layers: causal models see ``q - w < k <= q``
      (``w = sliding_window``), so the reach is ``w - 1``; ModernBERT's bidirectional local layers
      see ``|q - k| <= sliding_window`` (its config stores half the local window there);
    * no ``layer_types`` but a ``sliding_window`` (Mistral, Mixtral, Phi-3, Starcoder2): every
      layer;
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
        return tuple(
            int(cfg.window_size) - 1 if k == "local" else None for k in kinds[:n_layers]
        ) + (None,) * max(0, n_layers - len(kinds))
    if types is not None:
        if len(types) != n_layers:
            raise HeadscopeError(
                f"The config names {len(types)} layer types for {n_layers} layers."
            )
        if any(t == "sliding_attention" for t in types) and window is None:
            raise HeadscopeError("The config has sliding-attention layers but no sliding_window.")
        unknown = sorted({t for t in types} - {"sliding_attention", "full_attention"})
        if unknown:  # chunked or other masks: not modelled, so never scored as if they were full
            raise HeadscopeError(
                f"This model has {', '.join(unknown)} layers, whose mask "
                "headscope does not model (it knows full_attention and sliding_attention)."
            )
        reach = (
            int(window)
            if cfg.model_type == "modernbert"
            else (None if window is None else int(window) - 1)
        )
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
    return {
        "bos_id": int(bos),
        "sep_id": int(sep),
        "pad_id": int(pad),
        "eos_id": None if eos is None else int(eos),
        "special_ids": frozenset(special),
    }


def _dequantize_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint to an fp32 safetensors folder with its tokenizer."""
    from unittest import mock

    from transformers import AutoModelForCausalLM, AutoTokenizer

    # transformers' GGUF reader draws its own tqdm bar (not under its progress-bar switch), which
    # lands in a notebook's saved stderr on a machine's first load: silence it there
    try:
        from transformers import modeling_gguf_pytorch_utils as reader
    except ImportError:  # another layout: its bar shows, nothing else changes
        reader = None
    bar = (
        mock.patch.object(reader, "tqdm", lambda it, *a, **k: it)
        if reader is not None and hasattr(reader, "tqdm")
        else contextlib.nullcontext()
    )
    with _quiet_loading(), bar:
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
