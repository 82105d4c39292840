"""One training entry for every objective, run plainly or under ``accelerate launch``.

    python train.py --objective ar  --preset demo --out runs/demo-ar
    python train.py --objective mdm --preset demo --out runs/demo-mdm
    python train.py --objective bd --block-size 4 --preset demo --out runs/demo-bd
    accelerate launch train.py --objective mdm --preset small --out runs/small-mdm
    python train.py --resume runs/demo-mdm --max-steps 1200    # continue a run

``--batch-size`` is the *global* number of rows per optimizer step, split over processes and
gradient-accumulation micro-steps, so a run gives the same result on 1 or N processes. The rows
of step s and the diffusion noise of step s are pure functions of (seed, s): resuming needs only
the step number plus model/optimizer state, and continues bit-exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shared.config import (
    TOKENIZER_CHOICES,
    USER_ERRORS,
    ConfigError,
    ModelConfig,
    check_field_types,
    get_preset,
)
from shared.faults import StopRequest, fault_active
from shared.objective import OBJECTIVES, loss_positions, objective_for_run, slice_noise

DEFAULT_CACHE = Path(os.environ.get("DUOLM_CACHE", Path.home() / ".cache" / "duolm"))


@dataclass(frozen=True)
class TrainConfig:
    objective: str = "ar"
    # data
    dataset: str = "kjv"
    val_dataset: str = ""  # empty: hold out part of `dataset`
    text_field: str = "text"
    tokenizer: str = "bpe"
    tokenizer_vocab_size: int = 2048
    protocol: str = "packed"
    seq_len: int = 128
    # optimisation
    batch_size: int = 32  # global rows per optimizer step
    grad_accum: int = 1
    lr: float = 1e-3
    lr_schedule: str = "cosine"
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    precision: str = "auto"  # auto: bf16 where the hardware runs it fast, else fp32
    # budget: max_flops, else max_tokens, else max_steps decides the number of steps
    max_steps: int = 1000
    max_tokens: int = 0
    max_flops: float = 0.0
    # data-constrained training: keep only the first rows holding this many unique training
    # tokens (0 = all), and/or train for this many passes over them (a budget, like max_tokens)
    unique_tokens: int = 0
    epochs: float = 0.0
    stop_after_steps: int = 0  # end this invocation early (with a checkpoint); 0 = run to the end
    # diffusion
    schedule: str = "linear"
    t_eps: float = 1e-3
    estimator: str = (
        "time"  # "time": Bernoulli masks at t, weight -alpha'/(1-alpha); "count": LLaDA
    )
    # block diffusion ("bd"): blocks of block_size positions tile the whole row (BOS included),
    # so seq_len % block_size == 0; 0 = unset (only "bd" uses it). Per-block t is drawn from
    # [t_eps, t_max]; t_max < 1 is BD3-LM's clipped schedule, a training-variance device that
    # changes what the training loss estimates; validation always uses the full range [t_eps, 1].
    block_size: int = 0
    t_max: float = 1.0
    # evaluation, logging, checkpoints
    eval_every: int = 200
    eval_batches: int = 8  # global batches per periodic evaluation; 0 = the whole split
    eval_seed: int = 1234
    log_every: int = 10
    checkpoint_every: int = 0  # 0: at every evaluation and at the end
    keep_checkpoints: int = 3  # newest kept, plus the best by periodic validation loss
    max_bad_steps: int = 5  # consecutive steps with non-finite loss/gradients before stopping
    seed: int = 0
    num_threads: int = 0  # torch CPU threads; 0 leaves torch's default
    peak_tflops: float = 0.0  # hardware peak for MFU; 0 = look up or measure
    log_with: str = ""  # comma-separated accelerate trackers, e.g. "tensorboard" or "wandb"
    cache_dir: str = str(DEFAULT_CACHE)

    def validate(self) -> TrainConfig:
        check_field_types(self)
        choices = {
            "objective": sorted(OBJECTIVES),
            "protocol": ["packed", "padded"],
            "lr_schedule": ["cosine", "constant"],
            "precision": ["auto", "fp32", "bf16"],
            "schedule": ["linear", "cosine"],
            "estimator": ["time", "count"],
            "tokenizer": TOKENIZER_CHOICES,
        }
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {valid}")
        positive = (
            "seq_len",
            "batch_size",
            "grad_accum",
            "eval_every",
            "log_every",
            "max_bad_steps",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 1")
        non_negative = (
            "unique_tokens",
            "epochs",
            "warmup_steps",
            "max_steps",
            "max_tokens",
            "max_flops",
            "stop_after_steps",
            "eval_batches",
            "checkpoint_every",
            "keep_checkpoints",
            "block_size",
            "num_threads",
            "peak_tflops",
            "weight_decay",
            "grad_clip",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        if self.seq_len < 4:
            raise ConfigError(f"seq_len={self.seq_len} must be >= 4")
        if not self.lr > 0:
            raise ConfigError(f"lr={self.lr!r} must be > 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio={self.min_lr_ratio!r} must be in [0, 1]")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be in [0, 1)")
        if not 0 <= self.t_eps < 1:
            raise ConfigError(f"t_eps={self.t_eps!r} must be in [0, 1)")
        if not self.t_eps < self.t_max <= 1:
            raise ConfigError(f"t_max={self.t_max!r} must be in (t_eps={self.t_eps}, 1]")
        if self.objective == "bd" and (self.block_size < 1 or self.seq_len % self.block_size):
            valid = [d for d in range(1, self.seq_len + 1) if self.seq_len % d == 0]
            raise ConfigError(
                f"block_size={self.block_size} must divide seq_len={self.seq_len} for "
                f"objective='bd' (blocks tile the whole row, BOS included); valid: {valid}"
            )
        budgets = [name for name in ("max_tokens", "max_flops", "epochs") if getattr(self, name)]
        if len(budgets) > 1:
            raise ConfigError(f"set only one of {budgets} (each is a budget)")
        if not (self.max_steps or budgets):
            raise ConfigError(
                "no budget: set max_steps, max_tokens, max_flops or epochs to a value > 0"
            )
        return self


class TrainingDiverged(RuntimeError):
    """Too many consecutive steps had a non-finite loss or gradient."""


# Fields whose change makes a checkpoint a different experiment: resuming across them refuses.
IDENTITY_FIELDS = (
    "objective",
    "dataset",
    "val_dataset",
    "text_field",
    "tokenizer",
    "tokenizer_vocab_size",
    "protocol",
    "seq_len",
    "schedule",
    "block_size",  # block diffusion: the block size is part of what the model learns
    "seed",
)


# ---------------------------------------------------------------- command line


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


FIELD_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def build_parser(preset: dict[str, dict[str, Any]] | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Train the shared backbone under an objective (ar, mdm or bd).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--preset", default="demo", help="named preset (shared/config.py)")
    parser.add_argument(
        "--out", default=None, help="run directory (default: runs/<preset>-<objective>)"
    )
    parser.add_argument(
        "--resume", default=None, help="run or checkpoint directory to continue from"
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume even if identity fields (objective, data, tokenizer, shape) "
        "differ from the checkpoint's",
    )
    preset = preset or {"model": {}, "train": {}}
    groups = (("model", ModelConfig, preset["model"]), ("training", TrainConfig, preset["train"]))
    for title, cls, values in groups:
        group = parser.add_argument_group(f"{title} (defaults shown are the preset's)")
        for field in dataclasses.fields(cls):
            if field.name == "vocab_size":
                continue  # set by the tokenizer and objective
            kind = FIELD_TYPES[str(field.type)]
            default = values.get(field.name, field.default)
            group.add_argument(
                _flag(field.name),
                dest=field.name,
                default=argparse.SUPPRESS,
                type=_parse_bool if kind is bool else kind,
                metavar=kind.__name__.upper(),
                help=f"(default: {default})",
            )
    return parser


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Returns the parsed arguments and the explicitly given config overrides."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default="demo")
    known, _ = pre.parse_known_args(argv)
    try:
        preset = get_preset(known.preset)
    except ConfigError:
        preset = None  # reported below by resolve_config, after --help had its chance
    args = build_parser(preset).parse_args(argv)
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    overrides = {k: v for k, v in vars(args).items() if k in model_fields | train_fields}
    return args, overrides


def split_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    model = {k: v for k, v in overrides.items() if k in model_fields}
    train = {k: v for k, v in overrides.items() if k not in model_fields}
    return model, train


def resolve_config(preset_name: str, overrides: dict[str, Any]) -> tuple[ModelConfig, TrainConfig]:
    preset = get_preset(preset_name)
    model_over, train_over = split_overrides(overrides)
    model_cfg = ModelConfig(**{**preset["model"], **model_over}).validate()
    train_cfg = TrainConfig(**{**preset["train"], **train_over}).validate()
    if train_cfg.seq_len > model_cfg.max_seq_len:
        raise ConfigError(
            f"seq_len={train_cfg.seq_len} exceeds max_seq_len="
            f"{model_cfg.max_seq_len}; raise --max-seq-len or lower --seq-len"
        )
    return model_cfg, train_cfg


def config_differences(
    saved: dict[str, Any], current: dict[str, Any], fields: tuple[str, ...]
) -> list[str]:
    """Lines naming each of ``fields`` that differs; a field the checkpoint predates (absent from
    its config) is not compared."""
    return [
        f"{name}: checkpoint {saved[name]!r} vs now {current.get(name)!r}"
        for name in fields
        if name in saved and saved[name] != current.get(name)
    ]


def parallel_layout(accelerator) -> str:
    """How training is spread over processes, for logs and run summaries: "single process",
    "DDP" (replicated weights), "FSDP1" or "FSDP2" (sharded weights)."""
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP:
        return f"FSDP{accelerator.state.fsdp_plugin.fsdp_version}"
    if kind == DistributedType.NO:
        return "single process"
    return "DDP"


def resumed_config(
    saved: dict[str, Any], overrides: dict[str, Any], allow_change: bool
) -> tuple[ModelConfig, TrainConfig]:
    """The checkpoint's config with only the flags typed now applied on top. Changing a field that
    defines the experiment (objective, data, tokenizer, model shape) refuses unless allowed."""
    model_over, train_over = split_overrides(overrides)
    model_cfg = ModelConfig(**{**saved["model_config"], **model_over}).validate()
    train_cfg = TrainConfig(**{**saved["train_config"], **train_over}).validate()
    shape_fields = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name != "vocab_size")
    changed = config_differences(
        {**saved["model_config"], **saved["train_config"]},
        {**model_cfg.to_dict(), **dataclasses.asdict(train_cfg)},
        IDENTITY_FIELDS + shape_fields,
    )
    if changed and not allow_change:
        raise ConfigError(
            "refusing to resume: these fields differ from the checkpoint's "
            "(pass --allow-config-change to accept):\n  " + "\n  ".join(changed)
        )
    return model_cfg, train_cfg


# ---------------------------------------------------------------- schedules and budgets


def lr_multiplier(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Linear warmup to 1, then cosine decay to ``min_lr_ratio`` (or constant)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def total_steps_for(cfg: TrainConfig, flops_per_step: float, n_rows: int) -> int:
    tokens_per_step = cfg.batch_size * cfg.seq_len
    if cfg.epochs:
        return max(1, math.ceil(cfg.epochs * n_rows / cfg.batch_size))
    if cfg.max_flops:
        return max(1, math.ceil(cfg.max_flops / flops_per_step))
    if cfg.max_tokens:
        return max(1, math.ceil(cfg.max_tokens / tokens_per_step))
    return cfg.max_steps


# Dense bf16 peak of common accelerators (FLOP/s), for MFU.
GPU_PEAK_BF16 = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "A10G": 125e12,
    "L4": 121e12,
    "4090": 165e12,
    "3090": 71e12,
    "V100": 125e12,
    "T4": 65e12,
}


def peak_flops(
    device: torch.device, dtype: torch.dtype, override_tflops: float
) -> tuple[float, str]:
    """Hardware peak FLOP/s and where the number came from."""
    if override_tflops:
        return override_tflops * 1e12, "--peak-tflops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in GPU_PEAK_BF16.items():
            if key in name:
                return (value if dtype == torch.bfloat16 else value / 4), f"table ({name})"
    # Unknown hardware: measure a large matmul in the training dtype (an attainable peak).
    size = 1024
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b
    repeats, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.3:
        a @ b
        repeats += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start), "measured matmul"


# ---------------------------------------------------------------- training


def peak_memory(device: torch.device) -> dict[str, Any]:
    """Peak memory of this process: allocated by torch on a GPU, resident set size on a CPU."""
    if device.type == "cuda":
        return {
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
            "peak_memory_source": "torch.cuda.max_memory_allocated",
        }
    import resource

    # ru_maxrss is in kilobytes on Linux (bytes on macOS)
    scale = 1 if sys.platform == "darwin" else 1024
    return {
        "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale,
        "peak_memory_source": "process max RSS",
    }


def batch_generator(seed: int, step: int) -> torch.Generator:
    from eval.likelihood import noise_generator

    return noise_generator(seed, step)


class Metrics:
    """JSON lines on disk, plus accelerate trackers when configured."""

    def __init__(self, path: Path, accelerator):
        self.path, self.accelerator = path, accelerator

    def log(self, record: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        self.accelerator.log(numeric, step=record.get("step"))


def bf16_is_fast() -> bool:
    """bf16 autocast pays off on CUDA with bf16 support and on CPUs with bf16 instructions
    (AVX512-BF16 / AMX); elsewhere it is emulated and slower than fp32."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in checks)


