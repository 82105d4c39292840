"""Finding: planning where left-to-right prediction fails. On path-star graphs a teacher-forced
AR model learns the Clever-Hans shortcut and picks the goal's arm by chance (1/degree), while a
masked diffusion model, free to decode the path from the goal end, solves the task.

Bachmann & Nagarajan's setting at CPU scale: G(2, 5) (degree 2, paths of 5 nodes: arms of 4),
single-token node labels from a pool of 50, the shuffled edge list then the start and goal then
the path, the loss on the path only; the MDM with the count estimator. A positive control (an AR
trained on the same graphs with the path written from the goal back, where every step is a
lookup) shows what the budget can learn."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.experiments.stages import Stages, load, train_both, train_or_reuse
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
    combine,
)
from eval.report import Table
from eval.synthetic.pathstar_probe import pathstar_probe
from shared.data.synthetic.base import derive_seed
from shared.data.synthetic.specs import build_language

CLAIM = Claim(
    "Path-star planning",
    "On path-star graphs, teacher-forced AR models stay near 1/degree accuracy on the first step "
    "of the path (a shortcut), while masked diffusion models solve the task.",
    "Bachmann & Nagarajan 2024; Ye et al. 2024 (Beyond Autoregression)",
)


@dataclass(frozen=True)
class PathStarSettings:
    graphs: tuple[tuple[int, int], ...]  # (degree, arm length = path nodes - 1)
    seeds: tuple[int, ...]
    strings: int  # training graphs per seed
    test: int  # held-out graphs per seed
    preset: str
    symbols: int  # the node-label pool
    overrides: dict[str, Any] = field(default_factory=dict)


# Prompt -> answer training, as in both papers: the loss is on the path only (the AR teacher-forced
# on it, the MDM masking only it with the edge list always visible). Trained on whole strings
# instead, the random edge list is most of the loss and neither model learns the task at the
# CPU budget (measured: exact match AR 0.08, MDM 0.00 on (2, 3) after 1000 steps).
TRAIN = dict(
    tokenizer="byte", protocol="padded", max_seq_len=128, answer_after="=", estimator="count"
)
SETTINGS = {
    "smoke": PathStarSettings(
        ((2, 2),),
        (0, 1),
        500,
        50,
        "tiny",
        10,
        dict(max_steps=30, batch_size=16, eval_every=30),
    ),
    "cpu": PathStarSettings(
        ((2, 4),),
        (0, 1, 2),
        20000,
        500,
        "tiny",
        50,
        dict(
            dim=128,
            n_layers=4,
            n_heads=4,
            n_kv_heads=4,
            hidden_dim=352,
            max_steps=1000,
            batch_size=64,
            warmup_steps=50,
            eval_every=250,
            lr=1e-3,
        ),
    ),
    "gpu": PathStarSettings(
        ((2, 4), (5, 4)),
        (0, 1, 2),
        200000,
        2000,
        "tiny",
        50,
        dict(
            dim=384,
            n_layers=8,
            n_heads=6,
            n_kv_heads=6,
            hidden_dim=1024,
            max_steps=40000,
            batch_size=256,
            warmup_steps=500,
            eval_every=2000,
            lr=3e-4,
            precision="auto",
        ),
    ),
}


# Declared before any run (hashed into the registration).
RULE = {
    "mdm_exact": 0.9,  # the MDM "solves the task": exact match at least this
    "chance_band": 0.05,  # the AR's first step "near chance": within 1/degree +- this
    "control_exact": 0.95,  # the positive control learned its task
    "lookup": 0.9,  # a model learned to read the edge list
}
RUNS = ("ar", "mdm", "ar-reversed")


def graph_label(degree: int, arm: int) -> str:
    return f"d{degree}-l{arm}"


def spec_for(settings: PathStarSettings, degree: int, arm: int, seed: int, reverse=0) -> str:
    return (
        f"synthetic:pathstar?degree={degree}&arm={arm}&symbols={settings.symbols}&seed={seed}"
        f"&n={settings.strings}&n_val={max(64, settings.test)}" + ("&reverse=1" if reverse else "")
    )


def graph_overrides(settings: PathStarSettings, degree: int, arm: int, seed: int) -> dict:
    # every string has the same length: 3*degree*arm + arm + 4 symbols, plus BOS and EOS
    shape = {"seq_len": 3 * degree * arm + arm + 6, "seed": seed}
    return TRAIN | settings.overrides | shape


def runs(settings: PathStarSettings) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every run this finding trains (for the registration)."""
    planned = {}
    for degree, arm in settings.graphs:
        for seed in settings.seeds:
            base = graph_overrides(settings, degree, arm, seed)
            where = f"{graph_label(degree, arm)}/seed{seed}"
            for name, objective, reverse in RUN_DATA:
                data = {"dataset": spec_for(settings, degree, arm, seed, reverse)}
                planned[f"{where}/{name}"] = (
                    settings.preset,
                    base | data | {"objective": objective},
                )
    return planned


