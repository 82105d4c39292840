"""Finding: generative perplexity orders AR < block diffusion < masked diffusion at full step
counts, and the diffusion models degrade as their step count falls (MDLM and BD3-LM tables).
Perplexity is only comparable at comparable sample entropy (a sampler can buy perplexity with
repetition), so the rule checks entropies too."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arlm.generate import ARGenerator
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral
from eval.curves import entropy_of_counts
from eval.experiments.block_sweep import run_names, train_all
from eval.experiments.compare import token_frequencies
from eval.experiments.stages import Stages, load
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
    REPRODUCED,
    Interval,
    LearnedCheck,
    combine,
    direction_verdict,
    seed_interval,
)
from eval.quality import load_judge, log_perplexity_interval, unigram_entropy
from eval.report import Table
from eval.sample_sets import ar_sample_set, diffusion_sample_set
from eval.sample_sets import judged as judged_set
from shared.sampling import SamplingConfig

CLAIM = Claim(
    "Sample quality vs steps",
    "Generative perplexity (judged by an independent LM, at comparable entropy): AR < BD3-LM < "
    "MDLM, and the diffusion models get worse as the number of sampling steps falls.",
    "Sahoo et al. 2024 (MDLM) Table 6; Arriola et al. 2025 (BD3-LM) Tables 6-7",
)
ENTROPY_TOLERANCE = 0.05  # a lower perplexity bought with >5% lower sample entropy does not count
# A lower perplexity over samples more than 25% shorter (mean tokens before EOS, an empty sample
# counted as 0) does not count either: the judge scores fewer, earlier tokens of the winner.
LENGTH_TOLERANCE = 0.25
# Declared before any run (hashed into the registration).
RULE = {
    "entropy_tolerance": ENTROPY_TOLERANCE,
    "length_tolerance": LENGTH_TOLERANCE,
    "plateau_margin": 0.1,
    "perplexity": "token-weighted; an empty sample (EOS first) has no token to judge: it is left "
    "out of the perplexity and the entropy, counted as length 0, and its share reported",
}


@dataclass(frozen=True)
class QualitySettings:
    seeds: tuple[int, ...]
    preset: str
    block_size: int
    samples: int  # per seed and set
    gen_length: int
    step_divisors: tuple[int, ...]  # diffusion steps = full count / divisor (1 = full)
    judge: str = "smollm2"
    overrides: dict[str, Any] = field(default_factory=dict)


SETTINGS = {
    "smoke": QualitySettings((0, 1), "smoke", 4, 4, 16, (1, 4), overrides=dict(max_steps=40)),
    # The demo recipe at its own 320 steps, 3 seeds of 54 samples each: 162 per set, which
    # gives the judge perplexity about +-9% over samples at this scale (the demo report's 160).
    "cpu": QualitySettings((0, 1, 2), "demo", 16, 54, 64, (1, 4, 16)),
    # The papers' setting: OpenWebText, 1024 tokens, GPT-2-large judge (needs the hub).
    # BOS and 1023 generated tokens fill one 1024-token row (1024 would not fit the model).
    "gpu": QualitySettings(
        (0, 1, 2),
        "owt-small",
        16,
        256,
        1023,
        (1, 2, 4, 8),
        judge="gpt2-large",
        overrides=dict(seq_len=1024, max_seq_len=1024, max_steps=50000),
    ),
}


def runs(settings: QualitySettings) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every run this finding trains (for the registration), as ``block_sweep.train_all``
    starts them."""
    planned = {}
    for seed in settings.seeds:
        shared = settings.overrides | {"curve_points": 0, "seed": seed}
        for name in run_names((settings.block_size,)):
            objective = "bd" if name.startswith("bd-") else name
            start = {"objective": objective}
            if objective == "bd":
                start["block_size"] = settings.block_size
            planned[f"seed-{seed}/{name}"] = (settings.preset, shared | start)
    return planned


def run(settings: QualitySettings, job: Job) -> FindingResult:
    stages = Stages(job.out, job.force, job.stop)
    per_seed, finals = {}, {}
    for seed in settings.seeds:
        folder = job.out / f"seed-{seed}"
        summaries = train_all(
            settings.preset,
            folder,
            settings.overrides | {"curve_points": 0, "seed": seed} | job.extra,
            (settings.block_size,),
            job.force,
        )
        finals[seed] = {name: s["val_nats_per_token"] for name, s in summaries.items()}
        key = {"steps": {k: v["step"] for k, v in summaries.items()}, "settings": repr(settings)}
        sets = stages.run(
            f"samples-seed{seed}", key, lambda f=folder, s=seed: sample_all(f, settings, s)
        )
        per_seed[seed] = stages.run(
            f"judge-seed{seed}", key, lambda sets=sets: judge_all(sets, settings)
        )
    first = job.out / f"seed-{settings.seeds[0]}"
    unigram = stages.run(
        "unigram", {}, lambda: entropy_of_counts(token_frequencies(*load(first, "ar")[1:]))
    )
    judged = {"judge": per_seed[settings.seeds[0]]["judge"], "sets": merge_seeds(per_seed)}
    learned = {"unigram": unigram, "finals": finals}
    return judge(job.scale, settings, judged, job.out, learned)


