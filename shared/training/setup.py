"""Everything a run needs before its first step: the accelerator, the data, the budget, the
optimizer and its schedule."""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import DistributedType, InitProcessGroupKwargs, gather_object

from shared.config import ModelConfig
from shared.data.corpus import load_corpus
from shared.data.rows import protocol_record, tokenize_corpus
from shared.data.shards import open_shards, read_manifest, shard_folder, shard_protocol_record
from shared.errors import ConfigError, ResourceUnavailableError
from shared.hardware import bf16_is_fast
from shared.model import flops_per_token
from shared.objective import answer_positions
from shared.tokenizer import Tokenizer
from shared.tokenizer_cache import build_tokenizer
from shared.training.config import TrainConfig
from shared.training.processes import wait_timeout
from shared.training.schedule import lr_multiplier


def make_accelerator(cfg: TrainConfig, out: Path) -> Accelerator:
    # A fresh state each call, so train() can run more than once in one process (tests, sweeps).
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    cuda = torch.cuda.is_available()
    refuse_deepspeed_on_cpu(cuda)
    mixed = "bf16" if cfg.precision == "bf16" else "no"
    if cfg.precision == "auto":
        mixed = "bf16" if bf16_is_fast() else "no"
    trackers = [t for t in cfg.log_with.split(",") if t]
    check_trackers_installed(trackers)
    return Accelerator(
        # every wait for the other processes (joining, collectives) gives up after this
        kwargs_handlers=[InitProcessGroupKwargs(timeout=wait_timeout())],
        cpu=not cuda,
        mixed_precision=mixed,
        log_with=trackers or None,
        project_dir=str(out),
    )


def refuse_deepspeed_on_cpu(cuda: bool) -> None:
    """A DeepSpeed launch config on a machine without CUDA: accelerate's CPU mode would run the
    processes as plain DDP without a word (checked with deepspeed 0.19.8 and the ZeRO-2 and
    ZeRO-3 configs), so say so instead of training something else than was asked."""
    if not cuda and os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        raise ConfigError(
            "this launch asks for DeepSpeed, which needs CUDA here (on CPU accelerate would run "
            "plain DDP instead); launch without the DeepSpeed config for DDP, or use "
            "configs/accelerate/fsdp_1node.yaml for sharded weights"
        )


# accelerate tracker -> the packages that can back it
TRACKER_PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboardX"),
    "wandb": ("wandb",),
    "comet_ml": ("comet_ml",),
    "mlflow": ("mlflow",),
    "aim": ("aim",),
    "clearml": ("clearml",),
    "dvclive": ("dvclive",),
}


def check_trackers_installed(trackers: list[str]) -> None:
    """accelerate skips a tracker whose package is missing with a warning, so the run would log
    nothing; refuse instead, naming the install command."""
    for tracker in trackers:
        if tracker not in TRACKER_PACKAGES:
            raise ConfigError(
                f"log_with={tracker!r} is not a tracker; valid: {sorted(TRACKER_PACKAGES)}"
            )
        if not any(importlib.util.find_spec(p) for p in TRACKER_PACKAGES[tracker]):
            raise ConfigError(
                f"--log-with {tracker} needs the {TRACKER_PACKAGES[tracker][0]} package: "
                f"pip install {TRACKER_PACKAGES[tracker][0]}"
                + (" (or the project's 'tracking' extra)" if tracker == "tensorboard" else "")
            )


def parallel_layout(accelerator: Accelerator) -> str:
    """How training is spread over processes, for logs and run summaries: "single process",
    "DDP" (replicated weights), "FSDP1" or "FSDP2" (sharded weights), "DeepSpeed ZeRO-N"
    (untested: GPUs only)."""
    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP:
        return f"FSDP{accelerator.state.fsdp_plugin.fsdp_version}"
    if kind == DistributedType.NO:
        return "single process"
    if kind == DistributedType.DEEPSPEED:
        return f"DeepSpeed ZeRO-{accelerator.state.deepspeed_plugin.zero_stage}"
    return "DDP"


def micro_batch_size(cfg: TrainConfig, layout: str, world: int) -> int:
    """Rows per process per micro-step; refuses layouts the trainer cannot run."""
    if layout == "FSDP1":
        raise ConfigError(
            "FSDP version 1 is not supported (its flat parameters do not fit this trainer's "
            "optimizer groups); set fsdp_version: 2 in the accelerate config, as "
            "configs/accelerate/fsdp_1node.yaml does"
        )
    if cfg.batch_size % (world * cfg.grad_accum):
        raise ConfigError(
            f"batch_size={cfg.batch_size} must be divisible by processes x "
            f"grad_accum = {world} x {cfg.grad_accum}"
        )
    return cfg.batch_size // (world * cfg.grad_accum)


