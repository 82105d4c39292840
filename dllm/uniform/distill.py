"""Discrete consistency distillation (Duo's DCD) of a uniform-state diffusion (``udm``) run.

    duolm distill runs/udm runs/udm-dcd --rounds 5 --steps-per-round 200
    duolm sample runs/udm-dcd --steps 4

The student starts as the run's model; the teacher is a frozen copy of the student, refreshed at
the start of every round. A training pair is two noised rows at times t and s = t - dt made from
ONE Gaussian noise: each scored token gets latents w_u = a(gamma_u) onehot(x) + s(gamma_u) eps at
both times with the same eps, and z_u = argmax(w_u) (``dllm.uniform.curriculum``), gamma_u chosen
so that the argmax has the udm schedule's alpha(u) (the inverse of the Gaussian alpha map). So
each of z_t, z_s is an exact sample of the forward process at its time, and the two are coupled:
most tokens agree, and the ones that differ are those the reverse step from t to s would move.
The student reads z_t (at time t) and is trained to give the distribution the teacher gives at
z_s (time s), by KL(student || teacher) over the support (Duo's default, ``kl-bwd``): one student
step covers what took the teacher a step from a less noisy point.

dt doubles every round: dt_r = 2^r / base_steps (Duo: base 512 over 5 rounds). Round r makes
the student consistent over jumps of dt_r, i.e. for a sampler of base_steps / 2^r steps; we
default to base_steps = 64 and 5 rounds, which ends at 4 steps, the few-step end of our
measurements. t is drawn stratified over the batch from [t_eps, 1] and moved to min(t + dt, 1),
so s >= t_eps (Duo's clip).

The output is a run folder like any other (``checkpoints/step_N`` with the tokenizer and the
run's configs; the weights only: it does not resume as a training run) whose state records
``distilled``: the teacher checkpoint, the rounds, dt per round and the sampler step counts the
student was distilled for; ``duolm sample`` notes when asked for another step count.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dllm.noise import stratified_times
from dllm.uniform.curriculum import GammaOfAlpha, coupled_states, row_normals
from dllm.uniform.objective import alpha, support_ids, support_index
from shared import checkpoint as ckpt
from shared.cli_args import (
    CommandParser,
    DefaultsHelpFormatter,
    device_argument,
    seed_argument,
    set_threads,
)
from shared.data.corpus import load_corpus
from shared.data.rows import EpochSampler, tokenize_corpus
from shared.door import read_json_file, write_atomic
from shared.errors import ConfigError, report_user_errors
from shared.files import cache_folder
from shared.objective import loss_positions
from shared.training.provenance import record_made_in_one_piece, started_segment
from shared.training.run_folder import (
    RunFolderLock,
    contents,
    mark_folder,
    move_aside,
    output_folder_is_used,
    what_it_holds,
)
from shared.training.unfinished import removed_if_unfinished
from shared.validation import noise_generator


@dataclass(frozen=True)
class DistillConfig:
    rounds: int = 5
    steps_per_round: int = 200
    lr: float = 6e-5
    batch_size: int = 0  # 0: the run's own batch size
    base_steps: int = 64
    t_eps: float = 1e-3
    grad_clip: float = 1.0
    seed: int = 0

    def validate(self) -> DistillConfig:
        for name in ("rounds", "steps_per_round", "base_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')}={getattr(self, name)} must be >= 1")
        if self.batch_size < 0 or self.seed < 0:
            raise ConfigError("--batch-size and --seed must be >= 0")
        if not self.lr > 0:
            raise ConfigError(f"--lr={self.lr} must be > 0")
        if self.base_steps % 2 ** (self.rounds - 1):
            raise ConfigError(
                f"--base-steps={self.base_steps} must be a multiple of 2^(rounds - 1) = "
                f"{2 ** (self.rounds - 1)}: round r trains for base_steps / 2^r sampler steps"
            )
        return self

    def dt(self, round_index: int) -> float:
        return 2**round_index / self.base_steps

    def trained_for(self) -> list[int]:
        """The sampler step count each round's dt corresponds to (one step per dt)."""
        return [self.base_steps // 2**r for r in range(self.rounds)]


def check_paths(run: Path, out: Path, overwrite: bool = False) -> None:
    """Refuse, before anything is read or written, an output folder that may not take the
    student: one inside the run it distils, or one ``claim_output_folder`` refuses (in use by a
    live run or compare, inside another run's ``checkpoints/``, or holding files without
    ``--overwrite``)."""
    inside = out.resolve().is_relative_to(run.resolve()) if run.is_dir() else False
    if inside:
        raise ConfigError(f"{out} is the run {run} or inside it; write the student elsewhere")
    output_folder_is_used(out, overwrite, "distill", [run])


def claim_locked_folder(out: Path, overwrite: bool, run: Path) -> str | None:
    """Under ``out``'s lock, after ``check_paths`` passed: with ``overwrite``, move what is there
    aside (returns where); a folder that took files since the check refuses without it."""
    if not contents(out):
        return None
    if not overwrite:
        raise ConfigError(
            f"{out} already holds {what_it_holds(out)}; distill into a new folder, or pass "
            "--overwrite to move what is there aside (not deleted)"
        )
    return move_aside(out, [run])


def training_rows(state: dict, tokenizer, cache_dir: str | None) -> torch.Tensor:
    """The run's training rows, tokenized into ``cache_dir`` or duolm's cache: never into the
    folder a run's state names, which came with the run from wherever it was made."""
    config = state["train_config"]
    corpus = load_corpus(
        config["dataset"],
        text_field=config["text_field"],
        val_dataset=config["val_dataset"] or None,
    )
    splits = tokenize_corpus(
        corpus,
        tokenizer,
        protocol=config["protocol"],
        seq_len=config["seq_len"],
        cache_dir=cache_folder(cache_dir),
    )
    return splits["train"].tokens


def pair_loss(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    tokens: torch.Tensor,
    t: torch.Tensor,
    s: torch.Tensor,
    seeds: torch.Tensor,
    gamma_of: GammaOfAlpha,
    pad_id: int,
) -> torch.Tensor:
    """Mean over scored tokens of KL(student at z_t || teacher at z_s)."""
    device = tokens.device
    n_support = student.config.vocab_size - 1
    scored = loss_positions(tokens, pad_id)
    rows = scored.nonzero()[:, 0]
    eps = row_normals(seeds, scored, n_support, device)
    gamma_t, gamma_s = (gamma_of(alpha(u))[rows.cpu()].to(device) for u in (t, s))
    z_t, z_s = coupled_states(support_index(tokens[scored], pad_id), gamma_t, gamma_s, eps)
    noised_t, noised_s = tokens.clone(), tokens.clone()
    noised_t[scored], noised_s[scored] = support_ids(z_t, pad_id), support_ids(z_s, pad_id)
    support = support_ids(torch.arange(n_support, device=device), pad_id)
    with torch.no_grad():
        target = teacher(noised_s, "bidirectional", scored, time=s.float().to(device))
        log_teacher = torch.log_softmax(target[:, support].float(), -1)
    logits = student(noised_t, "bidirectional", scored, time=t.float().to(device))
    log_student = torch.log_softmax(logits[:, support].float(), -1)
    return (log_student.exp() * (log_student - log_teacher)).sum(-1).mean()


def distill(
    run: Path,
    out: Path,
    config: DistillConfig,
    *,
    device: torch.device | str = "cpu",
    cache_dir: str | None = None,
    overwrite: bool = False,
    log=print,
) -> dict:
    """Distil the udm run ``run`` into a new run folder ``out``; returns the ``distilled``
    record. Bad input raises before anything is written; ``out`` is locked (as a training run
    locks its folder) from before the teacher loads until the student is written, and a
    distillation that fails leaves nothing of it there."""
    config.validate()
    run, out = Path(run), Path(out)
    check_paths(run, out, overwrite)
    source = ckpt.resolve_checkpoint(run)
    state = ckpt.read_state(source)
    if state.get("objective") != "udm":
        raise ConfigError(
            f"{run} is an {state.get('objective')!r} run; discrete consistency distillation "
            "applies to uniform-state diffusion (objective udm) runs"
        )
    # Taking the lock makes the folder: one that cannot be written refuses here, in a moment,
    # not after the distillation.
    lock = RunFolderLock(out).acquire()
    try:
        aside = claim_locked_folder(out, overwrite, run)
        if aside:
            log(f"moved what was in {out} aside to {aside}")
        started = started_segment(0)  # the code it trains under, checked once it is done
        student, tokenizer, losses, record = distilled_student(
            source, state, config, device, cache_dir, log
        )
        with removed_if_unfinished(out):
            write_run(out, run, student.eval(), tokenizer, state, record, losses)
            record_made_in_one_piece(out, started, len(losses), source)
            mark_folder(out, "run")
    finally:
        lock.release()
    log(f"wrote {out}: a student distilled for {record['trained_for_steps']} sampler steps")
    return record


def distilled_student(
    source: Path,
    state: dict,
    config: DistillConfig,
    device: torch.device | str,
    cache_dir: str | None,
    log,
) -> tuple[torch.nn.Module, object, list[dict], dict]:
    """(the student, its tokenizer, the per-step losses, the ``distilled`` record) of the
    checkpoint ``source``."""
    student, tokenizer, _ = ckpt.load_model_from_checkpoint(source, device)
    rows = training_rows(state, tokenizer, cache_dir)
    batch_size = config.batch_size or state["train_config"]["batch_size"]
    teacher = copy.deepcopy(student).eval().requires_grad_(False)
    student.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=config.lr, weight_decay=0.0)
    gamma_of = GammaOfAlpha(student.config.vocab_size - 1)
    sampler = EpochSampler(len(rows), config.seed)
    losses = []
    for round_index in range(config.rounds):
        teacher.load_state_dict(student.state_dict())  # refreshed each round
        dt = config.dt(round_index)
        for inner in range(config.steps_per_round):
            step = round_index * config.steps_per_round + inner
            batch = torch.as_tensor(rows[sampler.indices(step * batch_size, batch_size)])
            generator = noise_generator(config.seed, step)
            t = (stratified_times(batch_size, generator, config.t_eps) + dt).clamp(max=1.0)
            seeds = torch.randint(0, 2**62, (batch_size,), generator=generator)
            loss = pair_loss(
                student, teacher, batch.long().to(device), t, t - dt, seeds, gamma_of,
                tokenizer.pad_id,
            )  # fmt: skip
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), config.grad_clip)
            optimizer.step()
            losses.append(
                {"step": step + 1, "round": round_index, "dt": dt, "kl": float(loss.detach())}
            )
        log(
            f"distill round {round_index + 1}/{config.rounds}: dt={dt:g}, kl={losses[-1]['kl']:.4f}"
        )
    record = {
        "teacher": str(source),
        "teacher_step": state["step"],
        "dt": [config.dt(r) for r in range(config.rounds)],
        "trained_for_steps": config.trained_for(),
        "loss": "KL(student at z_t || teacher at z_s), one Gaussian noise for both",
        **asdict(config),
        "batch_size": batch_size,
    }
    return student, tokenizer, losses, record