RUN_DATA = (("ar", "ar", 0), ("mdm", "mdm", 0), ("ar-reversed", "ar", 1))


def run(settings: PathStarSettings, job: Job) -> FindingResult:
    out, force, scale = job.out, job.force, job.scale
    stages = Stages(out, force, job.stop)
    measured: dict[str, list[dict[str, Any]]] = {}
    for degree, arm in settings.graphs:
        label = graph_label(degree, arm)
        for seed in settings.seeds:
            folder = out / label / f"seed{seed}"
            overrides = graph_overrides(settings, degree, arm, seed) | job.extra
            spec = spec_for(settings, degree, arm, seed)
            summaries = train_both(
                settings.preset, folder, overrides | {"dataset": spec}, "tokens", force
            )
            reversed_spec = spec_for(settings, degree, arm, seed, reverse=1)
            summaries["ar-reversed"] = train_or_reuse(
                "ar, path reversed",
                folder / "ar-reversed",
                settings.preset,
                {"objective": "ar"},
                overrides | {"dataset": reversed_spec},
                force,
            )
            key = {"spec": spec, "steps": {k: v["step"] for k, v in summaries.items()}}
            result = stages.run(
                f"probe-{label}-seed{seed}",
                key | {"test": settings.test},
                lambda f=folder, k=seed, a=spec, b=reversed_spec: probe_all(
                    f, a, b, settings.test, k
                ),
            )
            measured.setdefault(label, []).append(result)
    return judge(scale, settings, measured, out)


KEYS = (
    "exact_match",
    "first_step",
    "node_accuracy",
    "n",
    "shortcut_first_step",
    "position_accuracy",
    "decoding_step",
    "lookup_accuracy",
)


def probe_all(folder: Path, spec: str, reversed_spec: str, test: int, seed: int) -> dict:
    """Every run's answers on the same held-out graphs (the control's written backwards)."""
    result: dict[str, Any] = {}
    for name, objective, which in (
        ("ar", "ar", spec),
        ("mdm", "mdm", spec),
        ("ar-reversed", "ar", reversed_spec),
    ):
        language = build_language(which)
        prompts = language.sample(test, derive_seed(seed, 1000))  # a stream training never uses
        model, tokenizer, state = load(folder, name)
        seq_len = int(state["train_config"]["seq_len"])
        probe = pathstar_probe(model, tokenizer, language, objective, seq_len, prompts)
        result[name] = {key: probe[key] for key in KEYS}
        result["degree"] = language.degree
    return result


def pooled(results: list[dict[str, Any]], run: str, key: str) -> Interval:
    return accuracy_interval([r[run][key] for r in results], [r[run]["n"] for r in results])


def chance_band(degree: int) -> tuple[float, float]:
    return 1 / degree - RULE["chance_band"], 1 / degree + RULE["chance_band"]