@dataclass
class RunData:
    tokenizer: Tokenizer
    train_rows: np.ndarray  # [N, seq_len], after --unique-tokens
    val_rows: np.ndarray
    record: dict[str, Any]  # the data protocol, saved with every checkpoint
    total_train_rows: int = 0  # over every process's shards; 0: len(train_rows)

    @property
    def n_train_rows(self) -> int:
        """Training rows of the whole run (a process reading shards holds only its own)."""
        return self.total_train_rows or len(self.train_rows)


def load_data(
    cfg: TrainConfig,
    accelerator: Accelerator,
    tokenizer_from: Path | None,
    saved: dict[str, Any] | None,
    allow_config_change: bool,
) -> RunData:
    """Corpus, tokenizer (the one saved in ``tokenizer_from``, a checkpoint, when given; else
    built from ``cfg``) and tokenized rows. The main process tokenizes and fills the cache; the
    others then read it."""
    if shard_folder(cfg.dataset) is not None:
        return load_shard_data(cfg, accelerator, tokenizer_from, saved, allow_config_change)
    cache_dir = Path(cfg.cache_dir)
    with accelerator.main_process_first():
        if tokenizer_from is not None:
            tokenizer = Tokenizer.load(tokenizer_from / "tokenizer")
        corpus = load_corpus(
            cfg.dataset, val_dataset=cfg.val_dataset or None, text_field=cfg.text_field
        )
        if tokenizer_from is None:
            tokenizer = build_tokenizer(
                cfg.tokenizer,
                vocab_size=cfg.tokenizer_vocab_size,
                train_texts=corpus.train,
                corpus_fingerprint=corpus.fingerprint,
                cache_dir=cache_dir,
            )
        splits = tokenize_corpus(
            corpus, tokenizer, protocol=cfg.protocol, seq_len=cfg.seq_len, cache_dir=cache_dir
        )
    record = protocol_record(corpus, tokenizer, splits, protocol=cfg.protocol, seq_len=cfg.seq_len)
    check_same_corpus(saved, corpus.fingerprint, allow_config_change)
    train_rows = unique_rows(splits["train"].tokens, cfg)
    return RunData(tokenizer, train_rows, kept_validation(splits["validation"].tokens, cfg), record)


def check_same_corpus(
    saved: dict[str, Any] | None, fingerprint: str, allow_config_change: bool
) -> None:
    if saved is None or allow_config_change:
        return
    if saved["data"]["corpus_fingerprint"] != fingerprint:
        raise ConfigError(
            "refusing to resume: the corpus differs from the checkpoint's "
            f"(fingerprint {saved['data']['corpus_fingerprint']} vs {fingerprint})"
        )


def load_shard_data(
    cfg: TrainConfig,
    accelerator: Accelerator,
    tokenizer_from: Path | None,
    saved: dict[str, Any] | None,
    allow_config_change: bool,
) -> RunData:
    """Rows of a ``shards:DIR`` dataset: this process's train shards memory-mapped (never
    loaded whole) and the validation rows, with the shards' own tokenizer (a resumed or
    initialised run keeps its checkpoint's, which must be the one the shards were written with)."""
    folder = shard_folder(cfg.dataset)
    for name in ("unique_tokens", "answer_after", "val_dataset"):
        if getattr(cfg, name):
            raise ConfigError(
                f"{name}={getattr(cfg, name)!r} reads the corpus in memory; it does not combine "
                f"with dataset={cfg.dataset!r} (write the shards from the subset you want)"
            )
    manifest = read_manifest(folder)
    if tokenizer_from is None and cfg.tokenizer != manifest["tokenizer"]["kind"]:
        raise ConfigError(
            f"shards:{folder} were written with tokenizer {manifest['tokenizer']['kind']!r}; "
            f"this run asks for tokenizer={cfg.tokenizer!r} (set --tokenizer "
            f"{manifest['tokenizer']['kind']})"
        )
    tokenizer = Tokenizer.load((tokenizer_from or folder) / "tokenizer")
    problem, splits = "", None
    try:
        splits = open_shards(
            folder,
            tokenizer,
            protocol=cfg.protocol,
            seq_len=cfg.seq_len,
            rank=accelerator.process_index,
            world=accelerator.num_processes,
        )
    except ConfigError as refused:
        problem = str(refused)
    # Each process checks only its own shards: all of them learn any one's refusal, so none
    # waits for the others in the first collective.
    problems = [p for p in gather_object([problem]) if p] if accelerator.num_processes > 1 else []
    if problem or problems:
        raise ConfigError(problem or problems[0])
    record = shard_protocol_record(splits, folder)
    check_same_corpus(saved, record["corpus_fingerprint"], allow_config_change)
    val_rows = splits.validation  # memory-mapped too, unless only its first rows are scored
    if cfg.val_max_rows and cfg.val_max_rows < len(val_rows):
        val_rows = val_rows[: cfg.val_max_rows]
    return RunData(tokenizer, splits.train, val_rows, record, splits.total_train_rows)


def kept_validation(rows: np.ndarray, cfg: TrainConfig) -> np.ndarray:
    """The validation rows a run scores: at most the first ``val_max_rows`` (all when 0)."""
    return rows[: cfg.val_max_rows] if cfg.val_max_rows else rows


