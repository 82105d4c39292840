"""Finding: the reversal curse. Facts ``a_i b_i`` are seen forward; half of them (the paired
facts) also reversed, so the reversed order is a familiar format; the other half (held out) never
reversed. Asked ``b_i -> ?`` for a held-out fact, in the same surface order for both models, the
AR answers near chance while the masked diffusion model answers (the claim under test)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.experiments.stages import Stages, load, train_both
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
    accuracy_interval,
    all_seeds_agree,
)
from eval.report import Table
from eval.synthetic.probes import reversal_probe
from shared.data.synthetic.specs import build_language

CLAIM = Claim(
    "Reversal curse",
    "Trained on facts 'a is b' only, an AR model cannot answer 'b is ?' (accuracy near "
    "chance), while a masked diffusion model answers reversed queries.",
    "Berglund et al. 2023; Nie et al. 2025 (LLaDA), reversal poem completion",
)


@dataclass(frozen=True)
class ReversalSettings:
    seeds: tuple[int, ...]
    pairs: int
    both: int  # the paired facts, also seen reversed; the other pairs - both are held out
    strings: int  # training strings per seed
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)


TRAIN = dict(tokenizer="byte", protocol="padded", seq_len=4, max_seq_len=64)
SETTINGS = {
    "smoke": ReversalSettings(
        (0, 1), 8, 4, 1000, "tiny", dict(max_steps=40, batch_size=16, eval_every=20, lr=5e-3)
    ),
    "cpu": ReversalSettings(
        (0, 1, 2),
        26,
        13,
        4000,
        "tiny",
        dict(
            dim=64,
            n_layers=2,
            n_heads=4,
            n_kv_heads=4,
            hidden_dim=176,
            max_steps=600,
            batch_size=64,
            eval_every=200,
            lr=3e-3,
        ),
    ),
    "gpu": ReversalSettings(
        tuple(range(10)),
        26,
        13,
        20000,
        "tiny",
        dict(
            dim=256,
            n_layers=6,
            n_heads=8,
            n_kv_heads=8,
            hidden_dim=704,
            max_steps=3000,
            batch_size=256,
            eval_every=500,
            lr=1e-3,
        ),
    ),
}


def facts_spec(settings: ReversalSettings, seed: int) -> str:
    n_val = max(64, settings.strings // 10)
    return (
        f"synthetic:facts?pairs={settings.pairs}&both={settings.both}&seed={seed}"
        f"&n={settings.strings}&n_val={n_val}"
    )


def seed_overrides(settings: ReversalSettings, seed: int) -> dict[str, Any]:
    return TRAIN | settings.overrides | {"dataset": facts_spec(settings, seed), "seed": seed}


def runs(settings: ReversalSettings) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every run this finding trains (for the registration)."""
    return {
        f"seed{seed}/{objective}": (
            settings.preset,
            seed_overrides(settings, seed) | {"objective": objective},
        )
        for seed in settings.seeds
        for objective in ("ar", "mdm")
    }


def run(settings: ReversalSettings, job: Job) -> FindingResult:
    out, force, scale = job.out, job.force, job.scale
    stages = Stages(out, force, job.stop)
    per_seed = []
    for seed in settings.seeds:
        spec = facts_spec(settings, seed)
        folder = out / f"seed{seed}"
        overrides = seed_overrides(settings, seed) | job.extra
        summaries = train_both(settings.preset, folder, overrides, "tokens", force)
        key = {"spec": spec, "steps": {k: v["step"] for k, v in summaries.items()}}
        per_seed.append(
            stages.run(f"probe-seed{seed}", key, lambda f=folder, s=spec: probe_both(f, s))
        )
    return judge(scale, settings, per_seed, out)


def probe_both(folder: Path, spec: str) -> dict[str, Any]:
    language = build_language(spec)
    result = {}
    for objective in ("ar", "mdm"):
        model, tokenizer, state = load(folder, objective)
        seq_len = int(state["train_config"]["seq_len"])
        result[objective] = reversal_probe(model, tokenizer, language, objective, seq_len)
    return result


# Declared before any run (hashed into the registration): the MDM "answers" the reversed
# queries when it gets at least this fraction right, and each model must reach the learned
# accuracy on the forward facts and on the paired facts' reversed queries (the positive control).
RULE = {"answers": 0.5, "learned_accuracy": 0.9}
QUERIES = (
    ("ar", "forward_accuracy", "AR forward (a -> b), every fact"),
    ("ar", "reverse_paired_accuracy", "AR reverse (b -> a), paired facts (control)"),
    ("ar", "reverse_held_out_accuracy", "AR reverse (b -> a), held-out facts"),
    ("ar", "reverse_scored_accuracy", "AR reverse by its forward likelihood, held-out facts"),
    ("mdm", "forward_accuracy", "MDM forward (a -> b), every fact"),
    ("mdm", "reverse_paired_accuracy", "MDM reverse (b -> a), paired facts (control)"),
    ("mdm", "reverse_held_out_accuracy", "MDM reverse (b -> a), held-out facts"),
    ("mdm", "infill_reverse_accuracy", "MDM fills a before b (a training conditional)"),
)


def examples(settings: ReversalSettings, key: str) -> int:
    """How many facts one seed's accuracy ``key`` is over."""
    if key == "forward_accuracy":
        return settings.pairs
    return settings.both if key == "reverse_paired_accuracy" else settings.pairs - settings.both