def _make_accelerator(cfg: TrainConfig, out: Path):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    # A fresh state each call, so train() can run more than once in one process (tests, sweeps).
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    cuda = torch.cuda.is_available()
    mixed = "bf16" if cfg.precision == "bf16" else "no"
    if cfg.precision == "auto":
        mixed = "bf16" if bf16_is_fast() else "no"
    trackers = [t for t in cfg.log_with.split(",") if t]
    return Accelerator(
        cpu=not cuda, mixed_precision=mixed, log_with=trackers or None, project_dir=str(out)
    )


def train(argv: list[str] | None = None) -> dict[str, Any]:
    """Run training; returns the final summary (also written to ``<out>/final.json``)."""
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    from eval.likelihood import evaluate_rows
    from shared import checkpoint as ckpt
    from shared.data.corpus import EpochSampler, load_corpus, protocol_record, tokenize_corpus
    from shared.model import Transformer, flops_per_token
    from shared.tokenizer import Tokenizer, build_tokenizer

    args, overrides = parse_args(argv)
    resume_from: Path | None = None
    if args.resume:
        resume_from = ckpt.resolve_checkpoint(Path(args.resume))
        saved = ckpt.read_state(resume_from)
        model_cfg, train_cfg = resumed_config(saved, overrides, args.allow_config_change)
        out = Path(args.out) if args.out else resume_from.parent.parent
    else:
        model_cfg, train_cfg = resolve_config(args.preset, overrides)
        out = Path(args.out) if args.out else Path("runs") / f"{args.preset}-{train_cfg.objective}"
    if train_cfg.num_threads:
        torch.set_num_threads(train_cfg.num_threads)

    accelerator = _make_accelerator(train_cfg, out)
    rank, world = accelerator.process_index, accelerator.num_processes
    log = accelerator.print
    layout = parallel_layout(accelerator)
    if layout == "FSDP1":
        raise ConfigError(
            "FSDP version 1 is not supported (its flat parameters do not fit this trainer's "
            "optimizer groups); set fsdp_version: 2 in the accelerate config, as "
            "configs/accelerate/fsdp_1node.yaml does"
        )
    if train_cfg.batch_size % (world * train_cfg.grad_accum):
        raise ConfigError(
            f"batch_size={train_cfg.batch_size} must be divisible by processes x "
            f"grad_accum = {world} x {train_cfg.grad_accum}"
        )
    micro_batch = train_cfg.batch_size // (world * train_cfg.grad_accum)
    set_seed(train_cfg.seed)
    cache_dir = Path(train_cfg.cache_dir)

    # Data: the main process tokenizes and fills the cache; the others then read it.
    with accelerator.main_process_first():
        if resume_from is not None:
            tokenizer = Tokenizer.load(resume_from / "tokenizer")
        corpus = load_corpus(
            train_cfg.dataset,
            val_dataset=train_cfg.val_dataset or None,
            text_field=train_cfg.text_field,
        )
        if resume_from is None:
            tokenizer = build_tokenizer(
                train_cfg.tokenizer,
                vocab_size=train_cfg.tokenizer_vocab_size,
                train_texts=corpus.train,
                corpus_fingerprint=corpus.fingerprint,
                cache_dir=cache_dir,
            )
        splits = tokenize_corpus(
            corpus,
            tokenizer,
            protocol=train_cfg.protocol,
            seq_len=train_cfg.seq_len,
            cache_dir=cache_dir,
        )
    data_record = protocol_record(
        corpus, tokenizer, splits, protocol=train_cfg.protocol, seq_len=train_cfg.seq_len
    )
    if (
        resume_from is not None
        and saved["data"]["corpus_fingerprint"] != corpus.fingerprint
        and not args.allow_config_change
    ):
        raise ConfigError(
            "refusing to resume: the corpus differs from the checkpoint's "
            f"(fingerprint {saved['data']['corpus_fingerprint']} vs "
            f"{corpus.fingerprint})"
        )

    run_config = dataclasses.asdict(train_cfg)
    objective = objective_for_run(
        train_cfg.objective, run_config, tokenizer, full_noise_range=False
    )
    model_cfg = model_cfg.with_vocab(objective.model_vocab_size(tokenizer.vocab_size)).validate()
    # Validation estimates the NELBO over the full noise range even when training clips it.
    eval_objective = objective_for_run(train_cfg.objective, run_config, tokenizer)
    torch.manual_seed(train_cfg.seed)
    model = Transformer(model_cfg)
    n_parameters = model.num_parameters()  # before FSDP, if used, shards the parameters
    tokens_per_step = train_cfg.batch_size * train_cfg.seq_len
    flops_token = flops_per_token(model_cfg, train_cfg.seq_len)
    if train_cfg.objective == "bd":
        # Block diffusion trains on [noisy row, clean row]: two tokens through the network per
        # data token, over a 2L context, so a FLOP budget buys it half the steps.
        flops_token = 2 * flops_per_token(model_cfg, 2 * train_cfg.seq_len)
    train_rows = splits["train"].tokens
    if train_cfg.unique_tokens:
        # Loss tokens per row are seq_len - 1 (position 0 is BOS); keep whole rows, in order.
        keep = math.ceil(train_cfg.unique_tokens / (train_cfg.seq_len - 1))
        if keep > len(train_rows):
            raise ConfigError(
                f"unique_tokens={train_cfg.unique_tokens} exceeds the {len(train_rows)} rows "
                f"x {train_cfg.seq_len - 1} tokens of the training split"
            )
        train_rows = train_rows[:keep]
    total_steps = total_steps_for(train_cfg, flops_token * tokens_per_step, len(train_rows))

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": train_cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=train_cfg.lr,
        betas=(train_cfg.beta1, train_cfg.beta2),
        fused=torch.cuda.is_available() or None,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_multiplier(
            s,
            warmup_steps=train_cfg.warmup_steps,
            total_steps=total_steps,
            schedule=train_cfg.lr_schedule,
            min_lr_ratio=train_cfg.min_lr_ratio,
        ),
    )

    start_step = 0
    if resume_from is not None:
        ckpt.load_weights(resume_from, model)
        start_step = saved["step"]
    model, optimizer = accelerator.prepare(model, optimizer)
    if resume_from is not None:
        ckpt.load_training_state(resume_from, model, optimizer.optimizer, scheduler)
        log(f"resumed from {resume_from} at step {start_step}")

    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(
            json.dumps(
                {
                    "model_config": model_cfg.to_dict(),
                    "train_config": dataclasses.asdict(train_cfg),
                    "data": data_record,
                    "preset": args.preset,
                },
                indent=2,
            )
        )
    accelerator.init_trackers(
        "duolm", config={**dataclasses.asdict(train_cfg), **model_cfg.to_dict()}
    )
    metrics = Metrics(out / "metrics.jsonl", accelerator)
    device = accelerator.device
    dtype = torch.bfloat16 if accelerator.mixed_precision == "bf16" else torch.float32
    peak, peak_source = peak_flops(device, dtype, train_cfg.peak_tflops)
    log(
        f"{objective.name}: {n_parameters / 1e6:.2f}M parameters, "
        f"{len(train_rows)} train rows x {train_cfg.seq_len}, {total_steps} steps, "
        f"{world} process(es) ({layout}), "
        f"micro-batch {micro_batch} x {train_cfg.grad_accum} accumulation, "
        f"precision {accelerator.mixed_precision}, peak {peak / 1e12:.3g} TFLOP/s ({peak_source})"
    )

    val_rows = splits["validation"].tokens
    token_bytes = tokenizer.token_bytes()
    sampler = EpochSampler(len(train_rows), train_cfg.seed)
    state_record = {
        "model_config": model_cfg.to_dict(),
        "train_config": dataclasses.asdict(train_cfg),
        "objective": objective.name,
        "data": data_record,
        "total_steps": total_steps,
    }

    def validate(step: int, n_batches: int | None) -> dict[str, float]:
        totals = evaluate_rows(
            model,
            eval_objective,
            val_rows,
            token_bytes,
            batch_size=train_cfg.batch_size,
            micro_batch=micro_batch,
            seed=train_cfg.eval_seed,
            device=device,
            pad_id=tokenizer.pad_id,
            n_batches=n_batches,
            rank=rank,
            world=world,
        )
        summed = accelerator.reduce(
            torch.tensor(
                [totals.nats, totals.tokens, totals.bytes], dtype=torch.float64, device=device
            ),
            "sum",
        )
        from eval.likelihood import LossTotals

        merged = LossTotals(float(summed[0]), int(summed[1]), int(summed[2]))
        return {"step": step, "kind": "eval", "metric": objective.metric, **merged.as_dict("val")}

    checkpoints = out / "checkpoints"
    best = ckpt.read_best(checkpoints)
    last_good: list[Path | None] = [resume_from]
    bad_streak = 0

    def save(step: int, val: dict[str, float] | None) -> None:
        """Checkpoint ``step``; ``val`` is the evaluation of this step's weights, if any."""
        nonlocal best
        accelerator.wait_for_everyone()
        path = checkpoints / ckpt.checkpoint_name(step)
        is_best = val is not None and (
            best is None or val["val_nats_per_token"] < best["val_nats_per_token"]
        )
        if is_best:
            best = {"step": step, "val_nats_per_token": val["val_nats_per_token"]}
        # Gathering whole weights and optimizer state is collective under FSDP: every rank
        # takes part, rank 0 receives them and writes.
        weights = ckpt.full_model_state(model)
        optimizer_state = ckpt.full_optimizer_state(model, optimizer.optimizer)
        if accelerator.is_main_process:
            protect = (checkpoints / ckpt.checkpoint_name(best["step"]),) if best else ()
            ckpt.save_checkpoint(
                checkpoints,
                step,
                weights=weights,
                tokenizer=tokenizer,
                state=state_record,
                optimizer_state=optimizer_state,
                scheduler_state=scheduler.state_dict(),
                keep_last=train_cfg.keep_checkpoints,
                protect=protect,
            )
            if is_best:
                ckpt.write_json_atomic(checkpoints / ckpt.BEST_FILE, best)
            log(f"saved {path}" + (" (best so far)" if is_best else ""))
        if bad_streak == 0:  # weights saved in the middle of a streak of skipped steps
            last_good[0] = path
        accelerator.wait_for_everyone()

    end_step = total_steps
    if train_cfg.stop_after_steps:
        end_step = min(total_steps, start_step + train_cfg.stop_after_steps)
    checkpoint_every = train_cfg.checkpoint_every or train_cfg.eval_every
    model.train()
    progress = tqdm(
        range(start_step, end_step),
        initial=start_step,
        total=total_steps,
        disable=not accelerator.is_local_main_process,
        desc=objective.name,
        dynamic_ncols=True,
    )

    def say(message: str) -> None:  # above the progress bar, once per run rather than per rank
        if accelerator.is_main_process:
            progress.write(message)

    window_tokens, window_start = 0, time.perf_counter()
    throughput: list[float] = []
    stop = StopRequest()
    skipped_steps, stopped_by = 0, None
    for step in progress:
        rows = torch.as_tensor(
            train_rows[sampler.indices(step * train_cfg.batch_size, train_cfg.batch_size)],
            dtype=torch.long,
        )
        noise = objective.sample_noise(
            len(rows), rows.shape[1], batch_generator(train_cfg.seed, step)
        )
        # Normalise by the global token count so the gradient is the same for any split of the
        # batch over processes and micro-steps (DDP averages over processes, hence * world).
        global_tokens = int(loss_positions(rows, tokenizer.pad_id).sum())
        step_nats = torch.zeros((), dtype=torch.float64, device=device)
        for micro in range(train_cfg.grad_accum):
            start = (rank * train_cfg.grad_accum + micro) * micro_batch
            batch = rows[start : start + micro_batch].to(device)
            last_micro = micro == train_cfg.grad_accum - 1
            context = accelerator.no_sync(model) if not last_micro else contextlib.nullcontext()
            with context:
                micro_noise = slice_noise(noise, start, start + micro_batch)
                out_loss = objective.loss(model, batch, micro_noise)
                if fault_active("nan_loss", step + 1):
                    out_loss.nats = out_loss.nats * float("nan")
                accelerator.backward(out_loss.nats * world / max(global_tokens, 1))
            step_nats += out_loss.nats.detach().double()
        # One reduction per step carries the loss and any stop request, so every process takes
        # the same decision (skip, stop, save) at the same step.
        shared_state = accelerator.reduce(
            torch.stack([step_nats, torch.tensor(float(stop.requested), device=device).double()]),
            "sum",
        )
        loss = float(shared_state[0]) / max(global_tokens, 1)
        grad_norm = accelerator.clip_grad_norm_(
            model.parameters(), train_cfg.grad_clip or float("inf")
        )
        done = step + 1
        if math.isfinite(loss) and math.isfinite(float(grad_norm)):
            optimizer.step()
            bad_streak = 0
        else:
            # Skip the update but keep the schedule and data order moving, so a later resume
            # still lines up step for step.
            bad_streak += 1
            skipped_steps += 1
            metrics.log(
                {
                    "step": done,
                    "kind": "skipped",
                    "loss": loss,
                    "grad_norm": float(grad_norm),
                    "skipped_steps": skipped_steps,
                }
            )
            say(
                f"step {done}: non-finite loss {loss} or gradient norm "
                f"{float(grad_norm)}; update skipped ({bad_streak} in a row)"
            )
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if bad_streak >= train_cfg.max_bad_steps:
            stop.close()
            raise TrainingDiverged(
                f"stopping at step {done}: {bad_streak} consecutive steps with a non-finite loss "
                f"or gradient (last loss {loss}, gradient norm {float(grad_norm)}); the last good "
                f"checkpoint is {last_good[0] or 'none (no checkpoint was written yet)'}"
            )

        window_tokens += tokens_per_step
        if done % train_cfg.log_every == 0 or done == end_step:
            elapsed = time.perf_counter() - window_start
            tokens_per_s = window_tokens / elapsed
            throughput.append(tokens_per_s)
            mfu = tokens_per_s * flops_token / peak
            record = {
                "step": done,
                "kind": "train",
                "loss": loss,
                "lr": scheduler.get_last_lr()[0],
                "tokens_per_s": tokens_per_s,
                "mfu": mfu,
                "tokens": done * tokens_per_step,
                "grad_norm": float(grad_norm),
                "skipped_steps": skipped_steps,
            }
            metrics.log(record)
            progress.set_postfix(
                loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:,.0f}", mfu=f"{mfu:.1%}", refresh=False
            )
            window_tokens, window_start = 0, time.perf_counter()
        evaluated = None
        if done % train_cfg.eval_every == 0 and done != total_steps:
            evaluated = validate(done, train_cfg.eval_batches or None)
            metrics.log(evaluated)
            say(
                f"step {done}: val {objective.metric} "
                f"{evaluated['val_nats_per_token']:.4f} "
                f"nats/token, {evaluated['val_bpb']:.4f} bits/byte"
            )
            window_start = time.perf_counter()  # keep evaluation time out of tokens/s
        if float(shared_state[1]) > 0:
            stopped_by = stop.signal_name or "a signal to another process"
            end_step = done
        if done % checkpoint_every == 0 or done == end_step:
            save(done, evaluated)
            window_start = time.perf_counter()
        if stopped_by:
            say(f"stopped by {stopped_by} at step {done}; resume with --resume {out}")
            break
    progress.close()
    stop.close()

    finished = end_step == total_steps
    summary: dict[str, Any] = {
        "objective": objective.name,
        "metric": objective.metric,
        "step": end_step,
        "total_steps": total_steps,
        "finished": finished,
        "stopped_by": stopped_by,
        "skipped_steps": skipped_steps,
        "best_checkpoint": best,
        "parameters": n_parameters,
        "tokens_seen": end_step * tokens_per_step,
        "flops_per_token": flops_token,
        # the first logging window includes start-up work; report the steady state after it
        "train_tokens_per_s": (
            float(np.median(throughput[1:] or throughput)) if throughput else None
        ),
        "peak_flops": peak,
        "peak_flops_source": peak_source,
        "processes": world,
        "parallel_layout": layout,
        "precision": accelerator.mixed_precision,
        **peak_memory(device),
        "train_rows": len(train_rows),
        "epochs_seen": end_step * train_cfg.batch_size / len(train_rows),
        "data": data_record,
    }
    if finished:
        final = validate(end_step, None)  # the whole validation split
        metrics.log(final)
        summary.update(final)
        log(
            f"final: val {objective.metric} {final['val_nats_per_token']:.4f} nats/token "
            f"(ppl {final['val_ppl']:.2f}), {final['val_bpb']:.4f} bits/byte over "
            f"{final['val_tokens']} tokens"
        )
    if accelerator.is_main_process:
        (out / "final.json").write_text(json.dumps(summary, indent=2))
    # Free the DDP wrapper while the process group is still registered. Otherwise its gradient
    # reducer holds the last reference to the group and destroys it at exit with the GIL held,
    # which deadlocks when gloo's worker thread needs the GIL to free a finished collective's
    # tensors (seen as a hang at exit, about one run in four). end_training then destroys the
    # group through a binding that releases the GIL.
    accelerator.wait_for_everyone()
    model = optimizer = None
    accelerator.free_memory()
    accelerator.end_training()
    return summary


def release_process_group() -> None:
    """Destroy the process group a run that stopped on an error left behind.

    By now the failed run's frames (and its DDP wrapper) are gone, so the group is destroyed here
    through a binding that releases the GIL, not at interpreter exit with the GIL held (which can
    deadlock against gloo's worker thread; see the end of ``train``)."""
    import gc

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gc.collect()
        torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    try:
        return train_reporting_errors(argv)
    finally:
        release_process_group()


def train_reporting_errors(argv: list[str] | None) -> int:
    """Train; a user error prints one line and returns 2, a diverged run returns 3."""
    try:
        train(argv)
    except USER_ERRORS as error:
        # User errors get one clear line; DUOLM_DEBUG=1 shows the traceback instead.
        if os.environ.get("DUOLM_DEBUG"):
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    except TrainingDiverged as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