UNIQUE_ROWS_SEED = 20251201  # one fixed draw, so every run of a comparison sees the same data


def unique_rows(train_rows: np.ndarray, cfg: TrainConfig) -> np.ndarray:
    """The whole rows holding ``unique_tokens`` training tokens (all rows when 0): the first
    ones, or with ``unique_sample="random"`` rows drawn uniformly without replacement over the
    split (a fixed seed, independent of the training seed), kept in corpus order."""
    if not cfg.unique_tokens:
        return train_rows
    # Loss tokens per row are seq_len - 1 (position 0 is BOS); keep whole rows, in order.
    keep = math.ceil(cfg.unique_tokens / (cfg.seq_len - 1))
    if keep > len(train_rows):
        raise ConfigError(
            f"unique_tokens={cfg.unique_tokens} exceeds the {len(train_rows)} rows "
            f"x {cfg.seq_len - 1} tokens of the training split"
        )
    if cfg.unique_sample == "random":
        chosen = np.random.default_rng(UNIQUE_ROWS_SEED).choice(
            len(train_rows), keep, replace=False
        )
        return train_rows[np.sort(chosen)]
    return train_rows[:keep]


def answer_scorer(
    cfg: TrainConfig, tokenizer: Tokenizer, splits: dict[str, np.ndarray]
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The positions a run is scored on when ``answer_after`` is set (None: every loss
    position): those after the separator, which must be one token present in every row."""
    if not cfg.answer_after:
        return None
    ids = tokenizer.encode(cfg.answer_after)
    if len(ids) != 1:
        raise ConfigError(
            f"answer_after={cfg.answer_after!r} is {len(ids)} tokens under this tokenizer; "
            "it must be exactly one"
        )
    separator = ids[0]
    for split, rows in splits.items():
        missing = int((~(rows == separator).any(1)).sum())
        if missing:
            raise ConfigError(
                f"answer_after={cfg.answer_after!r} occurs in no token of {missing} of the "
                f"{len(rows)} {split} rows: every row needs a prompt, the separator and an answer"
            )
    return lambda tokens: answer_positions(tokens, separator, tokenizer.pad_id)


@cache
def compiler_problem() -> str | None:
    """Why ``torch.compile`` cannot run here (no C++ compiler, an unsupported platform...), or
    None: compiles and runs one small function once per process."""
    try:
        probe = torch.compile(lambda x: torch.sin(x) * 2 + 1, fullgraph=True)
        probe(torch.ones(8))
    except Exception as error:  # any failure means the backend is unusable here
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"{type(error).__name__}: {first_line}"[:300]
    return None


def compile_model(model: torch.nn.Module, mode: str, layout: str, log: Callable) -> bool:
    """Compile ``model`` in place (its state dict keeps its names, so checkpoints are the same)
    for ``mode`` "on" or "auto"; returns whether it did. "on" refuses where the compiler does
    not work; "auto" trains eagerly then, saying so once."""
    if mode == "off":
        return False
    if layout.startswith("FSDP"):
        raise ConfigError(f"compile={mode!r} is not supported with FSDP; use --compile off")
    problem = compiler_problem()
    if problem is not None:
        if mode == "on":
            raise ResourceUnavailableError(
                f"--compile on: torch.compile does not work here ({problem}); use --compile "
                "off, or auto to fall back to eager automatically"
            )
        log(f"--compile auto: torch.compile does not work here ({problem}); training eagerly")
        return False
    model.compile()
    return True


def training_flops_per_token(objective, model_cfg: ModelConfig, seq_len: int) -> float:
    """FLOPs per data token of a training step. An objective that runs ``streams`` rows through
    the network per data row (block diffusion: [noisy, clean]) pays for each, over a context of
    ``streams * seq_len``, so a FLOP budget buys it proportionally fewer steps."""
    streams = objective.streams
    return streams * flops_per_token(model_cfg, streams * seq_len)


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms' gains)."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        fused=torch.cuda.is_available() or None,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_multiplier(
            s,
            warmup_steps=cfg.warmup_steps,
            total_steps=total_steps,
            schedule=cfg.lr_schedule,
            min_lr_ratio=cfg.min_lr_ratio,
            cooldown_fraction=cfg.cooldown_fraction,
        ),
    )


def follow_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Set the optimizer's rates to this run's schedule at the scheduler's step. A checkpoint
    stores the rate its own run set for the next update; a run continued under another budget (a
    WSD cooldown branch, a longer run) must take its own schedule's rate from the first update
    on. The product is the one ``LambdaLR`` computes, so a plain resume is unchanged."""
    step = scheduler.last_epoch
    rates = [base * rule(step) for rule, base in zip(scheduler.lr_lambdas, scheduler.base_lrs)]
    for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = rates


def precision_name(mixed_precision: str) -> str:
    """What a run computes in, as the --precision flag names it ("no" is accelerate's fp32)."""
    return "fp32" if mixed_precision == "no" else mixed_precision
