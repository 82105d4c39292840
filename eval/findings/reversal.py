"""Finding: the reversal curse. Facts ``a_i b_i`` seen in one direction only; asked ``b_i -> ?``,
the AR model answers near chance while the masked diffusion model answers (it was trained on
every conditional, the reverse one included)."""

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
from eval.findings.verdicts import direction_in_every_seed, pooled_accuracy
from eval.report import Table
from eval.synthetic_probes import reversal_probe
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
    strings: int  # training strings per seed
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)


TRAIN = dict(tokenizer="byte", protocol="padded", seq_len=4, max_seq_len=64)
SETTINGS = {
    "smoke": ReversalSettings(
        (0, 1), 8, 1000, "tiny", dict(max_steps=40, batch_size=16, eval_every=20, lr=5e-3)
    ),
    "cpu": ReversalSettings(
        (0, 1, 2, 3, 4),
        26,
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
    return f"synthetic:facts?pairs={settings.pairs}&seed={seed}&n={settings.strings}&n_val={n_val}"


def run(settings: ReversalSettings, job: Job) -> FindingResult:
    out, force, scale = job.out, job.force, job.scale
    stages = Stages(out, force, job.stop)
    per_seed = []
    for seed in settings.seeds:
        spec = facts_spec(settings, seed)
        folder = out / f"seed{seed}"
        overrides = TRAIN | settings.overrides | {"dataset": spec, "seed": seed} | job.extra
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


def pooled(per_seed: list[dict[str, Any]], objective: str, key: str, pairs: int):
    """The Wilson interval of an accuracy pooled over every seed's ``pairs`` facts."""
    return pooled_accuracy([seed[objective][key] for seed in per_seed], [pairs] * len(per_seed))


def judge(
    scale: str, settings: ReversalSettings, per_seed: list[dict[str, Any]], out: Path
) -> FindingResult:
    finding = FINDING
    report = start_report(
        finding,
        scale,
        out,
        settings,
        rule_text("direction")
        + [
            "Here A = the AR model's accuracy on reversed queries (the next token after "
            "`[BOS, b_i]`), B = the MDM's (position 1 of `[BOS, MASK, b_i, EOS]`), each pooled "
            "over every seed's facts (95% Wilson interval). The direction must also hold in every "
            "seed. The forward accuracies are shown so a failure to learn the facts at all is "
            "visible: a reversal verdict on facts neither model learned means nothing."
        ],
    )
    pairs = settings.pairs
    rows, intervals = [], {}
    for objective, key, label in (
        ("ar", "forward_accuracy", "AR forward (a -> b)"),
        ("ar", "reverse_prompted_accuracy", "AR reverse, prompted (b -> a)"),
        ("ar", "reverse_scored_accuracy", "AR reverse, scored by forward likelihood"),
        ("mdm", "forward_accuracy", "MDM forward (a -> b)"),
        ("mdm", "reverse_accuracy", "MDM reverse (b -> a)"),
    ):
        interval = pooled(per_seed, objective, key, pairs)
        intervals[(objective, key)] = interval
        per = ", ".join(f"{seed[objective][key]:.3f}" for seed in per_seed)
        rows.append([label, interval.value, f"[{interval.low:.3f}, {interval.high:.3f}]", per])
    report.table(
        Table(
            "Accuracy over the facts",
            ["query", "accuracy (pooled)", "95% Wilson interval", "per seed"],
            rows,
            note=f"{pairs} facts per seed, seeds {list(settings.seeds)}; chance = 1/{pairs} = "
            f"{1 / pairs:.3f}. 'Scored by forward likelihood' ranks all a's by p(a, b_i): the "
            "AR answering through its forward direction with N forward passes, not a reverse "
            "query.",
        )
    )
    ar = intervals[("ar", "reverse_prompted_accuracy")]
    mdm = intervals[("mdm", "reverse_accuracy")]
    verdict, agree, notes = direction_in_every_seed(
        ar,
        mdm,
        [s["ar"]["reverse_prompted_accuracy"] for s in per_seed],
        [s["mdm"]["reverse_accuracy"] for s in per_seed],
    )
    learned = min(
        intervals[("ar", "forward_accuracy")].value, intervals[("mdm", "forward_accuracy")].value
    )
    if learned < 0.9:
        notes.append(
            f"Caution: a model's forward accuracy is {learned:.2f} (< 0.9): the facts are not "
            "fully learned at this budget."
        )
    return finish_report(
        report,
        finding,
        scale,
        measured=f"reverse accuracy AR {ar.text()} vs MDM {mdm.text()} (chance {1 / pairs:.3f})",
        verdict=verdict,
        rule=RULE_SUMMARY,
        numbers={
            "per_seed": per_seed,
            "intervals": {f"{o}/{k}": v.as_dict() for (o, k), v in intervals.items()},
            "all_seeds_agree": agree,
        },
        notes=notes,
    )


RULE_SUMMARY = "AR reverse accuracy's 95% interval below the MDM's, and in every seed"

FINDING = Finding("reversal", CLAIM, SETTINGS, run, gpu_wall="about 10 min on one GPU")
