"""Finding: Eso-LM's likelihood moves from the masked diffusion model's toward the autoregressive
model's as alpha_0 (the share its diffusion phase reveals) falls (Eso-LM's Table 1 ordering).
Every seed trains Eso-LM at each alpha_0 on the same preset, steps, batch, data and seed, beside
an AR and an MDM run at the same budget for reference; the verdict reads the paired NELBO
differences between successive alpha_0."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eval.curves import entropy_of_counts
from eval.experiments.stages import Stages, load, train_or_reuse, validation_rows
from eval.findings.common import (
    Claim,
    Finding,
    FindingResult,
    Job,
    finish_report,
    rule_text,
    start_report,
)
from eval.findings.verdicts import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Interval,
    LearnedCheck,
    paired_difference,
)
from eval.report import Table

CLAIM = Claim(
    "Eso-LM between masked diffusion and AR",
    "Eso-LM's validation NELBO falls from the masked diffusion model's toward the "
    "autoregressive model's as alpha_0 falls (OpenWebText perplexity after 250K steps: Eso-LM "
    "alpha_0 = 1 / 0.5 / 0.25 / 0.125: 30.06 / 27.94 / 24.71 / 21.92; MDLM 25.19; AR 17.90).",
    "Sahoo et al. 2025 (Eso-LM, arXiv 2506.01928), Table 1",
)
# Declared before any run (hashed into the registration).
RULE = {
    "order": "the paired NELBO difference between each alpha_0 and the next smaller one has its "
    "95% t interval over seeds entirely above 0",
    "plateau_margin": 0.1,  # every Eso-LM run this far below the unigram entropy, every seed
    "references": "AR and MDM at the same budget: context, not part of the verdict",
}


@dataclass(frozen=True)
class EsoSettings:
    seeds: tuple[int, ...]
    preset: str
    alphas: tuple[float, ...]  # largest first
    overrides: dict[str, Any] = field(default_factory=dict)


SETTINGS = {
    "smoke": EsoSettings((0, 1), "smoke", (1.0, 0.25), dict(max_steps=30, eval_every=30)),
    # The smoke model (BPE 512, 64-token rows, full attention: Eso's permuted rows take no
    # sliding window, so the windowed demo preset cannot train it) for 1000 steps.
    "cpu": EsoSettings((0, 1, 2), "smoke", (1.0, 0.5, 0.25), dict(max_steps=800, eval_every=400)),
    # Eso-LM's setting: OpenWebText rows of 1024 tokens.
    "gpu": EsoSettings(
        (0, 1, 2),
        "owt-small",
        (1.0, 0.5, 0.25, 0.125),
        dict(seq_len=1024, max_seq_len=1024, max_steps=50000),
    ),
}


def run_names(settings: EsoSettings) -> dict[str, dict[str, Any]]:
    """Each seed's runs by name: the references, then Eso-LM at each alpha_0."""
    names = {"ar": {"objective": "ar"}, "mdm": {"objective": "mdm"}}
    for alpha_0 in settings.alphas:
        names[f"eso-{alpha_0:g}"] = {"objective": "eso", "alpha_0": alpha_0}
    return names


def run_start(settings: EsoSettings, seed: int, name: str) -> dict[str, Any]:
    return settings.overrides | {"curve_points": 0, "seed": seed} | run_names(settings)[name]


