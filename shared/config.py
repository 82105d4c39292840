"""The backbone's shape (``ModelConfig``) and the type checks every config dataclass uses.

Presets (a shape plus the training settings that go with it) live in ``shared.training.presets``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from shared.errors import ConfigError

HF_TOKENIZER_PREFIX = "hf:"


class _TokenizerChoices:
    """Valid values of the ``tokenizer`` setting, for ``value in TOKENIZER_CHOICES`` checks.

    The built-in kinds are a fixed list, but ``"hf:<name>"`` (a Hugging Face hub tokenizer or a
    local tokenizer.json path) is open-ended, so membership is a rule rather than a list.
    """

    builtin = ("byte", "gpt2", "bpe")

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, str):
            return False
        if value.startswith(HF_TOKENIZER_PREFIX):
            return bool(value[len(HF_TOKENIZER_PREFIX) :].strip())
        return value in self.builtin

    def __repr__(self) -> str:
        # shown in "tokenizer=... is not one of <this>" errors
        return repr([*self.builtin, "hf:<hub name or tokenizer.json path>"])


TOKENIZER_CHOICES = _TokenizerChoices()

FIELD_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def check_field_types(config: Any) -> None:
    """Every field of a config dataclass holds a value of its declared type (ints are not bools,
    floats are finite), so later range checks compare numbers with numbers."""
    for field in dataclasses.fields(config):
        expected = FIELD_TYPES.get(str(field.type))
        value = getattr(config, field.name)
        if expected is None:
            continue
        if expected is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if ok and not math.isfinite(value):
                raise ConfigError(f"{field.name}={value!r} must be a finite number")
        elif expected is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, expected)
        if not ok:
            raise ConfigError(
                f"{field.name}={value!r} must be of type {expected.__name__}, "
                f"not {type(value).__name__}"
            )


_ROPE_SCALING_FIELDS = (
    "rope_scaling_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_len",
)


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the Llama-style backbone shared by every objective.

    ``vocab_size`` is the tokenizer's vocabulary; an objective may add rows (the diffusion objective
    adds one ``[MASK]`` id) through ``with_vocab``.
    """

    vocab_size: int = 258
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4
    hidden_dim: int = 704
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 256
    tie_embeddings: bool = False
    sliding_window: int = 0  # 0 = full attention; otherwise each query sees this many keys
    # Features of imported checkpoints, off by default (and then left out of ``to_dict``, so a
    # config reads as it did before they existed):
    attention_bias: bool = False  # biases on the q, k and v projections (Qwen2, Dream)
    # Llama-3's rescaling of long RoPE wavelengths: 0 = off; otherwise the factor by which
    # wavelengths longer than rope_original_max_len / rope_low_freq_factor are stretched
    rope_scaling_factor: float = 0.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    # The output at position i predicts token i + 1 (Dream, DiffuLLaMA): a diffusion model
    # initialised from an AR model keeps the AR head's alignment. Masked diffusion only.
    shift_logits: bool = False
    # The diffusion time t is fed to the network (an embedding added to every position's input),
    # as uniform-state diffusion models (UDLM, Duo) do: a uniform-noised token does not say
    # whether it is noise, so the noise level is information the input lacks. udm only.
    time_conditioning: bool = False

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def with_vocab(self, vocab_size: int) -> ModelConfig:
        return dataclasses.replace(self, vocab_size=vocab_size)

    def validate(self) -> ModelConfig:
        check_field_types(self)
        positive = (
            "vocab_size",
            "dim",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "hidden_dim",
            "max_seq_len",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        if self.dim % self.n_heads:
            raise ConfigError(f"n_heads={self.n_heads} must divide dim={self.dim}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise ConfigError(
                f"dim/n_heads={self.head_dim} must be even (RoPE rotates pairs of channels); "
                f"got dim={self.dim}, n_heads={self.n_heads}"
            )
        if not (self.norm_eps > 0):
            raise ConfigError(f"norm_eps={self.norm_eps!r} must be > 0")
        if not (self.rope_theta > 0):
            raise ConfigError(f"rope_theta={self.rope_theta!r} must be > 0")
        if self.rope_scaling_factor:
            if not (self.rope_scaling_factor >= 1):
                raise ConfigError(
                    f"rope_scaling_factor={self.rope_scaling_factor!r} must be 0 (off) or >= 1"
                )
            if not (0 < self.rope_low_freq_factor < self.rope_high_freq_factor):
                raise ConfigError(
                    f"rope_low_freq_factor={self.rope_low_freq_factor!r} and "
                    f"rope_high_freq_factor={self.rope_high_freq_factor!r} must satisfy "
                    "0 < low < high"
                )
            if self.rope_original_max_len < 1:
                raise ConfigError(
                    f"rope_original_max_len={self.rope_original_max_len!r} must be positive"
                )
        if not isinstance(self.sliding_window, int) or self.sliding_window < 0:
            raise ConfigError(
                f"sliding_window={self.sliding_window!r} must be 0 (off) or a positive integer"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name in ("attention_bias", "shift_logits", "time_conditioning"):
            if not data[name]:
                del data[name]
        if not self.rope_scaling_factor:
            for name in _ROPE_SCALING_FIELDS:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown model config fields {unknown}; valid: {sorted(known)}")
        return cls(**data)
