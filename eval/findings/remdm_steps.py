"""Finding: at T >= L steps ReMDM's loop improves a masked diffusion model's samples over its
plain ancestral sampler at the same T (ReMDM's Table 1: MAUVE up, generative perplexity down).
Every seed trains one MDM; its samples at T = L and T = 2L are drawn by both samplers from the
same weights and seeds, judged by the independent LM and scored by MAUVE against held-out text.
Perplexity is only comparable at comparable entropy and length (``sample_quality.ordered``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dllm.generator import DiffusionGenerator
from dllm.remdm import Remdm
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral
from eval.curves import entropy_of_counts
from eval.experiments.compare import token_frequencies
from eval.experiments.stages import (
    Stages,
    held_out_documents,
    load,
    train_or_reuse,
    validation_rows,
)
from eval.findings.common import (
    Claim,
    Finding,
    FindingResult,
    Job,
    finish_report,
    rule_text,
    start_report,
)
from eval.findings.sample_quality import judge_all, merge_seeds, ordered, perplexity_table
from eval.findings.verdicts import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Interval,
    LearnedCheck,
    combine,
    paired_difference,
)
from eval.quality import mauve_score
from eval.report import Table
from eval.sample_sets import diffusion_sample_set, judged_texts

CLAIM = Claim(
    "ReMDM at T >= L",
    "With T >= L sampling steps, ReMDM's remasking loop gives a masked diffusion model better "
    "samples than its ancestral sampler at the same T (OpenWebText, L = 1024, T = 1024 / 2048 / "
    "4096: MAUVE 0.403 / 0.610 / 0.656 against MDLM's 0.042 / 0.037 / 0.035; generative "
    "perplexity 28.6 / 22.8 / 17.6 against about 51).",
    "Wang et al. 2025 (ReMDM, arXiv 2503.00307), Table 1",
)
# ReMDM's released T >= L setting: the max-capped eta inside the loop's held phase
REMDM_T_AT_LEAST_L = dict(mode="loop", eta=0.02, t_on=0.55, t_off=0.05, alpha_on=0.9)
# Declared before any run (hashed into the registration).
RULE = {
    "sampler": REMDM_T_AT_LEAST_L,
    "perplexity": "ReMDM's token-weighted judge perplexity below ancestral's by the "
    "direction rule, its entropy and mean length within sample_quality's tolerances",
    "mauve": "the paired (by seed) MAUVE difference ReMDM - ancestral has its 95% t "
    "interval above 0",
    "plateau_margin": 0.1,
}


@dataclass(frozen=True)
class RemdmSettings:
    seeds: tuple[int, ...]
    preset: str
    samples: int  # per seed, sampler and T; MAUVE's references: as many held-out documents
    gen_length: int  # L
    step_multiples: tuple[int, ...]  # T = L * multiple
    judge: str = "smollm2"
    overrides: dict[str, Any] = field(default_factory=dict)


SETTINGS = {
    "smoke": RemdmSettings((0, 1), "smoke", 6, 16, (1,), overrides=dict(max_steps=40)),
    # The demo recipe at its own 320 steps, 3 seeds of 54 samples per set (162 pooled, as the
    # sample-quality finding), L = 64 and T = 64, 128.
    "cpu": RemdmSettings((0, 1, 2), "demo", 54, 64, (1, 2)),
    # ReMDM's setting: OpenWebText rows of 1024 tokens (BOS and 1023 generated), T = L to 4L.
    "gpu": RemdmSettings(
        (0, 1, 2),
        "owt-small",
        256,
        1023,
        (1, 2, 4),
        judge="gpt2-large",
        overrides=dict(seq_len=1024, max_seq_len=1024, max_steps=50000),
    ),
}


def run_start(settings: RemdmSettings, seed: int) -> dict[str, Any]:
    return settings.overrides | {"curve_points": 0, "seed": seed, "objective": "mdm"}


def runs(settings: RemdmSettings) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every run this finding trains (for the registration), as ``run`` starts them."""
    return {
        f"seed-{seed}/mdm": (settings.preset, run_start(settings, seed)) for seed in settings.seeds
    }


