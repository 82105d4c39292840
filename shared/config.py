"""Model configuration and named presets.

A preset is plain data: the backbone shape (``ModelConfig``) plus the training and data settings
that go with it. ``train.py`` turns every field into a command-line flag, so any preset value can
be overridden without editing code.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A user setting is invalid; the message names the field, the value and what is valid."""


class ResourceUnavailableError(RuntimeError):
    """Something the run needs cannot be reached here (a hub dataset offline, a missing wheel);
    the message says what to install or use instead."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupted."""


# What the command lines report as one line and exit status 2: bad values (ConfigError is a
# ValueError), missing files, unusable checkpoints, unreachable resources. Anything else is a bug
# and keeps its traceback.
USER_ERRORS = (ValueError, FileNotFoundError, CheckpointError, ResourceUnavailableError)


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

_FIELD_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def check_field_types(config: Any) -> None:
    """Every field of a config dataclass holds a value of its declared type (ints are not bools,
    floats are finite), so later range checks compare numbers with numbers."""
    for field in dataclasses.fields(config):
        expected = _FIELD_TYPES.get(str(field.type))
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
        if not isinstance(self.sliding_window, int) or self.sliding_window < 0:
            raise ConfigError(
                f"sliding_window={self.sliding_window!r} must be 0 (off) or a positive integer"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown model config fields {unknown}; valid: {sorted(known)}")
        return cls(**data)


# Presets: model shape plus the training/data settings that make sense for it. Keys of "train"
# are TrainConfig field names (see train.py); every one can be overridden on the command line.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # For tests: trains in seconds on one CPU thread.
    "tiny": {
        "model": dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=64, max_seq_len=64),
        "train": dict(
            dataset="kjv",
            tokenizer="byte",
            seq_len=32,
            batch_size=8,
            lr=3e-3,
            warmup_steps=5,
            max_steps=30,
            eval_every=10,
            eval_batches=2,
            min_lr_ratio=0.1,
            precision="fp32",
        ),
    },
    # The whole comparison pipeline in about a minute (CI): tiny model, small BPE.
    "smoke": {
        "model": dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=160, max_seq_len=64),
        "train": dict(
            dataset="kjv",
            tokenizer="bpe",
            tokenizer_vocab_size=512,
            seq_len=64,
            batch_size=16,
            lr=5e-3,
            warmup_steps=10,
            max_steps=150,
            eval_every=75,
            eval_batches=2,
            min_lr_ratio=0.1,
            precision="fp32",
        ),
    },
    # The CPU main job: a few minutes per model on 2 cores, enough to pick up the corpus's style.
    "demo": {
        "model": dict(
            dim=256, n_layers=4, n_heads=4, n_kv_heads=4, hidden_dim=704, max_seq_len=128
        ),
        "train": dict(
            dataset="kjv",
            tokenizer="bpe",
            tokenizer_vocab_size=2048,
            seq_len=128,
            batch_size=32,
            lr=2e-3,
            warmup_steps=30,
            max_steps=400,
            eval_every=100,
            eval_batches=4,
            min_lr_ratio=0.1,
            precision="auto",
        ),
    },
    # GPT-2-small shapes (124M-class) for GPU users.
    "small": {
        "model": dict(
            dim=768,
            n_layers=12,
            n_heads=12,
            n_kv_heads=12,
            hidden_dim=2048,
            max_seq_len=1024,
            tie_embeddings=True,
        ),
        "train": dict(
            dataset="kjv",
            tokenizer="gpt2",
            seq_len=1024,
            batch_size=256,
            lr=6e-4,
            warmup_steps=500,
            max_steps=20000,
            eval_every=500,
            eval_batches=40,
            min_lr_ratio=0.1,
            precision="auto",
        ),
    },
    # GPT-2-small shapes on hub corpora (need internet): TinyStories and OpenWebText, GPT-2 BPE.
    "tinystories-small": {
        "model": dict(
            dim=768,
            n_layers=12,
            n_heads=12,
            n_kv_heads=12,
            hidden_dim=2048,
            max_seq_len=512,
            tie_embeddings=True,
        ),
        "train": dict(
            dataset="roneneldan/TinyStories",
            tokenizer="gpt2",
            seq_len=512,
            batch_size=256,
            lr=6e-4,
            warmup_steps=500,
            max_steps=20000,
            eval_every=1000,
            eval_batches=40,
            min_lr_ratio=0.1,
            precision="auto",
        ),
    },
    "owt-small": {
        "model": dict(
            dim=768,
            n_layers=12,
            n_heads=12,
            n_kv_heads=12,
            hidden_dim=2048,
            max_seq_len=1024,
            tie_embeddings=True,
        ),
        "train": dict(
            dataset="Skylion007/openwebtext",
            tokenizer="gpt2",
            seq_len=1024,
            batch_size=512,
            lr=6e-4,
            warmup_steps=2500,
            max_steps=100000,
            eval_every=2000,
            eval_batches=40,
            min_lr_ratio=0.1,
            precision="auto",
        ),
    },
    # The LM1B protocol of the masked-diffusion literature (D3PM, MDLM, ...): bert-base-uncased
    # WordPiece, one sentence per padded row of 128 tokens. Needs internet for the dataset and the
    # tokenizer. MDLM trains 1M steps; 100k is a starting point. Bits-per-byte is approximate
    # with this tokenizer (see Tokenizer.bytes_exact); compare nats/token or perplexity instead.
    "lm1b-small": {
        "model": dict(
            dim=768,
            n_layers=12,
            n_heads=12,
            n_kv_heads=12,
            hidden_dim=3072,
            max_seq_len=128,
            tie_embeddings=True,
        ),
        "train": dict(
            dataset="lm1b",
            tokenizer="hf:bert-base-uncased",
            protocol="padded",
            seq_len=128,
            batch_size=512,
            lr=3e-4,
            warmup_steps=2500,
            max_steps=100000,
            eval_every=2000,
            eval_batches=40,
            min_lr_ratio=0.1,
            precision="auto",
        ),
    },
}


def get_preset(name: str) -> dict[str, dict[str, Any]]:
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r} is unknown; valid presets: {sorted(PRESETS)}")
    preset = PRESETS[name]
    return {"model": dict(preset["model"]), "train": dict(preset["train"])}
