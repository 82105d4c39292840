"""The training command line: every ``ModelConfig`` and ``TrainConfig`` field is a flag, with the
chosen preset's value as its default; the flags typed become a ``RunSpec``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from shared.checkpoint import resolve_checkpoint
from shared.cli_args import CommandParser
from shared.config import FIELD_TYPES, ModelConfig
from shared.errors import CheckpointError, ConfigError, result_or_status
from shared.resume_state import check_training_state
from shared.training.config import TrainConfig, TrainingDiverged
from shared.training.loop import release_process_group, train
from shared.training.presets import get_preset
from shared.training.processes import decided_on_main
from shared.training.run import RunSpec, new_run, resumable_checkpoint, resume_run
from shared.training.run_folder import holder_if_locked, holds_run

# Every flag's group and one-line description (valid choices in the text); the help shows them
# with the preset's default.
FLAG_GROUPS: dict[str, dict[str, str]] = {
    "model": {
        "dim": "model width",
        "n_layers": "transformer blocks",
        "n_heads": "attention heads (must divide dim)",
        "n_kv_heads": "key/value heads for grouped-query attention (must divide n_heads)",
        "hidden_dim": "SwiGLU hidden width",
        "norm_eps": "RMSNorm epsilon",
        "rope_theta": "RoPE base",
        "max_seq_len": "longest row the model supports (>= seq_len)",
        "tie_embeddings": "share the input embedding and the output head (true/false)",
        "sliding_window": "keys each query sees; 0 = full attention",
        "attention_bias": "biases on the q, k and v projections, as Qwen2 has (true/false)",
        "rope_scaling_factor": "Llama-3 RoPE scaling: how far long wavelengths stretch; 0 = off",
        "rope_low_freq_factor": "Llama-3 RoPE scaling: wavelengths above original_max_len / "
        "this stretch fully",
        "rope_high_freq_factor": "Llama-3 RoPE scaling: wavelengths below original_max_len / "
        "this are kept",
        "rope_original_max_len": "Llama-3 RoPE scaling: the context the model was trained at",
        "shift_logits": "mdm: position i's output predicts token i+1, the AR layout (Dream, "
        "DiffuLLaMA; keeps an --init-from AR head aligned) (true/false)",
        "time_conditioning": "udm: feed the diffusion time to the network, an embedding added to "
        "every position's input (UDLM, Duo) (true/false)",
    },
    "data": {
        "dataset": "kjv, a local .txt/.jsonl/.json/.parquet file or folder, a hub dataset "
        "(name or name:config), or synthetic:<language>?<params>",
        "val_dataset": "separate validation corpus; empty = hold out part of the dataset",
        "text_field": "column holding the text (jsonl/parquet/hub)",
        "tokenizer": "byte | gpt2 | bpe (trained on the corpus) | hf:<hub name or tokenizer.json>",
        "tokenizer_vocab_size": "vocabulary of the trained bpe tokenizer (>= 300)",
        "protocol": "packed (documents concatenated) | padded (one document per row)",
        "seq_len": "tokens per row, BOS included",
        "answer_after": "prompt -> answer rows: score only the tokens after the first occurrence "
        "of this one-token text (padded protocol); empty = every token",
        "unique_tokens": "keep only the rows holding this many training tokens; 0 = all",
        "unique_sample": "which rows unique_tokens keeps: first | random (uniform over the split, "
        "a fixed seed shared by every run)",
        "cache_dir": "where tokenizers and tokenized rows are cached",
    },
    "objective": {
        "objective": "ar | mdm | bd (block diffusion) | udm (uniform-state diffusion) | eso "
        "(Eso-LM: a masked phase, then an autoregressive one)",
        "schedule": "diffusion noise schedule: linear | cosine",
        "t_eps": "smallest diffusion time drawn, in [0, 1)",
        "estimator": "MDM loss estimator: time (Bernoulli masks at t) | count (LLaDA, linear only)",
        "block_size": "bd: positions per block; must divide seq_len",
        "t_max": "bd: largest diffusion time drawn in training, in (t_eps, 1]",
        "alpha_0": "eso: share of positions the diffusion phase reveals, in [0, 1] (1 = mdm, "
        "0 = autoregressive)",
        "attention_anneal_steps": "mdm: first steps whose attention rises from causal to full "
        "(a random, linearly growing share of future positions); 0 = off",
        "curriculum_steps": "udm: first steps trained with Duo's Gaussian relaxation (soft "
        "inputs, the NELBO at the latent's argmax); 0 = off; -1 (default) = the first half of "
        "the run's steps",
        "curriculum_tau": "udm curriculum: softmax temperature of the soft inputs (> 0)",
        "curriculum_gamma_min": "udm curriculum: gamma at t = 0 (log-SNR of the latent, negated)",
        "curriculum_gamma_max": "udm curriculum: gamma at t = 1",
    },
    "initialisation": {
        "init_from": "start from the weights of a run folder (its newest valid checkpoint) or a "
        "checkpoint folder; optimizer, step and data order start fresh; empty = random weights",
    },
    "optimisation": {
        "batch_size": "global rows per optimizer step (split over processes and grad_accum)",
        "grad_accum": "micro-steps per optimizer step",
        "lr": "peak learning rate",
        "lr_schedule": "cosine | constant | wsd (warmup-stable-decay), after linear warmup",
        "warmup_steps": "linear warmup steps",
        "min_lr_ratio": "cosine floor, or where a wsd cooldown ends, as a fraction of lr, "
        "in [0, 1]",
        "cooldown_fraction": "wsd: the share of the steps that decay linearly at the end, "
        "in (0, 1]",
        "branch_budgets": "wsd: shorter budgets (steps, comma-separated) to branch off this run; "
        "it keeps a checkpoint at each one's cooldown start (resume it with --max-steps B "
        "--out NEW)",
        "weight_decay": "AdamW weight decay (matrices only)",
        "beta1": "AdamW beta1, in [0, 1)",
        "beta2": "AdamW beta2, in [0, 1)",
        "grad_clip": "gradient norm clip; 0 = off",
        "precision": "auto (bf16 on CUDA and on CPUs with AMX, else fp32) | fp32 | bf16",
        "compile": "torch.compile the model: off | on (refuse where the compiler does not work) "
        "| auto (compile where it works, else eager, said once)",
        "seed": "seed of the weights, the data order and the noise",
        "num_threads": "torch CPU threads; 0 = torch's default",
    },
    "budget": {
        "max_steps": "optimizer steps (used when no other budget is set)",
        "max_tokens": "training tokens; 0 = unset",
        "max_flops": "training FLOPs (6N + attention per token); 0 = unset",
        "epochs": "passes over the (unique) training rows; 0 = unset",
        "stop_after_steps": "end this invocation early, with a checkpoint; 0 = run to the end",
    },
    "checkpoints and evaluation": {
        "eval_every": "steps between validations (each also saves a checkpoint)",
        "eval_batches": "batches per periodic validation; 0 = the whole split",
        "val_max_rows": "validate on at most the first N rows of the validation split (the "
        "final validation too); 0 = all of them",
        "eval_seed": "seed of the fixed validation noise",
        "curve_points": "also validate at this many steps spaced evenly in log-FLOPs over the "
        "last 64x of training (a learning curve); 0 = off",
        "checkpoint_every": "steps between checkpoints; 0 = at every validation",
        "keep_checkpoints": "newest checkpoints kept (the best is always kept)",
        "checkpoint_format": "single (one safetensors file) | sharded (each process writes its "
        "own shards; torch.distributed.checkpoint) | auto (sharded under FSDP from 1B "
        "parameters, else single)",
        "max_bad_steps": "consecutive non-finite steps before the run stops (exit 3)",
    },
    "logging": {
        "log_every": "steps between training log records",
        "log_with": "comma-separated accelerate trackers, e.g. tensorboard or wandb",
        "peak_tflops": "hardware peak for MFU; 0 = look it up or measure it",
    },
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def build_parser(preset: dict[str, dict[str, Any]] | None) -> argparse.ArgumentParser:
    parser = CommandParser(
        description="Train the shared backbone under an objective: ar (autoregressive), mdm "
        "(masked diffusion), bd (block diffusion) or udm (uniform-state diffusion).",
    )
    parser.add_argument(
        "--preset", default="demo", help="named preset (shared/training/presets.py)"
    )
    parser.add_argument(
        "--out", default=None, help="run directory (default: runs/<preset>-<objective>)"
    )
    parser.add_argument(
        "--resume",
        default=None,
        help="run or checkpoint directory to continue from; auto: the newest valid checkpoint "
        "of --out, or a fresh start when it has none (a requeued job)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start a new run in a folder that holds one; the old run is moved aside to "
        "<out>.replaced-<time>, not deleted",
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume even if identity fields (objective, data, tokenizer, shape) "
        "differ from the checkpoint's",
    )
    preset = preset or {"model": {}, "train": {}}
    fields = {f.name: f for cls in (ModelConfig, TrainConfig) for f in dataclasses.fields(cls)}
    defaults = {**preset["model"], **preset["train"]}
    for title, described in FLAG_GROUPS.items():
        group = parser.add_argument_group(f"{title} (defaults shown are the preset's)")
        for name, description in described.items():
            kind = FIELD_TYPES[str(fields[name].type)]
            default = defaults.get(name, fields[name].default)
            group.add_argument(
                _flag(name),
                dest=name,
                default=argparse.SUPPRESS,
                type=_parse_bool if kind is bool else kind,
                metavar=kind.__name__.upper(),
                help=f"{description} (default: {default})",
            )
    return parser


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Returns the parsed arguments and the explicitly given config overrides."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--preset", default=None)
    known, _ = pre.parse_known_args(argv)
    try:
        preset = get_preset(known.preset or "demo")
    except ConfigError:
        preset = None  # reported below by resolve_config, after --help had its chance
    args = build_parser(preset).parse_args(argv)
    # a resume records its run's own preset; only one typed is checked against it
    args.typed_preset = known.preset or ""
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    overrides = {k: v for k, v in vars(args).items() if k in model_fields | train_fields}
    return args, overrides


# The exit status of a run stopped by a signal (SIGTERM, SIGINT, SIGUSR1) after saving its
# checkpoint: EX_TEMPFAIL, "try again". configs/slurm/train.sbatch requeues the job on it.
REQUEUE_STATUS = 75


def spec_from_argv(argv: list[str] | None) -> RunSpec:
    args, overrides = parse_args(argv)
    if args.resume == "auto":
        return auto_resume(args, overrides)
    if args.resume:
        if args.overwrite:
            raise ConfigError(
                "--resume and --overwrite do not go together: --resume continues a run, "
                "--overwrite starts a new one over it (drop one of them)"
            )
        checkpoint = decided_on_main(
            "find the checkpoint --resume continues", lambda: resumable_checkpoint(args.resume)
        )
        return resume_run(
            checkpoint,
            args.out,
            preset=args.typed_preset,
            allow_config_change=args.allow_config_change,
            verified=True,
            **overrides,
        )
    return new_run(args.preset, args.out, overwrite=args.overwrite, **overrides)


def auto_resume(args: argparse.Namespace, overrides: dict[str, Any]) -> RunSpec:
    """``--resume auto``: continue the run in ``--out`` from its newest valid checkpoint, or
    start it fresh when there is none (a job requeued before its first checkpoint; what was
    there is moved aside, not deleted). A folder another live run holds is refused."""
    if args.overwrite:
        raise ConfigError("--resume auto and --overwrite do not go together (drop one of them)")
    out = Path(args.out) if args.out else None
    if out is None:
        preset_spec = new_run(args.preset, None, **overrides)
        out = preset_spec.out

    def choose() -> Path | None:  # on the main process only: it reads every checkpoint
        holder = holder_if_locked(out)
        if holder:
            raise ConfigError(
                f"--resume auto: the run folder {out} is in use by another run "
                f"({holder}); a requeued job waits for the old one to end"
            )
        valid = newest_valid_checkpoint(out)
        if valid is None:
            print(
                f"--resume auto: no valid checkpoint in {out}; starting the run fresh", flush=True
            )
            return None
        check_training_state(valid)  # before anything else: it may need converting first
        print(f"--resume auto: continuing from {valid}", flush=True)
        return valid

    valid = decided_on_main("choose the checkpoint --resume auto continues", choose)
    if valid is None:
        return new_run(args.preset, out, overwrite=holds_run(out), **overrides)
    return resume_run(
        valid,
        out,
        preset=args.typed_preset,
        allow_config_change=args.allow_config_change,
        verified=True,
        **overrides,
    )


def newest_valid_checkpoint(out: Path) -> Path | None:
    """The newest checkpoint of the run in ``out`` that passes its checks (None when none)."""
    try:
        return resolve_checkpoint(out, log=lambda line: print(line, flush=True))
    except CheckpointError:
        return None


def train_from_argv(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``train.py`` flags and run; returns the run's summary. A stopped run says how to
    continue it here, where ``--resume`` is this command's (an experiment that trains says its
    own way: rerun it)."""
    spec = spec_from_argv(argv)
    summary = train(spec)
    if summary["stopped_by"] and int(os.environ.get("RANK", "0")) == 0:
        print(f"resume with --resume {spec.out}", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Train; a user error prints one line and returns 2, a diverged run returns 3, a run
    stopped by a signal (with its checkpoint saved) returns ``REQUEUE_STATUS`` (75)."""
    try:
        summary, status = result_or_status(lambda: train_from_argv(argv))
        if status == 0 and summary["stopped_by"]:
            return REQUEUE_STATUS  # saved and stopped: the job may be started again
        return status
    except TrainingDiverged as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    finally:
        release_process_group()
