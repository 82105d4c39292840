"""``TrainConfig``: every setting of a training run that is not the backbone's shape.

Each field is also a ``train.py`` flag (``lr`` -> ``--lr``). A run's config is saved in every
checkpoint; the fields in ``IDENTITY_FIELDS`` define the experiment, so resuming refuses to change
them (see ``shared.training.resume``).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.cli_args import MAX_THREADS
from shared.config import TOKENIZER_CHOICES, check_field_types
from shared.errors import ConfigError
from shared.files import cache_root
from shared.objective import objective_class, objective_names
from shared.tokenizer import check_bpe_vocab_size

DEFAULT_CACHE = cache_root()


# curriculum_steps' default: the first half of the run's steps, resolved once the run's length
# is known (a budget in tokens, FLOPs or epochs becomes steps only then).
CURRICULUM_HALF = -1


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
    # prompt -> answer rows: train and validate only on the tokens after the first occurrence of
    # this text (one token) in each row; empty = every token
    answer_after: str = ""
    # optimisation
    batch_size: int = 32  # global rows per optimizer step
    grad_accum: int = 1
    lr: float = 1e-3
    lr_schedule: str = "cosine"  # cosine | constant | wsd (warmup-stable-decay)
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    # wsd: the last fraction of the steps decays linearly to min_lr_ratio (at least one step);
    # before it the rate is constant, so shorter budgets branch off a longer run's checkpoints
    cooldown_fraction: float = 0.2
    # wsd: budgets (steps, comma-separated, each below this run's) to branch off this run; it
    # saves and keeps a checkpoint at each one's cooldown start (see shared.training.schedule)
    branch_budgets: str = ""
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    precision: str = "auto"  # auto: bf16 where the hardware runs it fast, else fp32
    compile: str = "off"  # torch.compile the model: off | on | auto (on where it works)
    # budget: max_flops, else max_tokens, else max_steps decides the number of steps
    max_steps: int = 1000
    max_tokens: int = 0
    max_flops: float = 0.0
    # data-constrained training: keep only the rows holding this many unique training tokens
    # (0 = all; the first rows, or with unique_sample="random" rows drawn uniformly over the
    # split with a fixed seed), and/or train for this many passes over them (a budget)
    unique_tokens: int = 0
    unique_sample: str = "first"
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
    # Eso-LM ("eso"): the expected share of positions its masked-diffusion phase reveals before
    # the autoregressive phase fills the rest (1 = a masked model, 0 = autoregressive).
    alpha_0: float = 0.5
    # adaptation (DiffuLLaMA's attention-mask annealing, for a model initialised from an AR run):
    # over the first K steps a bidirectional objective attends causally plus a random fraction of
    # the future positions rising linearly from 0 to 1; full attention after, and always in
    # validation and sampling. 0 = off. See shared.objective.annealing_noise.
    attention_anneal_steps: int = 0
    # uniform-state diffusion ("udm"): Duo's Gaussian-relaxation curriculum for the first K steps
    # (soft inputs softmax(w / tau) @ E, the NELBO at argmax(w)), the exact loss after; 0 = off,
    # -1 = the first half of the run's steps (Duo's share; the default, measured in
    # docs/studies/udm-curriculum). gamma spans [min, max] as t spans [0, 1] (Duo's defaults).
    # See dllm.uniform.curriculum.
    curriculum_steps: int = CURRICULUM_HALF
    curriculum_tau: float = 1e-3
    curriculum_gamma_min: float = -3.5
    curriculum_gamma_max: float = -1.75
    # start from another run's weights (a run folder: its newest valid checkpoint, or a
    # checkpoint folder); "" = fresh weights. A new run only: resuming uses its own checkpoint.
    init_from: str = ""
    # evaluation, logging, checkpoints
    eval_every: int = 200
    eval_batches: int = 8  # global batches per periodic evaluation; 0 = the whole split
    val_max_rows: int = 0  # validate on at most the first N validation rows; 0 = all of them
    eval_seed: int = 1234
    # learning curve: also validate (on eval_batches) at this many steps spaced evenly in log
    # over the last 64x of training FLOPs, the final step included; 0 = off
    curve_points: int = 0
    log_every: int = 10
    checkpoint_every: int = 0  # 0: at every evaluation and at the end
    keep_checkpoints: int = 3  # newest kept, plus the best by periodic validation loss
    # single (one safetensors file, gathered on rank 0) | sharded (torch.distributed.checkpoint:
    # each rank writes its own shards) | auto (sharded under FSDP above a parameter count)
    checkpoint_format: str = "auto"
    max_bad_steps: int = 5  # consecutive steps with non-finite loss/gradients before stopping
    seed: int = 0
    num_threads: int = 0  # torch CPU threads; 0 leaves torch's default
    peak_tflops: float = 0.0  # hardware peak for MFU; 0 = look up or measure
    log_with: str = ""  # comma-separated accelerate trackers, e.g. "tensorboard" or "wandb"
    cache_dir: str = str(DEFAULT_CACHE)

    def validate(self) -> TrainConfig:
        """This configuration, once every field is in its range (or ``ConfigError`` naming the
        first field that is not): the checks run in the order of their steps below."""
        check_field_types(self)
        self._check_choices()
        self._check_signs()
        self._check_schedule()
        self._check_objective_options()
        self._check_budget()
        return self

    def _check_choices(self) -> None:
        choices = {
            "objective": objective_names(),
            "protocol": ["packed", "padded"],
            "lr_schedule": ["cosine", "constant", "wsd"],
            "unique_sample": ["first", "random"],
            "precision": ["auto", "fp32", "bf16"],
            "compile": ["off", "on", "auto"],
            "checkpoint_format": ["auto", "single", "sharded"],
            "schedule": ["linear", "cosine"],
            "estimator": ["time", "count"],
            "tokenizer": TOKENIZER_CHOICES,
        }
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {valid}")
        if self.tokenizer == "bpe":  # before the run claims its folder or reads its corpus
            check_bpe_vocab_size(self.tokenizer_vocab_size)

    def _check_signs(self) -> None:
        """Counts at least 1, sizes and rates at least 0, seeds within 32 bits."""
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
            "val_max_rows",
            "curve_points",
            "checkpoint_every",
            "keep_checkpoints",
            "block_size",
            "attention_anneal_steps",
            "num_threads",
            "peak_tflops",
            "weight_decay",
            "grad_clip",
            "seed",
            "eval_seed",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        for name, most in (("curve_points", MAX_CURVE_POINTS), ("num_threads", MAX_THREADS)):
            if getattr(self, name) > most:
                raise ConfigError(
                    f"{name}={getattr(self, name)} (--{name.replace('_', '-')}) is more than "
                    f"{most:,}, the most it takes"
                )
        for name in ("seed", "eval_seed"):
            if getattr(self, name) > MAX_SEED:
                raise ConfigError(
                    f"{name}={getattr(self, name)} (--{name.replace('_', '-')}) must be at most "
                    f"{MAX_SEED} = 2**32 - 1 (seeds are 32-bit words)"
                )

    def _check_schedule(self) -> None:
        """The rows' protocol and length, the learning rate and its schedule, the optimizer's
        betas."""
        if self.answer_after and self.protocol != "padded":
            raise ConfigError(
                f"answer_after={self.answer_after!r} needs protocol='padded' (one prompt and "
                f"answer per row); protocol={self.protocol!r} packs documents across rows"
            )
        if self.seq_len < 4:
            raise ConfigError(f"seq_len={self.seq_len} must be >= 4")
        if not self.lr > 0:
            raise ConfigError(f"lr={self.lr!r} must be > 0")
        if not 0 < self.cooldown_fraction <= 1:
            raise ConfigError(
                f"cooldown_fraction={self.cooldown_fraction!r} must be in (0, 1] (the share of "
                "a wsd run's steps that decay)"
            )
        if self.branch_budgets:
            budgets = parse_budgets(self.branch_budgets)
            if self.lr_schedule != "wsd":
                raise ConfigError(
                    f"branch_budgets={self.branch_budgets!r} needs lr_schedule='wsd' (only its "
                    f"shorter budgets branch off a longer run); lr_schedule={self.lr_schedule!r}"
                )
            if self.max_steps and not (self.max_tokens or self.max_flops or self.epochs):
                too_long = [b for b in budgets if b >= self.max_steps]
                if too_long:
                    raise ConfigError(
                        f"branch_budgets {too_long} must be below this run's {self.max_steps} "
                        "steps (a branch is a shorter budget)"
                    )
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio={self.min_lr_ratio!r} must be in [0, 1]")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be in [0, 1)")

    def _check_objective_options(self) -> None:
        """The noise range, then what the objective itself checks, then options that only
        some objectives use (attention annealing, the curriculum)."""
        if not 0 <= self.t_eps < 1:
            raise ConfigError(f"t_eps={self.t_eps!r} must be in [0, 1)")
        if not self.t_eps < self.t_max <= 1:
            raise ConfigError(f"t_max={self.t_max!r} must be in (t_eps={self.t_eps}, 1]")
        objective = objective_class(self.objective)
        objective.check_config(self)
        if self.attention_anneal_steps and objective.attention != "bidirectional":
            raise ConfigError(
                f"attention_anneal_steps={self.attention_anneal_steps} eases causal attention into "
                f"bidirectional attention; objective={self.objective!r} trains with "
                f"{objective.attention!r} attention (use it with mdm)"
            )
        if self.curriculum_steps < CURRICULUM_HALF:
            raise ConfigError(
                f"curriculum_steps={self.curriculum_steps} must be >= 0 (the steps trained with "
                f"the curriculum) or {CURRICULUM_HALF} (the first half of the run's steps)"
            )
        if self.curriculum_steps > 0 and self.objective != "udm":
            raise ConfigError(
                f"curriculum_steps={self.curriculum_steps} is uniform-state diffusion's Gaussian "
                f"curriculum (objective udm); objective={self.objective!r} does not use it"
            )

    def _check_budget(self) -> None:
        """Exactly one budget, and a curriculum that ends inside a budget given in steps."""
        budgets = [name for name in ("max_tokens", "max_flops", "epochs") if getattr(self, name)]
        # Only a budget in steps is known here; one in tokens, FLOPs or epochs becomes steps once
        # the data is read, and -1 (half the run) always fits.
        if not budgets and 0 < self.max_steps < self.curriculum_steps:
            raise ConfigError(
                f"curriculum_steps={self.curriculum_steps} is longer than the run's "
                f"max_steps={self.max_steps} (the run would end inside it); give at most "
                f"{self.max_steps}, or {CURRICULUM_HALF} for the first half of the run's steps"
            )
        if len(budgets) > 1:
            raise ConfigError(f"set only one of {budgets} (each is a budget)")
        if not (self.max_steps or budgets):
            raise ConfigError(
                "no budget: set max_steps, max_tokens, max_flops or epochs to a value > 0"
            )


# The largest training or validation seed: the generators of the data order and the noise are
# seeded through 32-bit words.
MAX_SEED = 2**32 - 1
# Learning-curve points: each is one validation, and their steps are laid out in one array
# before the run (10**12 points asked for terabytes).
MAX_CURVE_POINTS = 1 << 16


def parse_budgets(text: str) -> list[int]:
    """Step budgets written as ``"100,200,400"``: positive integers, strictly increasing."""
    try:
        budgets = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"branch_budgets={text!r} must be step counts separated by commas, e.g. '100,200,400'"
        ) from None
    if any(b < 1 for b in budgets) or any(b <= a for a, b in zip(budgets, budgets[1:])):
        raise ConfigError(f"branch_budgets={text!r} must be positive and strictly increasing")
    return budgets


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
    "answer_after",
    "schedule",
    "block_size",  # block diffusion: the block size is part of what the model learns
    "alpha_0",  # Eso-LM: the share of the diffusion phase is part of what the model learns
    "seed",
    "init_from",  # the weights the run started from
)