def reversal_verdict(ar: Interval, mdm: Interval, every_seed: bool) -> str:
    """The claim: the MDM answers the held-out reversed queries (accuracy >= RULE["answers"])
    and the AR does worse. Reproduced: the AR's interval lies below the MDM's, in every seed,
    with the MDM's whole interval at or above the threshold. Not reproduced: the MDM's whole
    interval lies below the threshold (it does not answer), or below the AR's."""
    if mdm.high < RULE["answers"] or mdm.high < ar.low:
        return NOT_REPRODUCED
    if ar.high < mdm.low and mdm.low >= RULE["answers"] and every_seed:
        return REPRODUCED
    return INCONCLUSIVE


def rules(settings: ReversalSettings) -> list[str]:
    """The rules the report states before its numbers."""
    held = settings.pairs - settings.both
    return rule_text("seeds", "learned") + [
        "**Rule (reversal).** Both models are asked the same question in the same surface "
        "order: a_i after b_i (the AR's next token after `[BOS, b_i]`, the MDM's fill of "
        f"`[BOS, b_i, MASK, EOS]`) for the {held} held-out facts, whose reversed order never "
        "appeared in training, each an argmax over the held-out a's (chance "
        f"1/{held}). *Reproduced*: the AR's interval lies below the MDM's, in every seed, and "
        f"the MDM's whole interval is at least {RULE['answers']} (it answers). *Not "
        f"reproduced*: the MDM's whole interval is below {RULE['answers']}, or below the "
        "AR's. *Inconclusive* otherwise. Learned checks: each model answers at least "
        f"{RULE['learned_accuracy']} of the forward facts and of the paired facts' reversed "
        "queries in every seed (the paired facts were trained reversed, so a model below "
        "that has not learned the format)."
    ]


def accuracy_table(
    settings: ReversalSettings, per_seed: list[dict[str, Any]]
) -> tuple[Table, dict[tuple[str, str], Interval]]:
    """Every query's accuracy over the seeds, as a table and as intervals."""
    held = settings.pairs - settings.both
    rows, intervals = [], {}
    for objective, key, label in QUERIES:
        values = [seed[objective][key] for seed in per_seed]
        interval = accuracy_interval(values, [examples(settings, key)] * len(values))
        intervals[(objective, key)] = interval
        per = ", ".join(f"{v:.3f}" for v in values)
        rows.append([label, interval.value, f"[{interval.low:.3f}, {interval.high:.3f}]", per])
    table = Table(
        "Accuracy over the facts",
        ["query", "accuracy (pooled)", "95% interval", "per seed"],
        rows,
        note=f"{settings.pairs} facts per seed ({settings.both} paired, {held} held out), "
        f"seeds {list(settings.seeds)}; chance on the held-out queries = 1/{held} = "
        f"{1 / held:.3f}. 'By its forward likelihood' ranks the held-out a's by "
        "p(a) p(b_i | a): the AR answering through its forward direction with one pass "
        "per candidate, a control that separates 'cannot represent' from 'cannot produce'.",
    )
    return table, intervals


def learned_checks(per_seed: list[dict[str, Any]]) -> list[LearnedCheck]:
    """Each model's forward and paired-reversed accuracy, in every seed."""
    return [
        LearnedCheck(
            objective.upper(),
            f"{what} accuracy >= {RULE['learned_accuracy']}, every seed",
            ", ".join(f"{seed[objective][key]:.3f}" for seed in per_seed),
            all(seed[objective][key] >= RULE["learned_accuracy"] for seed in per_seed),
        )
        for objective in ("ar", "mdm")
        for key, what in (
            ("forward_accuracy", "forward"),
            ("reverse_paired_accuracy", "paired facts' reversed"),
        )
    ]


def judge(
    scale: str, settings: ReversalSettings, per_seed: list[dict[str, Any]], out: Path
) -> FindingResult:
    held = settings.pairs - settings.both
    report = start_report(FINDING, scale, out, settings, rules(settings))
    table, intervals = accuracy_table(settings, per_seed)
    report.table(table)
    ar = intervals[("ar", "reverse_held_out_accuracy")]
    mdm = intervals[("mdm", "reverse_held_out_accuracy")]
    every_seed = all_seeds_agree(
        [s["ar"]["reverse_held_out_accuracy"] for s in per_seed],
        [s["mdm"]["reverse_held_out_accuracy"] for s in per_seed],
    )
    return finish_report(
        report,
        FINDING,
        scale,
        measured=f"held-out reverse accuracy AR {ar.text()} vs MDM {mdm.text()} "
        f"(chance {1 / held:.3f})",
        verdict=reversal_verdict(ar, mdm, every_seed),
        rule=RULE_SUMMARY,
        checks=learned_checks(per_seed),
        numbers={
            "per_seed": per_seed,
            "intervals": {f"{o}/{k}": v.as_dict() for (o, k), v in intervals.items()},
            "all_seeds_agree": every_seed,
        },
        notes=[] if every_seed else ["Not every seed has the AR below the MDM."],
    )


RULE_SUMMARY = (
    "same-order reversed queries on held-out facts: AR's interval below the MDM's in every seed "
    "and the MDM's at least 0.5"
)

FINDING = Finding(
    "reversal",
    CLAIM,
    SETTINGS,
    run,
    gpu_wall="about 10 min on one GPU",
    rule=RULE | {"summary": RULE_SUMMARY},
    gpu_budget="d256 x 6 layers, 3000 steps of 256 strings, 10 seeds",
    cost="3 seeds x 2 runs of 600 steps",
    runs=runs,
)
