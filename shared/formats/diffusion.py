"""The public masked-diffusion formats: LLaDA (``LLaDAModelLM``) and Dream (``DreamModel``).

Both are our backbone under other names:

- **LLaDA**: Llama blocks under OLMo's names (``model.transformer.wte``, ``blocks.N.q_proj``,
  ``attn_out``, ``ff_proj`` (the gate, through SiLU), ``up_proj``, ``ff_out`` (down), ``attn_norm``,
  ``ff_norm``, ``ln_f``, the head ``model.transformer.ff_out``), bidirectional attention, no logit
  shift, its ``[MASK]`` inside the vocabulary (126336 in LLaDA-8B, of 126464 rows).
- **Dream**: Qwen2 blocks under Qwen2's names (q/k/v biases), bidirectional attention, its
  ``[MASK]`` at 151666 (of 152064 rows), and shifted logits: the output at position i predicts
  token i + 1 (its ``generate`` rolls the logits right by one), which is our ``shift_logits``.

This project's diffusion models keep ``[MASK]`` in the last row (every objective and sampler
counts on it), so an import moves the checkpoint's ``[MASK]`` row there and the last row, which
no token uses in either model, to the ``[MASK]`` id: every real token keeps its id. An export
writes ``mask_token_id`` as our last row, so nothing moves on the way out, and a round trip is
the identity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from shared.config import ModelConfig
from shared.errors import ConfigError
from shared.formats.llama import check_fields, hf_weight_name, model_config_from_hf

# our names -> LLaDA's, inside each block
_LLADA_BLOCK = {
    "attention.wq": "q_proj",
    "attention.wk": "k_proj",
    "attention.wv": "v_proj",
    "attention.wo": "attn_out",
    "feed_forward.w1": "ff_proj",
    "feed_forward.w3": "up_proj",
    "feed_forward.w2": "ff_out",
    "attention_norm": "attn_norm",
    "ffn_norm": "ff_norm",
}
_LLADA_TOP = {
    "tok_embeddings.weight": "model.transformer.wte.weight",
    "norm.weight": "model.transformer.ln_f.weight",
    "output.weight": "model.transformer.ff_out.weight",
}
LLADA_MASK_ID = 126336  # LLaDA-8B's, when a config does not say
DREAM_MASK_ID = 151666


def llada_weight_name(name: str) -> str:
    """Our parameter name -> LLaDA's."""
    if name in _LLADA_TOP:
        return _LLADA_TOP[name]
    layer, _, rest = name.removeprefix("layers.").partition(".")
    module, _, kind = rest.rpartition(".")
    if not name.startswith("layers.") or module not in _LLADA_BLOCK:
        raise ValueError(f"parameter {name!r} has no LLaDA counterpart")
    return f"model.transformer.blocks.{layer}.{_LLADA_BLOCK[module]}.{kind}"


def our_name_from_llada(name: str) -> str:
    """LLaDA's parameter name -> ours (inverse of ``llada_weight_name``)."""
    for ours, theirs in _LLADA_TOP.items():
        if name == theirs:
            return ours
    prefix = "model.transformer.blocks."
    layer, _, rest = name.removeprefix(prefix).partition(".")
    module, _, kind = rest.rpartition(".")
    by_theirs = {theirs: ours for ours, theirs in _LLADA_BLOCK.items()}
    if not name.startswith(prefix) or module not in by_theirs:
        raise ValueError(f"LLaDA parameter {name!r} has no counterpart in our Transformer")
    return f"layers.{layer}.{by_theirs[module]}.{kind}"


LLADA_OPTIONAL_SIZES = (
    "embedding_size",
    "vocab_size",
    "n_kv_heads",
    "mlp_hidden_size",
    "mlp_ratio",
    "max_sequence_length",
)


