"""The Hugging Face Llama and Qwen2 formats: weight names and config fields, both ways.

``LlamaForCausalLM`` is our backbone module for module (``tests/test_model.py`` checks the
logits); ``Qwen2ForCausalLM`` is the same with biases on the q, k and v projections, which the
backbone has as ``attention_bias``. Converting is a renaming of weights plus a config.
"""

from __future__ import annotations

from typing import Any

from shared.config import ModelConfig
from shared.errors import ConfigError

# our module names -> Llama's, inside each transformer block
_BLOCK_NAMES = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# model_type -> the architecture class transformers names it by
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def hf_weight_name(name: str) -> str:
    """Our parameter name -> the ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` one."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    if not name.startswith("layers."):
        raise ValueError(f"parameter {name!r} has no Llama counterpart")
    for ours, theirs in _BLOCK_NAMES.items():
        name = name.replace(f".{ours}.", f".{theirs}.")
    return "model." + name


def our_weight_name(name: str) -> str:
    """The Llama / Qwen2 parameter name -> ours (inverse of ``hf_weight_name``)."""
    for ours, theirs in _TOP_NAMES.items():
        if name == theirs:
            return ours
    if not name.startswith("model.layers."):
        raise ValueError(f"Llama parameter {name!r} has no counterpart in our Transformer")
    name = name.removeprefix("model.")
    for ours, theirs in _BLOCK_NAMES.items():
        name = name.replace(f".{theirs}.", f".{ours}.")
    return name


def rope_fields(cfg: ModelConfig) -> dict[str, Any]:
    """The ``rope_parameters`` entry (transformers 5) describing our RoPE."""
    if not cfg.rope_scaling_factor:
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    return {
        "rope_type": "llama3",
        "rope_theta": cfg.rope_theta,
        "factor": cfg.rope_scaling_factor,
        "low_freq_factor": cfg.rope_low_freq_factor,
        "high_freq_factor": cfg.rope_high_freq_factor,
        "original_max_position_embeddings": cfg.rope_original_max_len,
    }


def llama_config_fields(cfg: ModelConfig) -> dict[str, Any]:
    """``LlamaConfig`` keyword arguments describing our backbone (no special-token ids)."""
    if cfg.sliding_window:
        raise ValueError(
            f"sliding_window={cfg.sliding_window}: Llama has no sliding-window attention, so "
            "only models with sliding_window=0 can be exported"
        )
    if cfg.attention_bias:
        raise ValueError(
            "attention_bias=True (q/k/v biases, as in Qwen2) has no Llama counterpart: Llama's "
            "attention_bias also puts a bias on the output projection"
        )
    return dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        rms_norm_eps=cfg.norm_eps,
        max_position_embeddings=cfg.max_seq_len,
        tie_word_embeddings=cfg.tie_embeddings,
        attention_bias=False,
        mlp_bias=False,
        rope_parameters=rope_fields(cfg),
    )


def _rope_settings(config: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig RoPE fields from a config's ``rope_parameters`` (transformers 5) or the older
    ``rope_scaling`` + ``rope_theta``."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    if rope_type == "default":
        return {"rope_theta": theta}
    if rope_type == "llama3":
        return {
            "rope_theta": theta,
            "rope_scaling_factor": float(rope["factor"]),
            "rope_low_freq_factor": float(rope["low_freq_factor"]),
            "rope_high_freq_factor": float(rope["high_freq_factor"]),
            "rope_original_max_len": int(rope["original_max_position_embeddings"]),
        }
    raise ConfigError(f"rope_type={rope_type!r} is not supported (only 'default' and 'llama3')")


# the sizes a Llama or Qwen2 config.json must give
LLAMA_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)


def check_fields(
    config: dict[str, Any],
    format_name: str,
    integers: tuple[str, ...],
    optional: tuple[str, ...] = (),
    numbers: tuple[str, ...] = (),
) -> None:
    """Refuse a config.json that lacks a field the conversion reads or holds one of another type,
    naming the field (``integers`` and ``numbers`` are required, ``optional`` integers may be
    absent or null); otherwise the conversion fails deep inside with a KeyError or TypeError."""
    for name in (*integers, *numbers):
        if name not in config:
            raise ConfigError(
                f"config.json has no {name!r}, which a {format_name} config gives; is the file "
                "complete?"
            )
    for name in (*integers, *optional):
        value = config.get(name)
        if value is None and name in optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"config.json: {name}={value!r} must be a positive integer")
    for name in numbers:
        value = config[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"config.json: {name}={value!r} must be a number")


def model_config_from_hf(config: dict[str, Any]) -> ModelConfig:
    """Our ``ModelConfig`` from a Llama or Qwen2 ``config.json``; refuses what we do not have."""
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ConfigError(
            f"model_type={model_type!r} ({config.get('architectures')}) is not a supported "
            f"autoregressive format; supported: {sorted(ARCHITECTURES.values())}"
        )
    expected: dict[str, Any] = {"hidden_act": "silu"}
    if model_type == "llama":
        expected |= {"attention_bias": False, "mlp_bias": False}
    else:
        # Qwen2's sliding window is off unless use_sliding_window says otherwise
        expected |= {"use_sliding_window": False}
    for name, value in expected.items():
        if config.get(name, value) != value:
            raise ConfigError(f"{name}={config[name]!r} is not supported (only {value!r})")
    check_fields(
        config,
        model_type,
        integers=LLAMA_SIZES,
        optional=("num_key_value_heads", "head_dim"),
        numbers=("rms_norm_eps",),
    )
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    if head_dim * heads != config["hidden_size"]:
        raise ConfigError(
            f"head_dim={head_dim} x num_attention_heads={heads} != hidden_size="
            f"{config['hidden_size']}: our attention needs head_dim = hidden_size / heads"
        )
    return ModelConfig(
        vocab_size=config["vocab_size"],
        dim=config["hidden_size"],
        n_layers=config["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=config.get("num_key_value_heads") or heads,
        hidden_dim=config["intermediate_size"],
        norm_eps=float(config["rms_norm_eps"]),
        max_seq_len=config["max_position_embeddings"],
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2",
        **_rope_settings(config),
    ).validate()