def write_run(out: Path, run: Path, model, tokenizer, state, record, losses) -> None:
    """The run folder's files, each whole (the checkpoint in one rename, the records by
    ``write_atomic``), with the modes the user's umask gives, as every other writer's; the
    checkpoint goes last, so a folder without one never looks like a finished student."""
    steps = len(losses)
    student_state = {
        key: value for key, value in state.items() if key not in ("step", "schedule_history")
    }
    student_state |= {"total_steps": steps, "distilled": record}
    config_file = run / "config.json"
    config = read_json_file(config_file) if config_file.is_file() else {}
    config = config if isinstance(config, dict) else {}
    write_atomic(out / "config.json", json.dumps({**config, "distilled": record}, indent=2))
    write_atomic(out / "metrics.jsonl", "".join(json.dumps(x) + "\n" for x in losses))
    ckpt.save_checkpoint(
        out / "checkpoints",
        steps,
        weights=ckpt.full_model_state(model),
        tokenizer=tokenizer,
        state=student_state,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        description="Discrete consistency distillation (Duo's DCD) of a udm run into a new run "
        "folder for few-step sampling.",
        formatter_class=DefaultsHelpFormatter,
    )
    defaults = DistillConfig()
    parser.add_argument("run", help="the udm run folder (or checkpoint) to distil")
    parser.add_argument("out", help="the new run folder for the student (new or empty)")
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="teacher refreshes")
    parser.add_argument("--steps-per-round", type=int, default=defaults.steps_per_round)
    parser.add_argument("--lr", type=float, default=defaults.lr, help="AdamW learning rate")
    parser.add_argument("--batch-size", type=int, default=0, help="rows per step; 0 = the run's")
    parser.add_argument(
        "--base-steps", type=int, default=defaults.base_steps,
        help="dt of round r is 2^r / base-steps (the student ends at base/2^(rounds-1) steps)",
    )  # fmt: skip
    parser.add_argument("--seed", type=seed_argument, default=0, help="data order and noise")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = default")
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="where the run's rows are tokenized (default: duolm's cache, $DUOLM_CACHE or "
        "~/.cache/duolm; never the folder the run's own state names)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="distil into a folder duolm made before, moving what is there aside (not deleted)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def job() -> None:
        config = DistillConfig(
            rounds=args.rounds,
            steps_per_round=args.steps_per_round,
            lr=args.lr,
            batch_size=args.batch_size,
            base_steps=args.base_steps,
            seed=args.seed,
        ).validate()
        set_threads(args.threads)
        device = device_argument(args.device)
        distill(
            Path(args.run),
            Path(args.out),
            config,
            device=device,
            cache_dir=args.cache_dir,
            overwrite=args.overwrite,
        )

    return report_user_errors(job)


if __name__ == "__main__":
    sys.exit(main())