def model_config_from_llada(config: dict[str, Any]) -> ModelConfig:
    """Our ``ModelConfig`` from a LLaDA ``config.json``; refuses the OLMo options LLaDA does not
    use (ALiBi, biases everywhere, LayerNorm, q/k norms, logit scaling, ...)."""
    required = {
        "block_type": "llama",
        "rope": True,
        "alibi": False,
        "layer_norm_type": "rms",
        "activation_type": "silu",
        "include_bias": False,
        "input_emb_norm": False,
        "scale_logits": False,
        "attention_layer_norm": False,
        "multi_query_attention": None,
    }
    for name, value in required.items():
        found = config.get(name, value)
        if found != value and not (name == "multi_query_attention" and found is False):
            raise ConfigError(f"LLaDA config {name}={found!r} is not supported (only {value!r})")
    check_fields(
        config,
        "llada",
        integers=("d_model", "n_heads", "n_layers"),
        optional=LLADA_OPTIONAL_SIZES,
    )
    if not (config.get("embedding_size") or config.get("vocab_size")):
        raise ConfigError("config.json has no 'vocab_size' or 'embedding_size'; is it complete?")
    heads = config["n_heads"]
    dim = config["d_model"]
    if dim % heads:
        raise ConfigError(f"d_model={dim} is not a multiple of n_heads={heads}")
    return ModelConfig(
        vocab_size=config.get("embedding_size") or config["vocab_size"],
        dim=dim,
        n_layers=config["n_layers"],
        n_heads=heads,
        n_kv_heads=config.get("n_kv_heads") or heads,
        hidden_dim=config.get("mlp_hidden_size") or config.get("mlp_ratio", 4) * dim,
        norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        rope_theta=float(config.get("rope_theta", 10000.0)),
        max_seq_len=config.get("max_sequence_length", 4096),
        tie_embeddings=bool(config.get("weight_tying", False)),
        attention_bias=bool(config.get("include_qkv_bias", False)),
    ).validate()


def llada_config_fields(cfg: ModelConfig, mask_id: int, eos_id: int, pad_id: int) -> dict:
    """A LLaDA ``config.json`` describing our backbone (``LLaDAModelLM``'s fields)."""
    unsupported = {
        f"a sliding window (sliding_window={cfg.sliding_window})": cfg.sliding_window,
        "shifted logits (shift_logits=true)": cfg.shift_logits,
        f"RoPE scaling (rope_scaling_factor={cfg.rope_scaling_factor})": cfg.rope_scaling_factor,
    }
    has = [name for name, value in unsupported.items() if value]
    if has:
        raise ConfigError(
            f"this model has {' and '.join(has)}, which LLaDA's format cannot express; only "
            "models without a sliding window, shifted logits or RoPE scaling export to it"
        )
    if cfg.dim // cfg.n_heads != cfg.head_dim:
        raise ConfigError(f"head_dim={cfg.head_dim} must be dim / n_heads for LLaDA")
    return {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "d_model": cfg.dim,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads,
        "n_layers": cfg.n_layers,
        "mlp_hidden_size": cfg.hidden_dim,
        "mlp_ratio": 4,
        "vocab_size": cfg.vocab_size,
        "embedding_size": cfg.vocab_size,
        "max_sequence_length": cfg.max_seq_len,
        "rope": True,
        "rope_full_precision": True,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.norm_eps,
        "layer_norm_type": "rms",
        "activation_type": "silu",
        "block_type": "llama",
        "alibi": False,
        "include_bias": False,
        "include_qkv_bias": cfg.attention_bias,
        "input_emb_norm": False,
        "scale_logits": False,
        "attention_layer_norm": False,
        "weight_tying": cfg.tie_embeddings,
        "mask_token_id": mask_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "attention_dropout": 0.0,
        "residual_dropout": 0.0,
        "embedding_dropout": 0.0,
        "init_device": "cpu",
    }


def model_config_from_dream(config: dict[str, Any]) -> ModelConfig:
    """Our ``ModelConfig`` from a Dream ``config.json``: Qwen2's shape, shifted logits."""
    as_qwen2 = dict(config, model_type="qwen2", use_sliding_window=False)
    return replace(model_config_from_hf(as_qwen2), shift_logits=True).validate()


@dataclass(frozen=True)
class Format:
    """How to read one checkpoint format: its objective, our config, the source's name for each
    of our tensors, and (diffusion formats) the id of its ``[MASK]`` row."""

    name: str
    objective: str
    model: ModelConfig
    source_name: Callable[[str], str]  # our parameter name -> the source's
    mask_id: int | None = None


def checkpoint_format(config: dict[str, Any]) -> Format:
    """The format of a ``config.json`` (by its model_type), or a clear refusal naming it."""
    model_type = config.get("model_type")
    if model_type in ("llama", "qwen2"):
        return Format(model_type, "ar", model_config_from_hf(config), hf_weight_name)
    if model_type == "llada":
        mask = config.get("mask_token_id") or LLADA_MASK_ID
        return Format("llada", "mdm", model_config_from_llada(config), llada_weight_name, mask)
    if model_type in ("Dream", "dream"):
        mask = config.get("mask_token_id") or DREAM_MASK_ID
        return Format("dream", "mdm", model_config_from_dream(config), hf_weight_name, mask)
    supported = "LlamaForCausalLM, Qwen2ForCausalLM, LLaDAModelLM, DreamModel"
    raise ConfigError(
        f"model_type={model_type!r} ({config.get('architectures')}) is not a supported format; "
        f"supported: {supported}"
    )