def runs(settings: EsoSettings) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every run this finding trains (for the registration), as ``run`` starts them."""
    return {
        f"seed-{seed}/{name}": (settings.preset, run_start(settings, seed, name))
        for seed in settings.seeds
        for name in run_names(settings)
    }


def train_seed(settings: EsoSettings, folder: Path, seed: int, job: Job) -> dict[str, float]:
    """One seed's runs, reused when finished: each one's final validation loss."""
    losses = {}
    for name in run_names(settings):
        start = run_start(settings, seed, name)
        defining = {k: v for k, v in start.items() if k in ("objective", "alpha_0")}
        overrides = {k: v for k, v in start.items() if k not in defining} | job.extra
        summary = train_or_reuse(
            name, folder / name, settings.preset, defining, overrides, job.force
        )
        losses[name] = summary["val_nats_per_token"]
    return losses


def run(settings: EsoSettings, job: Job) -> FindingResult:
    stages = Stages(job.out, job.force, job.stop)
    trained = {
        seed: train_seed(settings, job.out / f"seed-{seed}", seed, job) for seed in settings.seeds
    }
    first = job.out / f"seed-{settings.seeds[0]}"
    unigram = stages.run("unigram", {}, lambda: validation_unigram_entropy(first))
    return judge(job.scale, settings, trained, unigram, job.out)


def validation_unigram_entropy(folder: Path) -> float:
    """The entropy (nats) of the validation tokens' frequencies: a unigram model's loss."""
    _, tokenizer, state = load(folder, "ar")
    targets = validation_rows(state, tokenizer)[:, 1:]
    return entropy_of_counts(np.bincount(targets[targets != tokenizer.pad_id].ravel()))


def order_verdict(steps: list[Interval]) -> str:
    """Reproduced: every step down in alpha_0 lowers the NELBO (each paired interval above 0);
    not reproduced: some step raises it (an interval entirely below 0)."""
    if any(step.high < 0 for step in steps):
        return NOT_REPRODUCED
    return REPRODUCED if all(step.low > 0 for step in steps) else INCONCLUSIVE


def steps_down(settings: EsoSettings, trained: dict[int, dict[str, float]]):
    """(label, paired interval of NELBO(larger alpha_0) - NELBO(next smaller)) per step."""
    names = [f"eso-{a:g}" for a in settings.alphas]
    seeds = list(trained)
    return [
        (
            f"alpha_0 {high[4:]} - {low[4:]}",
            paired_difference([trained[s][high] for s in seeds], [trained[s][low] for s in seeds]),
        )
        for high, low in zip(names, names[1:])
    ]


def losses_table(trained: dict[int, dict[str, float]], steps) -> Table:
    names = list(next(iter(trained.values())))
    rows = [[name, *(f"{trained[seed][name]:.4f}" for seed in trained)] for name in names]
    blank = [""] * (len(trained) - 1)
    rows += [[f"difference {label}", *blank, step.text(4)] for label, step in steps]
    return Table(
        "Final validation loss (nats/token; NELBO for the diffusion runs, NLL for the AR)",
        ["run", *(f"seed {seed}" for seed in trained)],
        rows,
        note="Differences: paired over seeds, 95% t interval (last column).",
    )


def learned_checks(trained: dict[int, dict[str, float]], unigram: float) -> list[LearnedCheck]:
    """Every Eso-LM run's final validation loss below the unigram plateau, in every seed (the
    AR and MDM references are context: the verdict does not read them)."""
    margin = RULE["plateau_margin"]
    names = [name for name in next(iter(trained.values())) if name.startswith("eso-")]
    return [
        LearnedCheck(
            name.upper(),
            f"final validation loss more than {margin} nats below the unigram entropy "
            f"{unigram:.3f}, every seed",
            ", ".join(f"{per_seed[name]:.3f}" for per_seed in trained.values()),
            all(per_seed[name] < unigram - margin for per_seed in trained.values()),
        )
        for name in names
    ]


def judge(
    scale: str,
    settings: EsoSettings,
    trained: dict[int, dict[str, float]],
    unigram: float,
    out: Path,
) -> FindingResult:
    rules = rule_text("seeds", "learned") + [
        f"**Rule (order).** {RULE['order']}: *reproduced* when every step down in alpha_0 "
        "lowers the NELBO; *not reproduced* when some step's interval lies entirely below 0; "
        f"*inconclusive* otherwise. {RULE['references']}."
    ]
    report = start_report(FINDING, scale, out, settings, rules)
    steps = steps_down(settings, trained)
    report.table(losses_table(trained, steps))
    verdict = order_verdict([step for _, step in steps])
    return finish_report(
        report,
        FINDING,
        scale,
        measured="; ".join(f"NELBO {label}: {step.text(3)} nats/token" for label, step in steps),
        verdict=verdict,
        rule="each step down in alpha_0 lowers the NELBO: every paired 95% t interval above 0",
        checks=learned_checks(trained, unigram),
        numbers={
            "runs": {str(seed): losses for seed, losses in trained.items()},
            "steps": {label: step.as_dict() for label, step in steps},
            "unigram": unigram,
        },
    )


FINDING = Finding(
    "eso-alpha-0",
    CLAIM,
    SETTINGS,
    run,
    gpu_wall="about 75 GPU-hours (3 seeds x 6 runs x 50k steps at 1024 tokens)",
    rule=RULE,
    gpu_budget="GPT-2 small shapes on OpenWebText, 50k steps at 1024 tokens, 3 seeds",
    cost="3 seeds x 5 runs of 1000 steps (AR, MDM, Eso-LM at alpha_0 1, 0.5, 0.25)",
    runs=runs,
)
