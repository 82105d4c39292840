"""Finding: at equal training compute masked diffusion (MDM) reaches a lower validation NELBO than
uniform-state diffusion (UDM), but at few sampling steps the uniform model's samples are better
(Duo). Both halves are measured on one pair of runs per seed (same preset, steps, batch, data and
seed); the sample half judges both models' samples with the judge and rules of
``eval.findings.sample_quality``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral
from dllm.uniform.sampler import UniformSamplerConfig
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
from eval.findings.sample_quality import (
    ENTROPY_TOLERANCE,
    LENGTH_TOLERANCE,
    judge_all,
    merge_seeds,
    ordered,
)
from eval.findings.verdicts import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    Interval,
    LearnedCheck,
    combine,
    direction_verdict,
    paired_difference,
)
from eval.report import Table

CLAIM = Claim(
    "Uniform vs masked diffusion",
    "At equal training compute masked diffusion reaches a lower validation NELBO than "
    "uniform-state diffusion (perplexity LM1B / OWT at ~170M parameters: MDLM 27.0 / 23.2, "
    "Duo 29.9 / 25.2, UDLM 31.3 / 27.4); at few sampling steps (<= 16) the uniform model's "
    "samples have a lower generative perplexity, at comparable entropy, than the masked "
    "model's at the same number of steps, both sampled ancestrally without a greedy last step "
    "(8 steps: Duo+DCD 111.9 vs MDLM+SDTT 193.1; those are distilled models, tested here "
    "undistilled).",
    "Sahoo et al. 2025 (Duo, arXiv 2506.10892); Sahoo et al. 2026 (arXiv 2602.15014)",
)
MODELS = ("mdm", "udm")
# Declared before any run (hashed into the registration).
RULE = {
    "entropy_tolerance": ENTROPY_TOLERANCE,
    "length_tolerance": LENGTH_TOLERANCE,
    "plateau_margin": 0.1,
    "flops_tolerance": 0.01,
    "eos": "stop",  # both models' samples end at their first EOS
    # The same tail for both: a greedy last step lowers the entropy (and the judge's perplexity)
    # by about the entropy check's own 5%, so giving it to one family only decides the verdict.
    "tail": "no greedy last step for either family",
    "mdm_sampler": "ancestral, one network evaluation per step (no reused predictions)",
    "udm_sampler": "ancestral, one network evaluation per step",
    "distilled": "neither model is distilled; the claim is tested as the undistilled ordering",
}


@dataclass(frozen=True)
class DualitySettings:
    seeds: tuple[int, ...]
    preset: str
    samples: int  # per seed, model and step count
    gen_length: int
    few_steps: tuple[int, ...]  # the step counts the verdict compares (full steps: context)
    judge: str = "smollm2"
    overrides: dict[str, Any] = field(default_factory=dict)


SETTINGS = {
    "smoke": DualitySettings((0, 1), "smoke", 4, 16, (2, 4), overrides=dict(max_steps=40)),
    # The demo recipe at its own 320 steps; 54 samples per seed and set (162 per set), as the
    # sample-quality finding's cpu scale.
    "cpu": DualitySettings((0, 1, 2), "demo", 54, 64, (8, 16)),
    # The papers' setting: OpenWebText rows of 1024 tokens, GPT-2-large judge (needs the hub);
    # BOS and 1023 generated tokens fill one 1024-token row.
    "gpu": DualitySettings(
        (0, 1, 2),
        "owt-small",
        256,
        1023,
        (8, 16),
        judge="gpt2-large",
        overrides=dict(seq_len=1024, max_seq_len=1024, max_steps=50000),
    ),
}


def run_start(settings: DualitySettings, seed: int, objective: str) -> dict[str, Any]:
    """The overrides of one run: the same for both models but the objective (udm keeps its
    defaults, Duo's curriculum for the first half of the steps among them)."""
    return settings.overrides | {"curve_points": 0, "seed": seed, "objective": objective}


def runs(settings: DualitySettings) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every run this finding trains (for the registration), as ``run`` starts them."""
    return {
        f"seed-{seed}/{objective}": (settings.preset, run_start(settings, seed, objective))
        for seed in settings.seeds
        for objective in MODELS
    }


def train_pair(settings: DualitySettings, folder: Path, seed: int, job: Job) -> dict[str, Any]:
    """One seed's MDM and UDM runs, reused when finished: their final validation NELBO on the
    whole validation split and their training FLOPs (tokens seen x FLOPs per token)."""
    trained = {}
    for objective in MODELS:
        start = run_start(settings, seed, objective)
        overrides = {k: v for k, v in start.items() if k != "objective"} | job.extra
        summary = train_or_reuse(
            objective,
            folder / objective,
            settings.preset,
            {"objective": objective},
            overrides,
            job.force,
        )
        trained[objective] = {
            "nelbo": summary["val_nats_per_token"],
            "flops": summary["tokens_seen"] * summary["flops_per_token"],
            "step": summary["step"],
        }
    return trained


def run(settings: DualitySettings, job: Job) -> FindingResult:
    stages = Stages(job.out, job.force, job.stop)
    trained, per_seed = {}, {}
    for seed in settings.seeds:
        folder = job.out / f"seed-{seed}"
        trained[seed] = train_pair(settings, folder, seed, job)
        key = {
            "steps": {k: v["step"] for k, v in trained[seed].items()},
            "settings": repr(settings),
        }
        sets = stages.run(
            f"samples-seed{seed}", key, lambda f=folder, s=seed: sample_all(f, settings, s)
        )
        per_seed[seed] = stages.run(
            f"judge-seed{seed}", key, lambda sets=sets: judge_all(sets, settings)
        )
    first = job.out / f"seed-{settings.seeds[0]}"
    unigram = stages.run("unigram", {}, lambda: validation_unigram_entropy(first))
    judged = {"judge": per_seed[settings.seeds[0]]["judge"], "sets": merge_seeds(per_seed)}
    return judge(job.scale, settings, {"runs": trained, "unigram": unigram}, judged, job.out)


def validation_unigram_entropy(folder: Path) -> float:
    """The entropy (nats) of the validation split's token frequencies at its loss positions:
    what a model that learned only unigram statistics would score."""
    _, tokenizer, state = load(folder, "mdm")
    targets = validation_rows(state, tokenizer)[:, 1:]
    return entropy_of_counts(np.bincount(targets[targets != tokenizer.pad_id].ravel()))


def sampler(objective: str, steps: int) -> SamplerConfig | UniformSamplerConfig:
    """The ancestral sampler of each family at ``steps`` network evaluations (T=1, float64
    draws), the same tail for both (``RULE["tail"]``: no greedy last step), every step evaluated
    for the MDM (its prediction cache would skip unchanged canvases and spend fewer)."""
    if objective == "udm":
        return UniformSamplerConfig(steps, greedy_tail=False)
    return SamplerConfig(Ancestral(steps), reuse_predictions=False)


def sample_all(out: Path, settings: DualitySettings, seed: int = 0) -> dict[str, Any]:
    """Unconditional samples of ``gen_length`` tokens from both models at each few step count
    and at full steps (one per generated position), each cut at its first EOS."""
    sets: dict[str, Any] = {}
    for objective in MODELS:
        model, tokenizer, state = load(out, objective)
        generator = DiffusionGenerator(model, tokenizer, state)
        canvas = generator.prompt_canvas([[]] * settings.samples, settings.gen_length)
        for steps in (*settings.few_steps, settings.gen_length):
            config = sampler(objective, steps)
            result = generator.fill(canvas, config, seed=seed, eos=RULE["eos"])
            sets[f"{objective.upper()} {steps} steps"] = {
                "model": objective.upper(),
                "steps": steps,
                "nfe": result.nfe,
                "few": steps in settings.few_steps,
                "texts": result.texts,
                "ids": result.tokens,
            }
    return sets


def few_step_verdict(udm: dict[str, Any], mdm: dict[str, Any]) -> str:
    """'UDM's judge perplexity below MDM's' by the direction rule, with the entropy check on the
    side that wins: a lead bought with more than ENTROPY_TOLERANCE lower sample entropy is
    inconclusive, for either model."""
    verdict = ordered(udm, mdm)  # inconclusive when UDM wins with cheap entropy
    if verdict == NOT_REPRODUCED and ordered(mdm, udm) == INCONCLUSIVE:
        return INCONCLUSIVE  # MDM's lead is separated but bought with repetition
    return verdict


def nelbo_verdict(trained: dict[int, dict[str, Any]]) -> tuple[Interval, str]:
    """The paired difference d_s = NELBO_mdm - NELBO_udm over seeds and 'd < 0' by the
    direction rule against 0."""
    seeds = list(trained)
    difference = paired_difference(
        [trained[s]["mdm"]["nelbo"] for s in seeds], [trained[s]["udm"]["nelbo"] for s in seeds]
    )
    return difference, direction_verdict(difference, Interval(0.0, 0.0, 0.0))


def unequal_compute(trained: dict[int, dict[str, Any]]) -> list[str]:
    """A note per seed whose two runs' training FLOPs differ by more than the tolerance."""
    tolerance = RULE["flops_tolerance"]
    notes = []
    for seed, pair in trained.items():
        mdm, udm = pair["mdm"]["flops"], pair["udm"]["flops"]
        if abs(mdm - udm) > tolerance * max(mdm, udm):
            notes.append(
                f"Unequal training compute in seed {seed}: MDM {mdm:.4g} vs UDM {udm:.4g} FLOPs "
                f"(more than {tolerance:.0%} apart), so the finding is *{INCONCLUSIVE}*."
            )
    return notes


def rules(settings: DualitySettings) -> list[str]:
    """The rules the report states before its numbers."""
    steps = ", ".join(str(k) for k in settings.few_steps)
    return rule_text("seeds", "learned", "direction") + [
        "**Runs.** Per seed one MDM and one UDM run from the same preset, steps, batch, data "
        "and seed (UDM with its defaults, Duo's Gaussian curriculum for the first half of the "
        "steps among them). Equal training compute: each pair's training FLOPs (tokens seen "
        f"x FLOPs per token, from the runs' summaries) within {RULE['flops_tolerance']:.0%}; "
        "otherwise the finding is *inconclusive*.",
        "**(a) Likelihood.** d_s = NELBO_MDM - NELBO_UDM, the final validation nats/token on "
        "the whole validation split, paired by seed. *Reproduced* if the 95% t interval of "
        "the mean of d_s lies entirely below 0, *not reproduced* if entirely above 0, "
        "*inconclusive* otherwise.",
        f"**(b) Few-step samples.** At each of {steps} steps: {settings.gen_length} tokens, "
        "unconditional, T=1, float64 noise, the same number of samples per model and seed; "
        "both models sampled ancestrally with the same tail (no greedy last step for either: "
        "Duo's greedy tail lowers entropy by about the entropy check's own margin); equal "
        "NFE: one network evaluation per step for both (the MDM does not reuse predictions). "
        "Both models' samples end at their first EOS (mean length and the share of empty "
        "samples reported). Quantity: the log judge perplexity as in the sample-quality "
        "finding (token-weighted: the judge's nats summed over all seeds' samples / its tokens "
        "summed over them, empty samples left out and counted; interval the union of the "
        "delta method's interval over samples and the t interval over the seeds' values). UDM "
        "below MDM by the direction rule; if the winning side's mean sample entropy is more "
        f"than {ENTROPY_TOLERANCE:.0%} below the other's (perplexity bought with repetition) "
        f"or its mean length more than {LENGTH_TOLERANCE:.0%} shorter (bought with brevity), "
        "that step count is *inconclusive*. Full steps (one per generated token) are "
        "reported for context, outside the verdict.",
        "**Verdict.** Parts (a) and each step count of (b) combined: *reproduced* only if "
        "every part is, *not reproduced* if any part is reversed with separated intervals. "
        f"Learned checks: each model's final validation loss more than {RULE['plateau_margin']} "
        "nats below the unigram entropy of the validation tokens, in every seed.",
        "**Scale.** Neither model here is distilled (the paper's 8-step numbers are: the claim "
        "is tested as the ordering before distillation), and the models are far smaller "
        "than the papers' ~170M parameters: a *not reproduced* at the "
        "`cpu` scale is a result at this scale, not a refutation of the papers.",
    ]


def nelbo_table(trained: dict[int, dict[str, Any]], difference: Interval) -> Table:
    rows = [
        [
            seed,
            pair["mdm"]["nelbo"],
            pair["udm"]["nelbo"],
            pair["mdm"]["nelbo"] - pair["udm"]["nelbo"],
            f"{pair['mdm']['flops']:.4g}",
            f"{pair['udm']['flops']:.4g}",
        ]
        for seed, pair in trained.items()
    ]
    rows.append(["mean (95% t interval)", "", "", difference.text(3), "", ""])
    return Table(
        "(a) Final validation NELBO per seed (nats/token, whole validation split)",
        ["seed", "MDM", "UDM", "d_s = MDM - UDM", "MDM training FLOPs", "UDM training FLOPs"],
        rows,
        note="The claim is d < 0 (the MDM's NELBO lower).",
    )


def sets_table(settings: DualitySettings, judged: dict[str, Any]) -> Table:
    rows = []
    for name, entry in judged["sets"].items():
        interval = Interval(**entry["log_ppl"])
        rows.append(
            [
                name,
                entry["nfe"],
                entry["samples"],
                f"{math.exp(interval.value):.1f}",
                f"[{math.exp(interval.low):.1f}, {math.exp(interval.high):.1f}]",
                entry["unigram_entropy"],
                entry["repetition_rate_4gram"],
                entry["mean_length"],
                f"{entry.get('empty_share', math.nan):.0%}",
                "yes" if entry["few"] else "context",
            ]
        )
    return Table(
        f"(b) Judge perplexity of samples of up to {settings.gen_length} tokens",
        [
            "set",
            "NFE",
            "samples",
            "judge ppl",
            "95% interval",
            "sample entropy",
            "4-gram repetition",
            "mean length",
            "empty",
            "in the verdict",
        ],
        rows,
        note=f"Judge: {judged['judge']}. Perplexity = exp(judge nats / judge tokens, summed over "
        "the samples that hold a token; empty: the share that end at once, left out); "
        f"{settings.samples} samples per seed and set, seeds {list(settings.seeds)}; NFE of "
        "the first seed's set.",
    )


def learned_checks(learned: dict[str, Any]) -> list[LearnedCheck]:
    """Each model's final validation loss below the unigram plateau, in every seed."""
    margin, unigram = RULE["plateau_margin"], learned["unigram"]
    pairs = learned["runs"].values()
    return [
        LearnedCheck(
            objective.upper(),
            f"final validation loss more than {margin} nats below the unigram entropy "
            f"{unigram:.3f} of the validation tokens, every seed",
            ", ".join(f"{pair[objective]['nelbo']:.3f}" for pair in pairs),
            all(pair[objective]["nelbo"] < unigram - margin for pair in pairs),
        )
        for objective in MODELS
    ]


def few_step_parts(settings: DualitySettings, sets: dict[str, Any]) -> dict[int, str]:
    return {
        steps: few_step_verdict(sets[f"UDM {steps} steps"], sets[f"MDM {steps} steps"])
        for steps in settings.few_steps
    }


def judge(
    scale: str,
    settings: DualitySettings,
    learned: dict[str, Any],
    judged: dict[str, Any],
    out: Path,
) -> FindingResult:
    """``learned``: each seed's runs ({"mdm"|"udm": nelbo, flops, step}) and the validation
    unigram entropy; ``judged``: the judge and the merged sample sets."""
    report = start_report(FINDING, scale, out, settings, rules(settings))
    trained, sets = learned["runs"], judged["sets"]
    difference, likelihood = nelbo_verdict(trained)
    samples = few_step_parts(settings, sets)
    report.table(nelbo_table(trained, difference))
    report.table(sets_table(settings, judged))
    compute_notes = unequal_compute(trained)
    verdict = combine([likelihood, *samples.values()])
    verdict = INCONCLUSIVE if compute_notes else verdict
    ppl = {name: math.exp(entry["log_ppl"]["value"]) for name, entry in sets.items()}
    few = "; ".join(
        f"{k} steps UDM {ppl[f'UDM {k} steps']:.0f} vs MDM {ppl[f'MDM {k} steps']:.0f}: {v}"
        for k, v in samples.items()
    )
    return finish_report(
        report,
        FINDING,
        scale,
        measured=f"(a) NELBO MDM - UDM {difference.text(3)} nats/token (paired over seeds): "
        f"{likelihood}; (b) judge ppl {few}",
        verdict=verdict,
        rule="(a) the 95% t interval of NELBO MDM - UDM entirely below 0; (b) at each few step "
        "count UDM's token-weighted judge perplexity interval entirely below MDM's (no greedy "
        f"tail for either), the winner's entropy within {ENTROPY_TOLERANCE:.0%} and mean length "
        f"within {LENGTH_TOLERANCE:.0%}; equal training FLOPs within 1%",
        checks=learned_checks(learned),
        numbers={
            "likelihood": {"difference": difference.as_dict(), "verdict": likelihood},
            "few_steps": {str(k): v for k, v in samples.items()},
            "runs": trained,
            "unigram": learned["unigram"],
            "sets": sets,
        },
        notes=compute_notes,
    )


FINDING = Finding(
    "uniform-vs-masked",
    CLAIM,
    SETTINGS,
    run,
    gpu_wall="about 30 GPU-hours (3 seeds x 2 models x 50k steps at 1024 tokens, plus sampling)",
    rule=RULE,
    gpu_budget="GPT-2 small shapes on OpenWebText, 50k steps at 1024 tokens, 3 seeds",
    cost="3 seeds x 2 runs of 320 steps (MDM, UDM), then 6 sets of 162 samples judged by SmolLM2",
    runs=runs,
    judged_by=("eval.findings.sample_quality",),
)
