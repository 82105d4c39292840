"""The comparison's budget points: each objective measured at several compute budgets, each a run
scheduled for its own budget, for every training seed.

Per seed and objective, one warmup-stable-decay *trunk* trains to the main budget and keeps a
checkpoint where each shorter budget's cooldown starts; a *cooldown branch* per shorter budget
resumes there and decays to its own end (bit for bit the run scheduled for that budget: see
``shared.training.schedule``). Every point is its run's final validation on the whole split.
Layout under the job folder::

    seed-<s>/ar, seed-<s>/mdm                  the trunks (the main budget)
    seed-<s>/budgets/<objective>-<steps>       the branches

The multiplier these points give is ``eval.budgets``' (the compute-gap finding uses the same).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from eval.budgets import (
    HEADLINE_RULES,
    fit_log_log,
    headline_loss,
    multiplier_at,
    multiplier_curve,
    past_plateau,
    seed_spread,
)
from eval.experiments.compare_settings import (
    CompareSettings,
    budget_fractions,
    diffusion_families,
    own_warmup,
)
from eval.experiments.stages import (
    JobStopped,
    check_equal_budgets,
    continue_refused,
    same_settings,
    train_both,
)
from shared.checkpoint import checkpoint_name
from shared.door import read_json_file
from shared.errors import ConfigError
from shared.objective import objective_class
from shared.training import resolve_config, resume_run, train
from shared.training.config import TrainConfig
from shared.training.run_folder import move_aside
from shared.training.schedule import cooldown_start


def seed_folder(out: Path, seed: int) -> Path:
    return out / f"seed-{seed}"


def main_steps(preset: str, overrides: dict[str, Any]) -> int:
    """The main budget in steps (the trunks' length), from a step or token budget."""
    model_cfg, cfg = resolve_config(preset, overrides)
    if cfg.max_flops or cfg.epochs:
        raise ConfigError(
            "the budget points are fractions of a step budget: give the main budget as "
            "--max-steps or --max-tokens (not --max-flops or --epochs)"
        )
    if cfg.max_tokens:
        return max(1, math.ceil(cfg.max_tokens / (cfg.batch_size * cfg.seq_len)))
    return cfg.max_steps


def budget_steps(total: int, fractions: tuple[float, ...]) -> list[int]:
    """The budgets (steps) of an objective: ``fractions`` of the main budget, the main one
    last."""
    return sorted({max(1, round(f * total)) for f in fractions if f < 1} | {total})


def train_budget_points(
    preset: str,
    out: Path,
    overrides: dict[str, Any],
    settings: CompareSettings,
    budget: str,
    force: bool,
    own: dict[str, dict[str, Any]] | None = None,
) -> dict[int, dict[str, Any]]:
    """Train (or reuse) every seed's trunks and branches; returns, per seed, the trunks'
    summaries and each objective's budget points in step order."""
    total = main_steps(preset, overrides)
    objectives = settings.objectives
    plan = {name: budget_steps(total, budget_fractions(settings, name)) for name in objectives}
    schedule = {"lr_schedule": "wsd", "cooldown_fraction": settings.cooldown_fraction}
    warmups = own_settings(settings)
    for name in objectives:
        over = overrides | schedule | (own or {}).get(name, {}) | warmups.get(name, {})
        check_budgets({name: plan[name]}, resolve_config(preset, over)[1])
    results: dict[int, dict[str, Any]] = {}
    for seed in settings.seeds:
        folder = seed_folder(out, seed)
        with_branches = {
            name: (own or {}).get(name, {})
            | warmups.get(name, {})
            | {"branch_budgets": ",".join(str(b) for b in plan[name][:-1])}
            for name in objectives
        }
        trunk_overrides = overrides | schedule | {"seed": seed}
        summaries = train_both(
            preset, folder, trunk_overrides, budget, force, with_branches, objectives
        )
        check_equal_budgets(summaries, budget)
        points = {}
        for name in objectives:
            branches = [
                train_branch(folder / name, folder / "budgets" / f"{name}-{steps}", steps, force)
                for steps in plan[name][:-1]
            ]
            points[name] = [point_record(s) for s in [*branches, summaries[name]]]
        results[seed] = {"summaries": summaries, "points": points}
    return results


def own_settings(settings: CompareSettings) -> dict[str, dict[str, int]]:
    """What an objective trains with instead of the preset's: its own warmup, and block
    diffusion's block size."""
    own: dict[str, dict[str, int]] = {}
    for name in settings.objectives:
        if own_warmup(settings, name):
            own[name] = {"warmup_steps": own_warmup(settings, name)}
        if name == "bd":
            own[name] = own.get(name, {}) | {"block_size": settings.bd_block_size}
    return own


def check_budgets(plan: dict[str, list[int]], cfg: TrainConfig) -> None:
    """Refuse, before any training, budgets whose cooldown would start inside the warmup."""
    for name, steps in plan.items():
        early = [b for b in steps if cooldown_start(b, cfg.cooldown_fraction) < cfg.warmup_steps]
        if early:
            raise ConfigError(
                f"the {name.upper()} budget(s) {early} steps (fractions of the main budget of "
                f"{steps[-1]}) would start their cooldown inside the {cfg.warmup_steps}-step "
                "warmup: raise --max-steps or lower --warmup-steps"
            )


def same_branch_point(recorded: str | None, point: Path) -> bool:
    """Whether a branch's recorded branch point is ``point``, named by its place in the job
    (trunk folder, checkpoints, step) rather than by its spelling: a job given by another
    path, from another working folder, moved or copied still has the same branches."""
    return recorded is not None and Path(recorded).parts[-3:] == point.parts[-3:]


def train_branch(trunk: Path, branch: Path, steps: int, force: bool) -> dict[str, Any]:
    """The run of ``steps`` steps that branches off ``trunk`` at its cooldown start: reused when
    it finished from the trunk's checkpoint, resumed when it was interrupted, else started."""
    trunk_config = read_json_file(trunk / "config.json")["train_config"]
    point = (
        trunk
        / "checkpoints"
        / checkpoint_name(cooldown_start(steps, trunk_config["cooldown_fraction"]))
    )
    final = branch / "final.json"
    if final.is_file() and not force:
        summary = read_json_file(final)
        if summary.get("finished") and same_branch_point(summary.get("branched_from"), point):
            print(f"[train {branch.name}] reusing the finished branch in {branch}")
            return summary | {"reused": True}
    has_checkpoints = (branch / "checkpoints").is_dir() and any((branch / "checkpoints").iterdir())
    if has_checkpoints and not force and same_settings(branch, {"max_steps": steps}):
        try:
            summary = train(resume_run(branch))
        except ConfigError as refused:
            raise ConfigError(continue_refused(branch, refused)) from None
    else:
        if branch.exists():
            move_aside(branch)
        summary = train(resume_run(point, branch, max_steps=steps))
    if summary["stopped_by"]:
        raise JobStopped(
            f"stopped by {summary['stopped_by']} while training the {steps}-step branch in "
            f"{branch} (checkpoint saved); rerun the same command to resume"
        )
    return summary


def point_record(summary: dict[str, Any]) -> dict[str, Any]:
    """One budget point from its run's summary: the final validation on the whole split, and
    what of it an earlier invocation did (reused whole, or the steps before it continued)."""
    return {
        "steps": summary["step"],
        "flops": summary["tokens_seen"] * summary["flops_per_token"],
        "loss": summary["val_nats_per_token"],
        "loss_se": summary.get("val_nats_per_token_se"),
        "bpb": summary["val_bpb"],
        "epochs": summary["epochs_seen"],
        "reused": bool(summary.get("reused")),
        "earlier_steps": earlier_steps(summary),
    }


def earlier_steps(summary: dict[str, Any]) -> int:
    """The steps of a run that an earlier invocation trained: those before the step this one
    continued it from (a branch's steps count from its branch point, the trunk's)."""
    branched = summary.get("branched_from")
    origin = int(branched.rsplit("_", 1)[-1]) if branched else 0
    return max(0, summary.get("start_step", 0) - origin)


def earlier_work(runs: dict[int, dict[str, Any]]) -> list[str]:
    """The training this invocation's wall time does not include: every trunk and branch reused
    whole, and the steps an earlier invocation trained of those this one continued."""
    said = []
    for seed, run in runs.items():
        for name, points in run["points"].items():
            for index, point in enumerate(points):
                trunk = index == len(points) - 1
                what = f"seed {seed} {name}" + ("" if trunk else f" {point['steps']}-step branch")
                if point["reused"]:
                    said.append(f"train {what}")
                elif point["earlier_steps"]:
                    said.append(f"{point['earlier_steps']} steps of train {what}")
    return said


def attention_pattern(objective: str, window: int) -> str:
    """How each position of a model under ``objective`` attends, in words."""
    kind = objective_class(objective).attention
    if not window:
        return f"{kind}, full"
    if kind == "causal":
        return f"causal, window {window} (each position sees itself and the {window - 1} before)"
    return f"{kind}, window {window} (each position sees the {window - 1} on each side)"


def multiplier_analysis(
    runs: dict[int, dict[str, Any]],
    unigram: float,
    settings: CompareSettings,
    family: str = "mdm",
) -> dict[str, Any]:
    """M(L) of the diffusion ``family`` against AR. Per seed: the points past the plateau, the
    headline loss and M there, M over the shared loss range, the log-log exponents; over seeds:
    t-intervals of M, of both exponents and of their paired difference, and of the paired
    final-loss difference."""
    pair = ("ar", family)
    per_seed = {seed: seed_analysis(run, unigram, settings, family) for seed, run in runs.items()}
    measured = [s["multiplier"] for s in per_seed.values() if s["multiplier"] is not None]
    exponents = {
        name: [s["exponents"][name] for s in per_seed.values() if s["exponents"][name]]
        for name in pair
    }
    paired = [
        s["exponents"][family] - s["exponents"]["ar"]
        for s in per_seed.values()
        if s["exponents"][family] and s["exponents"]["ar"]
    ]
    return {
        "family": family,
        "rule": HEADLINE_RULES[settings.headline_rule].replace(
            "the MDM's", f"the {family.upper()}'s"
        ),
        "plateau_margin": settings.plateau_margin,
        "seeds": per_seed,
        "unmeasured_seeds": [seed for seed, s in per_seed.items() if s["multiplier"] is None],
        "multiplier": spread_dict(seed_spread(measured, geometric=True)),
        "fitted_multiplier": spread_dict(
            seed_spread(
                [s["fitted_multiplier"] for s in per_seed.values() if s["fitted_multiplier"]],
                geometric=True,
            )
        ),
        "exponents": {name: spread_dict(seed_spread(v)) for name, v in exponents.items()},
        "exponent_difference": spread_dict(seed_spread(paired)),
        "final_gap": spread_dict(seed_spread([s["final_gap"] for s in per_seed.values()])),
    }


def seed_analysis(
    run: dict[str, Any], unigram: float, settings: CompareSettings, family: str
) -> dict[str, Any]:
    """One seed's M(L) of ``family`` against AR: the points past the plateau, the headline loss
    and M there (interpolated, and from the two log-log fits), M over the shared loss range,
    the exponents, the final-loss difference."""
    frontier = {
        name: [(p["flops"], p["loss"]) for p in run["points"][name]] for name in ("ar", family)
    }
    kept = {
        name: past_plateau(points, unigram, settings.plateau_margin)
        for name, points in frontier.items()
    }
    level = headline_loss(settings.headline_rule, kept["ar"], kept[family])
    fits = {name: fit_log_log(points) for name, points in kept.items()}
    fitted = None  # M at the headline level from the two log-log fits
    if level is not None and fits["ar"] and fits[family]:
        fitted = fits[family].flops_at(level) / fits["ar"].flops_at(level)
    return {
        "past_plateau": {name: len(points) for name, points in kept.items()},
        "headline_loss": level,
        "multiplier": None if level is None else multiplier_at(kept["ar"], kept[family], level),
        "fitted_multiplier": fitted,
        "curve": multiplier_curve(kept["ar"], kept[family]),
        "exponents": {name: None if f is None else f.alpha for name, f in fits.items()},
        "fits": {name: None if f is None else f.__dict__ for name, f in fits.items()},
        "final_gap": frontier[family][-1][1] - frontier["ar"][-1][1],
    }


def family_analyses(
    runs: dict[int, dict[str, Any]], unigram: float, settings: CompareSettings
) -> dict[str, dict[str, Any]]:
    """``multiplier_analysis`` of every diffusion family of the comparison against AR."""
    return {
        family: multiplier_analysis(runs, unigram, settings, family)
        for family in diffusion_families(settings)
    }


def spread_dict(spread) -> dict[str, Any] | None:
    return None if spread is None else spread.__dict__ | {"text": spread.text()}
