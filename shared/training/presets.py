"""Named presets: a backbone shape plus the training and data settings that go with it.

A preset is plain data. Keys of "model" are ``ModelConfig`` fields, keys of "train" are
``TrainConfig`` fields; every value can be overridden (on the command line, every field is a
flag). The GPU presets share one GPT-2-small base and state only what differs from it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shared.config import ModelConfig
from shared.errors import ConfigError
from shared.training.config import TrainConfig

# GPT-2-small shapes (124M-class) for GPU users; the presets below override what differs.
GPT2_SMALL: dict[str, dict[str, Any]] = {
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
}


def gpt2_small(model: dict[str, Any] | None = None, **train: Any) -> dict[str, dict[str, Any]]:
    """The GPT-2-small base with ``model`` shape fields and ``train`` settings replaced."""
    return {"model": GPT2_SMALL["model"] | (model or {}), "train": GPT2_SMALL["train"] | train}


def kjv_preset(
    model: dict[str, Any],
    *,
    data: dict[str, Any],
    schedule: dict[str, Any],
    objective: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """A CPU preset on the built-in KJV corpus with a trained BPE tokenizer (unless ``data``
    says otherwise): its row layout and precision (``data``), and its learning rate, budget and
    validation (``schedule``, a cosine ending at a tenth of the peak)."""
    base = {"dataset": "kjv", "tokenizer": "bpe", "min_lr_ratio": 0.1}
    return {"model": model, "train": base | data | schedule | (objective or {})}


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # For tests: trains in seconds on one CPU thread.
    "tiny": kjv_preset(
        dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=64, max_seq_len=64),
        data=dict(tokenizer="byte", seq_len=32, batch_size=8, precision="fp32"),
        # 256 of the 5,186 validation rows: validating on the whole split took most of a tiny
        # run's time, and what tests compare needs a few thousand tokens, not 160,000
        schedule=dict(
            lr=3e-3, warmup_steps=5, max_steps=30, eval_every=10, eval_batches=2, val_max_rows=256
        ),
    ),
    # The whole comparison pipeline in about a minute (CI): tiny model, small BPE.
    "smoke": kjv_preset(
        dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=160, max_seq_len=64),
        data=dict(tokenizer_vocab_size=512, seq_len=64, batch_size=16, precision="fp32"),
        # 256 of the 1,073 validation rows: the pipeline's plumbing, not its numbers, is checked
        schedule=dict(
            lr=5e-3, warmup_steps=10, max_steps=150, eval_every=75, eval_batches=2, val_max_rows=256
        ),
    ),
    # The CPU main job, in the regime where both models learn (docs/studies/demo-regime.md): a
    # narrower model on BPE 512 with an 8-token attention window, which moves the MDM off its
    # unigram plateau within the budget (LLaDA's count estimator; the AR ignores it). The main
    # job trains it at budgets up to 320 steps (docs/studies/demo-budgets.md).
    "demo": kjv_preset(
        dict(
            dim=128,
            n_layers=4,
            n_heads=4,
            n_kv_heads=4,
            hidden_dim=352,
            max_seq_len=128,
            sliding_window=8,
        ),
        data=dict(tokenizer_vocab_size=512, seq_len=128, batch_size=32, precision="auto"),
        schedule=dict(lr=3e-3, warmup_steps=30, max_steps=320, eval_every=100, eval_batches=4),
        objective=dict(estimator="count"),
    ),
    # The demo before that study, kept because earlier measurements (benchmarks, the block-size
    # sweep) were taken with it: at this budget its MDM stays on the unigram plateau.
    "demo-d256": kjv_preset(
        dict(dim=256, n_layers=4, n_heads=4, n_kv_heads=4, hidden_dim=704, max_seq_len=128),
        data=dict(tokenizer_vocab_size=2048, seq_len=128, batch_size=32, precision="auto"),
        schedule=dict(lr=2e-3, warmup_steps=30, max_steps=400, eval_every=100, eval_batches=4),
    ),
    "small": gpt2_small(),
    # The same shapes on hub corpora (need internet): TinyStories and OpenWebText, GPT-2 BPE.
    "tinystories-small": gpt2_small(
        {"max_seq_len": 512},
        dataset="roneneldan/TinyStories",
        seq_len=512,
        eval_every=1000,
    ),
    "owt-small": gpt2_small(
        dataset="Skylion007/openwebtext",
        batch_size=512,
        warmup_steps=2500,
        max_steps=100000,
        eval_every=2000,
    ),
    # The LM1B protocol of the masked-diffusion literature (D3PM, MDLM, ...): bert-base-uncased
    # WordPiece, one sentence per padded row of 128 tokens. Needs internet for the dataset and the
    # tokenizer. MDLM trains 1M steps; 100k is a starting point. Bits-per-byte is approximate
    # with this tokenizer (see Tokenizer.bytes_exact); compare nats/token or perplexity instead.
    "lm1b-small": gpt2_small(
        {"hidden_dim": 3072, "max_seq_len": 128},
        dataset="lm1b",
        tokenizer="hf:bert-base-uncased",
        protocol="padded",
        seq_len=128,
        batch_size=512,
        lr=3e-4,
        warmup_steps=2500,
        max_steps=100000,
        eval_every=2000,
    ),
}


def get_preset(name: str) -> dict[str, dict[str, Any]]:
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r} is unknown; valid presets: {sorted(PRESETS)}")
    preset = PRESETS[name]
    return {"model": dict(preset["model"]), "train": dict(preset["train"])}


def split_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model fields, training fields) of a flat dict of settings."""
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    model = {k: v for k, v in overrides.items() if k in model_fields}
    train = {k: v for k, v in overrides.items() if k not in model_fields}
    return model, train


def resolve_config(preset_name: str, overrides: dict[str, Any]) -> tuple[ModelConfig, TrainConfig]:
    """A preset with ``overrides`` (model and training fields, flat) applied, validated."""
    preset = get_preset(preset_name)
    model_over, train_over = split_overrides(overrides)
    model_cfg = ModelConfig(**{**preset["model"], **model_over}).validate()
    train_cfg = TrainConfig(**{**preset["train"], **train_over}).validate()
    if train_cfg.seq_len > model_cfg.max_seq_len:
        raise ConfigError(
            f"seq_len={train_cfg.seq_len} exceeds max_seq_len="
            f"{model_cfg.max_seq_len}; raise --max-seq-len or lower --seq-len"
        )
    if model_cfg.shift_logits and train_cfg.objective != "mdm":
        raise ConfigError(
            f"shift_logits is a masked-diffusion layout (objective mdm); objective="
            f"{train_cfg.objective!r} reads each position's own output"
        )
    if model_cfg.time_conditioning and train_cfg.objective != "udm":
        raise ConfigError(
            f"time_conditioning feeds uniform-state diffusion its noise level (objective udm); "
            f"objective={train_cfg.objective!r} does not use it"
        )
    return model_cfg, train_cfg