def merge_seeds(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each sample set over the seeds: the log judge perplexity of all samples pooled, with the
    union of its interval over samples and the t interval of the seeds' means (training
    randomness); entropy and repetition averaged over seeds."""
    seeds = list(per_seed)
    merged = {}
    for name, entry in per_seed[seeds[0]]["sets"].items():
        entries = [per_seed[seed]["sets"][name] for seed in seeds]
        pooled = log_ppl_interval(
            [v for e in entries for v in e["per_sample_nats"]],
            [t for e in entries for t in e["per_sample_tokens"]],
        )
        means = seed_interval([e["log_ppl"]["value"] for e in entries])
        per_sample = ("per_sample_nats", "per_sample_tokens")
        merged[name] = {k: v for k, v in entry.items() if k not in per_sample} | {
            "log_ppl": Interval(
                pooled.value, min(pooled.low, means.low), max(pooled.high, means.high)
            ).as_dict(),
            "log_ppl_over_samples": pooled.as_dict(),
            "log_ppl_per_seed": [e["log_ppl"]["value"] for e in entries],
            "samples": sum(len(e["per_sample_nats"]) for e in entries),
            "unigram_entropy": statistics.fmean(e["unigram_entropy"] for e in entries),
            "empty_share": statistics.fmean(e.get("empty_share", math.nan) for e in entries),
            "repetition_rate_4gram": statistics.fmean(e["repetition_rate_4gram"] for e in entries),
            "mean_length": statistics.fmean(e.get("mean_length", math.nan) for e in entries),
        }
    return merged


def sample_all(out: Path, settings: QualitySettings, seed: int = 0) -> dict[str, Any]:
    """Unconditional samples at T=1 (float64 noise), drawn the one way (``eval.sample_sets``:
    every model's samples end at their first EOS): AR, and every diffusion model at each step
    count (full = one step per generated token, rounded up to whole blocks for block
    diffusion, every block run)."""
    sets: dict[str, Any] = {}
    for name in run_names((settings.block_size,)):
        model, tokenizer, state = load(out, name)
        if state["objective"] == "ar":
            engine = ARGenerator(model, tokenizer)
            sampling = SamplingConfig(temperature=1.0)
            drawn = ar_sample_set(engine, settings.samples, settings.gen_length, sampling, seed)
            sets["AR"] = {"model": "AR", "steps": settings.gen_length, "nfe": drawn.nfe}
            sets["AR"] |= {"texts": drawn.texts, "ids": drawn.ids}
            continue
        generator = DiffusionGenerator(model, tokenizer, state)
        label = "MDM" if state["objective"] == "mdm" else f"BD-{settings.block_size}"
        for divisor in settings.step_divisors:
            sampler = SamplerConfig(Ancestral(max(1, settings.gen_length // divisor)))
            drawn = diffusion_sample_set(
                generator, sampler, settings.samples, settings.gen_length, seed, early_stop=False
            )
            sets[f"{label} {drawn.steps} steps"] = {
                "model": label,
                "steps": drawn.steps,
                "nfe": drawn.nfe,
                "divisor": divisor,
                "texts": drawn.texts,
                "ids": drawn.ids,
            }
    return sets


def judge_all(sets: dict[str, Any], settings: QualitySettings) -> dict[str, Any]:
    """Each sample set judged (``eval.sample_sets.judged``), with its empty samples (EOS
    first) left out of the perplexity and the entropy rather than judged as one space, and
    their share kept (``RULE["perplexity"]``)."""
    judge_model = load_judge(settings.judge)
    judged_sets = {}
    for name, entry in sets.items():
        row = judged_set(judge_model, entry["texts"], entry["ids"])
        empty = [not ids for ids in entry["ids"]]
        tokens = [0 if gone else count for gone, count in zip(empty, row["per_sample_tokens"])]
        judged_sets[name] = {k: v for k, v in entry.items() if k not in ("texts", "ids")} | {
            "per_sample_nats": row["per_sample_nats"],
            "per_sample_tokens": tokens,
            "mean_length": row["mean_length"],
            "empty_share": sum(empty) / len(empty) if empty else math.nan,
            "log_ppl": log_ppl_interval(row["per_sample_nats"], tokens).as_dict(),
            "unigram_entropy": entropy_of_written(entry["ids"]),
            "repetition_rate_4gram": row["repetition_rate_4gram"],
            "distinct_1": row["distinct_1"],
            "distinct_2": row["distinct_2"],
            "distinct_3": row["distinct_3"],
            "n_samples": row["n_samples"],
            "example": row_example(entry["texts"]),
        }
    return {"judge": judge_model.identity, "sets": judged_sets}


def entropy_of_written(ids: list[list[int]]) -> float:
    """The mean unigram entropy of the samples that hold a token (an empty one has none to
    measure; ``empty_share`` counts it); nan when every sample is empty."""
    written = [row for row in ids if row]
    return statistics.fmean(unigram_entropy(row) for row in written) if written else math.nan


def row_example(texts: list[str]) -> str:
    return (texts[0] if texts else "")[:200]


def log_ppl_interval(per_sample_nats: list[float], per_sample_tokens: list[int]) -> Interval:
    """The token-weighted log judge perplexity (``eval.sample_sets``): the judge's nats summed
    over samples / its tokens summed over samples, with the delta method's 95% interval."""
    nats = [rate * count for rate, count in zip(per_sample_nats, per_sample_tokens) if count]
    tokens = [count for count in per_sample_tokens if count]
    interval = log_perplexity_interval(nats, tokens)
    if interval is None:
        value = sum(nats) / sum(tokens) if tokens else math.nan
        return Interval(value, -math.inf, math.inf)
    return Interval(*interval)


def ordered(better: dict[str, Any], worse: dict[str, Any]) -> str:
    """'better has the lower judge perplexity' by the direction rule, unless the side whose
    perplexity is lower (better when reproduced, worse when reversed) has samples of more than
    ENTROPY_TOLERANCE lower entropy (its lead may be bought with repetition) or more than
    LENGTH_TOLERANCE shorter (bought with brevity): then inconclusive."""
    verdict = direction_verdict(Interval(**better["log_ppl"]), Interval(**worse["log_ppl"]))
    if verdict == INCONCLUSIVE:
        return verdict
    winner, loser = (better, worse) if verdict == REPRODUCED else (worse, better)
    cheap = winner["unigram_entropy"] < (1 - ENTROPY_TOLERANCE) * loser["unigram_entropy"]
    short = winner["mean_length"] < (1 - LENGTH_TOLERANCE) * loser["mean_length"]
    return INCONCLUSIVE if cheap or short else verdict


def rules() -> list[str]:
    """The rules the report states before its numbers."""
    return rule_text("seeds", "learned", "direction") + [
        "Quantities: each sample set's log judge perplexity, token-weighted (the judge's "
        "nats summed over all seeds' samples / its tokens summed over them; its interval the "
        "union of the delta method's interval over samples and the t interval over the "
        "seeds' values; perplexity = exp). The "
        "claim has two halves and both enter the verdict. Ordering: AR below BD and BD "
        "below MDM, each pair by the direction rule at full step counts (one step per "
        "generated token: 64 for 64 tokens, rounded up to whole blocks for block diffusion, "
        "so BD-16 takes 65; the NFE column says how many evaluations ran), T=1, float64 "
        "noise. Every model's samples end at their first EOS (AR included) and are judged, "
        "measured (mean length) and scored for entropy on the tokens before it; an empty "
        "sample (EOS first) has no token to judge: it is left out of the perplexity and the "
        "entropy, counts as length 0, and each set's share of empty samples is reported. Any "
        "comparison whose lower-perplexity side, whichever side that is, has more "
        f"than {ENTROPY_TOLERANCE:.0%} lower mean sample entropy (perplexity bought by "
        f"repetition) or more than {LENGTH_TOLERANCE:.0%} shorter mean length (bought by "
        "brevity) is *inconclusive*. Steps: for each diffusion model, full steps "
        "below the fewest steps, by the same rule. Reproduced only if all four parts "
        "are; not reproduced if any part is reversed with separated intervals. Learned "
        "checks: each model's final validation loss more than "
        f"{RULE['plateau_margin']} nats below the unigram entropy, in every seed."
    ]


def ordering_half(full: dict[str, Any], bd: str) -> dict[str, str]:
    """The first half: AR < BD < MDM at full steps, pair by pair."""
    return {
        "AR < " + bd: ordered(full["AR"], full[bd]),
        bd + " < MDM": ordered(full[bd], full["MDM"]),
    }


def steps_half(sets: dict[str, Any], bd: str) -> dict[str, str]:
    """The second half: each diffusion model at full steps below its fewest steps."""
    verdicts = {}
    for model in (bd, "MDM"):
        runs = sorted((e for e in sets.values() if e["model"] == model), key=lambda e: e["steps"])
        verdicts[model] = ordered(runs[-1], runs[0])
    return verdicts


PERPLEXITY_COLUMNS = [
    "set",
    "steps",
    "NFE",
    "samples",
    "mean length",
    "empty",
    "judge ppl",
    "95% interval",
    "sample entropy",
    "4-gram repetition",
]


def perplexity_table(settings: QualitySettings, judged: dict) -> Table:
    rows = []
    for name, entry in judged["sets"].items():
        interval = Interval(**entry["log_ppl"])
        rows.append(
            [
                name,
                entry["steps"],
                entry.get("nfe", "-"),
                entry.get("samples", settings.samples),
                f"{entry.get('mean_length', math.nan):.1f}",
                f"{entry.get('empty_share', math.nan):.0%}",
                f"{math.exp(interval.value):.1f}",
                f"[{math.exp(interval.low):.1f}, {math.exp(interval.high):.1f}]",
                entry["unigram_entropy"],
                entry["repetition_rate_4gram"],
            ]
        )
    return Table(
        f"Judge perplexity of samples of {settings.gen_length} tokens",
        PERPLEXITY_COLUMNS,
        rows,
        note=f"Judge: {judged['judge']}. Perplexity = exp(judge nats / judge tokens, summed over "
        "the samples that hold a token; empty: the share of samples that end at once (EOS "
        "first), left out of the perplexity and the entropy, counted as length 0); "
        f"{settings.samples} samples per seed, seeds {list(settings.seeds)}.",
    )


def learned_checks(settings: QualitySettings, learned: dict[str, Any]) -> list[LearnedCheck]:
    """Each model's final validation loss below the unigram plateau, in every seed."""
    names = {"ar": "AR", f"bd-{settings.block_size}": f"BD-{settings.block_size}", "mdm": "MDM"}
    finals, ceiling = learned["finals"].values(), learned["unigram"] - RULE["plateau_margin"]
    return [
        LearnedCheck(
            label,
            f"final validation loss more than {RULE['plateau_margin']} nats below the unigram "
            f"entropy {learned['unigram']:.3f}, every seed",
            ", ".join(f"{f[run]:.3f}" for f in finals),
            all(f[run] < ceiling for f in finals),
        )
        for run, label in names.items()
    ]


def judge(
    scale: str,
    settings: QualitySettings,
    judged: dict,
    out: Path,
    learned: dict[str, Any],
) -> FindingResult:
    """``judged``: the judge and the merged sample sets; ``learned``: the unigram entropy and
    each seed's final validation loss per run, for the learned gate."""
    report = start_report(FINDING, scale, out, settings, rules())
    sets = judged["sets"]
    full = {entry["model"]: entry for entry in sets.values() if entry.get("divisor", 1) == 1}
    bd = f"BD-{settings.block_size}"
    pairs, steps_verdicts = ordering_half(full, bd), steps_half(sets, bd)
    report.table(perplexity_table(settings, judged))
    measured = ", ".join(
        f"{m} {math.exp(full[m]['log_ppl']['value']):.0f}" for m in ("AR", bd, "MDM")
    )
    return finish_report(
        report,
        FINDING,
        scale,
        measured=f"judge ppl at full steps {measured} (intervals in the report); "
        + "; ".join(f"{k}: {v}" for k, v in pairs.items())
        + "; fewer steps worse: "
        + ", ".join(f"{m} {v}" for m, v in steps_verdicts.items()),
        verdict=combine(list(pairs.values()) + list(steps_verdicts.values())),
        rule=f"AR < BD < MDM in token-weighted judge perplexity at full steps (the winner's "
        f"entropy within {ENTROPY_TOLERANCE:.0%} and mean length within "
        f"{LENGTH_TOLERANCE:.0%}) and each diffusion model worse at its fewest steps, all 95% "
        "intervals separated",
        checks=learned_checks(settings, learned),
        numbers={"pairs": pairs, "steps": steps_verdicts, "sets": sets, "learned": learned},
    )


FINDING = Finding(
    "sample-quality",
    CLAIM,
    SETTINGS,
    run,
    gpu_wall="about 45 GPU-hours (3 seeds x 3 models x 50k steps at 1024 tokens, plus sampling)",
    rule=RULE,
    gpu_budget="GPT-2 small shapes on OpenWebText, 50k steps at 1024 tokens, 3 seeds",
    cost="3 seeds x 3 runs of 320 steps, then 7 sets of 162 samples judged by SmolLM2",
    runs=runs,
)