def samplers(settings: RemdmSettings) -> dict[str, tuple[str, int, SamplerConfig]]:
    """Each sample set: (sampler, T, its config), ancestral and ReMDM at every T."""
    sets = {}
    for multiple in settings.step_multiples:
        steps = settings.gen_length * multiple
        sets[f"MDM ancestral T={steps}"] = ("ancestral", steps, SamplerConfig(Ancestral(steps)))
        remdm = SamplerConfig(Remdm(steps, **REMDM_T_AT_LEAST_L))
        sets[f"MDM ReMDM T={steps}"] = ("ReMDM", steps, remdm)
    return sets


def sample_seed(folder: Path, settings: RemdmSettings, seed: int) -> dict[str, Any]:
    """One seed's sample sets (T=1, float64 noise, cut at the first EOS) and its MAUVE scores
    against as many held-out documents, cut the same way."""
    model, tokenizer, state = load(folder, "mdm")
    generator = DiffusionGenerator(model, tokenizer, state)
    rows = validation_rows(state, tokenizer)
    reference_ids = held_out_documents(
        rows, tokenizer.eos_id, tokenizer.pad_id, settings.samples, settings.gen_length
    )
    references = [tokenizer.decode(ids) for ids in reference_ids]
    sets = {}
    for name, (sampler, steps, config) in samplers(settings).items():
        drawn = diffusion_sample_set(
            generator, config, settings.samples, settings.gen_length, seed, early_stop=False
        )
        sets[name] = {
            "model": sampler,
            "steps": steps,
            "nfe": drawn.nfe,
            "texts": drawn.texts,
            "ids": drawn.ids,
            "mauve": mauve_score(judged_texts(drawn.texts), references, seed=seed),
        }
    return sets


def run(settings: RemdmSettings, job: Job) -> FindingResult:
    stages = Stages(job.out, job.force, job.stop)
    per_seed, finals, mauve = {}, {}, {}
    for seed in settings.seeds:
        folder = job.out / f"seed-{seed}"
        start = run_start(settings, seed)
        overrides = {k: v for k, v in start.items() if k != "objective"} | job.extra
        summary = train_or_reuse(
            "mdm", folder / "mdm", settings.preset, {"objective": "mdm"}, overrides, job.force
        )
        finals[seed] = summary["val_nats_per_token"]
        key = {"step": summary["step"], "settings": repr(settings)}
        sets = stages.run(
            f"samples-seed{seed}", key, lambda f=folder, s=seed: sample_seed(f, settings, s)
        )
        mauve[seed] = {name: entry["mauve"] for name, entry in sets.items()}
        per_seed[seed] = stages.run(
            f"judge-seed{seed}", key, lambda sets=sets: judge_all(sets, settings)
        )
    first = job.out / f"seed-{settings.seeds[0]}"
    unigram = stages.run(
        "unigram", {}, lambda: entropy_of_counts(token_frequencies(*load(first, "mdm")[1:]))
    )
    judged = {"judge": per_seed[settings.seeds[0]]["judge"], "sets": merge_seeds(per_seed)}
    return judge(
        job.scale, settings, judged, mauve, {"unigram": unigram, "finals": finals}, job.out
    )


def mauve_verdict(difference: Interval) -> str:
    """ReMDM - ancestral MAUVE, paired by seed: above 0 reproduces, below 0 reverses."""
    if difference.low > 0:
        return REPRODUCED
    if difference.high < 0:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def comparisons(settings, judged, mauve) -> dict[int, dict[str, Any]]:
    """At each T: the perplexity verdict, the MAUVE difference and its verdict."""
    sets, seeds = judged["sets"], list(mauve)
    compared = {}
    for multiple in settings.step_multiples:
        steps = settings.gen_length * multiple
        remdm, plain = f"MDM ReMDM T={steps}", f"MDM ancestral T={steps}"
        difference = paired_difference(
            [mauve[s][remdm] for s in seeds], [mauve[s][plain] for s in seeds]
        )
        compared[steps] = {
            "perplexity": ordered(sets[remdm], sets[plain]),
            "mauve_difference": difference,
            "mauve": mauve_verdict(difference),
        }
    return compared