def planning_verdict(mdm_exact: Interval, ar_first: Interval, degree: int) -> str:
    """Reproduced: the MDM's exact-match interval at or above RULE["mdm_exact"] and the AR's
    first-step interval inside 1/degree +- RULE["chance_band"]. Not reproduced: the MDM's
    interval below the threshold (it does not solve the task) or the AR's first step above
    the band (it plans). An AR below the band has not learned the shortcut either (an untrained
    AR is no planner): inconclusive, and its learned check fails. Inconclusive otherwise."""
    low, high = chance_band(degree)
    if ar_first.high < low:
        return INCONCLUSIVE
    if mdm_exact.high < RULE["mdm_exact"] or ar_first.low > high:
        return NOT_REPRODUCED
    if mdm_exact.low >= RULE["mdm_exact"] and low <= ar_first.low and ar_first.high <= high:
        return REPRODUCED
    return INCONCLUSIVE


def seed_check(
    model: str, results: list[dict], run: str, key: str, threshold: float, what: str
) -> LearnedCheck:
    """``run``'s ``key`` at least ``threshold`` in every seed (a pooled mean could hide an
    untrained seed)."""
    values = [r[run][key] for r in results]
    return LearnedCheck(
        model,
        f"{what} >= {threshold}, every seed",
        ", ".join(f"{v:.3f}" for v in values),
        all(v >= threshold for v in values),
    )


def above_chance_check(label: str, ar_first: Interval, degree: int) -> LearnedCheck:
    """The forward AR's first step is not below the chance band: below it, the AR has not even
    learned to pick one of the start's arms, and its being no planner says nothing."""
    low = chance_band(degree)[0]
    return LearnedCheck(
        f"AR ({label})",
        f"first-step interval not wholly below 1/degree - {RULE['chance_band']} = {low:.3f}",
        ar_first.text(3),
        ar_first.high >= low,
    )


def rules() -> list[str]:
    """The rules the report states before its numbers."""
    return rule_text("seeds", "learned") + [
        "**Rule (path-star).** Per graph setting, on held-out graphs: *reproduced* when the "
        f"MDM's exact-match interval is at or above {RULE['mdm_exact']} (it solves the task) "
        "and the forward AR's first-step interval lies inside 1/degree +- "
        f"{RULE['chance_band']} (the shortcut at chance); *not reproduced* when the MDM's "
        f"interval is below {RULE['mdm_exact']} or the AR's first step is above that band; "
        "inconclusive otherwise; every setting must be reproduced. Learned checks, in every "
        "seed: the positive control (an AR trained on the same graphs with the path written "
        f"from the goal back) reaches exact match {RULE['control_exact']}, and each model's "
        "one-hop lookup accuracy (`eval.synthetic.pathstar_probe.one_hop_lookups`) is at least "
        f"{RULE['lookup']}: "
        "a model that cannot read the edge list has not been trained enough to test planning; "
        "and the AR's first step is not wholly below the chance band (an AR below chance has "
        "not learned the shortcut, so it is *inconclusive (not trained)*, not a refutation). "
        "Decoding: greedy (AR); the MDM most-confident-first, one position per step."
    ]


@dataclass
class Sections:
    """What the per-setting judgements add up to: the two tables' rows, each setting's verdict
    and summary, and the learned checks."""

    rows: list[list[str]] = field(default_factory=list)
    positions: list[list[str]] = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)
    summary: list[str] = field(default_factory=list)
    checks: list[LearnedCheck] = field(default_factory=list)


def position_row(label: str, run: str, results: list[dict]) -> list[str]:
    """A run's accuracy per answer position, mean over seeds, and the MDM's decoding order."""
    mean_positions = [
        sum(x["position_accuracy"][i] for x in (res[run] for res in results)) / len(results)
        for i in range(len(results[0][run]["position_accuracy"]))
    ]
    order = results[0][run].get("decoding_step")
    return [label, run.upper(), " ".join(f"{v:.2f}" for v in mean_positions)] + [
        " ".join(f"{v:.1f}" for v in order) if order else "-"
    ]