def mauve_table(settings: RemdmSettings, mauve: dict, compared: dict) -> Table:
    names = list(samplers(settings))
    body = [[name] + [mauve[seed][name] for seed in mauve] for name in names]
    for steps, entry in compared.items():
        body.append([f"ReMDM - ancestral at T={steps}"] + [""] * (len(mauve) - 1)
                    + [entry["mauve_difference"].text(3)])  # fmt: skip
    return Table(
        "MAUVE against held-out text, per seed",
        ["set"] + [f"seed {seed}" for seed in mauve],
        body,
        note=f"{settings.samples} samples per seed and set against as many held-out documents "
        "(MiniLM embeddings); differences paired by seed, 95% t interval (last column).",
    )


def learned_checks(learned: dict[str, Any]) -> list[LearnedCheck]:
    margin, finals = RULE["plateau_margin"], learned["finals"].values()
    return [
        LearnedCheck(
            "MDM",
            f"final validation loss more than {margin} nats below the unigram entropy "
            f"{learned['unigram']:.3f}, every seed",
            ", ".join(f"{f:.3f}" for f in finals),
            all(f < learned["unigram"] - margin for f in finals),
        )
    ]


def judge(scale, settings, judged, mauve, learned, out: Path) -> FindingResult:
    rules = rule_text("seeds", "learned", "direction") + [
        f"**Rule (ReMDM over ancestral).** ReMDM is {REMDM_T_AT_LEAST_L}. At every T: "
        f"{RULE['perplexity']}, and {RULE['mauve']}. *Reproduced* when every part at every T "
        "is; *not reproduced* when any part is reversed with separated intervals; "
        "*inconclusive* otherwise."
    ]
    report = start_report(FINDING, scale, out, settings, rules)
    compared = comparisons(settings, judged, mauve)
    report.table(perplexity_table(settings, judged))
    report.table(mauve_table(settings, mauve, compared))
    parts = [e[k] for e in compared.values() for k in ("perplexity", "mauve")]
    measured = "; ".join(
        f"T={steps}: judge ppl {e['perplexity']}, MAUVE ReMDM - ancestral "
        f"{e['mauve_difference'].text(3)}"
        for steps, e in compared.items()
    )
    return finish_report(
        report,
        FINDING,
        scale,
        measured=measured,
        verdict=combine(parts),
        rule="at every T >= L, ReMDM's judge perplexity below ancestral's (entropy and length "
        "comparable) and its paired MAUVE difference above 0, all 95% intervals separated",
        checks=learned_checks(learned),
        numbers={
            "comparisons": {
                str(steps): e | {"mauve_difference": e["mauve_difference"].as_dict()}
                for steps, e in compared.items()
            },
            "mauve": {str(seed): scores for seed, scores in mauve.items()},
            "sets": judged["sets"],
            "learned": learned,
        },
    )


FINDING = Finding(
    "remdm-steps",
    CLAIM,
    SETTINGS,
    run,
    gpu_wall="about 25 GPU-hours (3 seeds x 50k steps at 1024 tokens, then 18 sets of 256 "
    "samples at up to 4096 steps)",
    rule=RULE,
    gpu_budget="GPT-2 small shapes on OpenWebText, 50k steps at 1024 tokens, 3 seeds",
    cost="3 seeds x 1 MDM run of 320 steps, then 4 sets of 54 samples per seed",
    runs=runs,
    judged_by=("eval.findings.sample_quality",),
)