def setting_checks(label: str, results: list[dict], ar_first: Interval, degree: int) -> list:
    """One graph setting's learned checks: the control, the lookups, the AR not below chance."""
    control = seed_check(
        f"AR, path reversed ({label})",
        results,
        "ar-reversed",
        "exact_match",
        RULE["control_exact"],
        "exact match",
    )
    lookups = [
        seed_check(
            f"{r.upper()} ({label})",
            results,
            r,
            "lookup_accuracy",
            RULE["lookup"],
            "one-hop lookup accuracy",
        )
        for r in ("ar", "mdm")
    ]
    return [control, *lookups, above_chance_check(label, ar_first, degree)]


def judge_setting(sections: Sections, label: str, results: list[dict]) -> None:
    """One graph setting: its intervals, verdict, table rows, checks and summary."""
    degree = results[0]["degree"]
    exact = {r: pooled(results, r, "exact_match") for r in RUNS}
    first = {r: pooled(results, r, "first_step") for r in RUNS}
    lookup = {r: pooled(results, r, "lookup_accuracy") for r in RUNS}
    sections.verdicts[label] = planning_verdict(exact["mdm"], first["ar"], degree)
    for r in RUNS:
        sections.rows.append(
            [
                label,
                r.upper(),
                exact[r].text(3),
                first[r].text(3),
                lookup[r].text(3),
                f"{1 / degree:.3f}",
            ]
        )
        sections.positions.append(position_row(label, r, results))
    sections.checks += setting_checks(label, results, first["ar"], degree)
    sections.summary.append(
        f"{label}: exact match MDM {exact['mdm'].text(3)}, AR {exact['ar'].text(3)}; AR first "
        f"step {first['ar'].text(3)} (chance {1 / degree:.2f})"
    )


def tables(settings: PathStarSettings, sections: Sections) -> list[Table]:
    return [
        Table(
            "Path accuracy on held-out graphs",
            ["graph", "run", "exact match (95%)", "first step (95%)", "one-hop lookups", "chance"],
            sections.rows,
            note=f"{settings.test} held-out graphs per seed, seeds {list(settings.seeds)}, "
            f"{settings.strings} training graphs per seed, labels from a pool of "
            f"{settings.symbols}. AR-REVERSED writes the path from the goal back (its 'first "
            "step' is the goal's parent).",
        ),
        Table(
            "Per answer position",
            ["graph", "run", "accuracy per position (mean over seeds)", "MDM decoding step"],
            sections.positions,
            note="Positions in the order the run writes them (start first; the reversed control "
            "goal first). The MDM's decoding step is the mean step (0 = first) at which it "
            f"revealed each position, seed {settings.seeds[0]}: a model that plans from the goal "
            "end reveals the last positions first.",
        ),
    ]


def judge(
    scale: str, settings: PathStarSettings, measured: dict[str, list[dict]], out: Path
) -> FindingResult:
    report = start_report(FINDING, scale, out, settings, rules())
    sections = Sections()
    for label, results in measured.items():
        judge_setting(sections, label, results)
    for table in tables(settings, sections):
        report.table(table)
    verdicts = sections.verdicts
    return finish_report(
        report,
        FINDING,
        scale,
        measured="; ".join(sections.summary),
        verdict=combine(list(verdicts.values())),
        rule=f"MDM exact match >= {RULE['mdm_exact']} and AR first step within 1/degree +- "
        f"{RULE['chance_band']}, whole 95% intervals, every graph setting",
        checks=sections.checks,
        numbers={"per_setting": measured, "verdicts": verdicts},
        notes=[f"Per setting: {', '.join(f'{k} {v}' for k, v in verdicts.items())}."],
    )


FINDING = Finding(
    "pathstar",
    CLAIM,
    SETTINGS,
    run,
    gpu_wall="about 6 GPU-hours (2 graph settings x 3 seeds x 3 runs x 40k steps)",
    rule=RULE,
    gpu_budget="d384 x 8 layers, 40k steps of 256 graphs from 200k per seed",
    cost="3 seeds x 3 runs of 1000 steps (AR, MDM, the reversed-path control)",
    runs=runs,
)
