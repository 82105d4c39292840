"""The comparison on synthetic languages, where likelihood and sample quality are exact.

    python -m eval.experiments.compare --preset synthetic-smoke --out runs/synthetic-smoke  # CI
    python -m eval.experiments.compare --preset synthetic --out runs/synthetic

For every language of the preset (a hidden Markov model, a bracket grammar, a teacher
transformer, a table of facts; see ``shared/data/synthetic/``) an AR and an MDM model are trained
with the same shape, data and budget; ``eval.synthetic.report.synthetic_report`` then measures each
against the true distribution: the gap between its NLL/NELBO and the exact entropy, the exact
log-probability and validity of its samples, and infilling (HMM), completion (grammar) or
reversal (facts) probes. The report is written as ``report.md`` / ``report.json`` with plots,
like the real-text comparison.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.experiments.stages import Stages, train_both, training_seed
from eval.report import Report, Table
from eval.synthetic.report import synthetic_report
from shared.errors import ConfigError
from shared.faults import StopRequest


@dataclass(frozen=True)
class Language:
    spec: str
    seq_len: int  # >= the language's longest string + BOS + EOS


@dataclass(frozen=True)
class SyntheticSettings:
    languages: tuple[Language, ...]
    preset: str  # the training preset every run starts from
    overrides: dict  # training settings shared by every run
    samples: int
    heldout: int
    nelbo_samples: int


SYNTHETIC_PRESETS = {
    "synthetic-smoke": SyntheticSettings(
        languages=(
            Language("synthetic:hmm?n=4000&n_val=200", 16),
            Language("synthetic:pcfg?n=4000&n_val=200", 64),
            Language("synthetic:facts?pairs=16&both=8&n=4000&n_val=200", 4),
        ),
        preset="tiny",
        overrides=dict(max_steps=200, batch_size=32, eval_every=100, lr=5e-3),
        samples=64,
        heldout=200,
        nelbo_samples=4,
    ),
    "synthetic": SyntheticSettings(
        languages=(
            Language("synthetic:hmm", 16),
            Language("synthetic:pcfg", 64),
            Language("synthetic:teacher", 32),
            Language("synthetic:facts?pairs=16&both=8", 4),
        ),
        preset="tiny",
        overrides=dict(
            dim=128,
            n_layers=4,
            n_heads=4,
            n_kv_heads=4,
            hidden_dim=352,
            max_steps=3000,
            batch_size=64,
            eval_every=500,
            lr=2e-3,
        ),
        samples=512,
        heldout=1000,
        nelbo_samples=8,
    ),
}


def language_label(spec: str) -> str:
    return spec.split(":", 1)[1].split("?", 1)[0]


def run_synthetic(
    preset: str, out: Path, extra: dict[str, Any], force: bool, stop: StopRequest | None = None
) -> dict[str, Path]:
    """Train and measure every language of ``preset``, then write the report under ``out``."""
    if preset not in SYNTHETIC_PRESETS:
        raise ConfigError(
            f"preset={preset!r} is unknown; synthetic presets: {sorted(SYNTHETIC_PRESETS)}"
        )
    settings = SYNTHETIC_PRESETS[preset]
    started = time.perf_counter()
    stages = Stages(out, force, stop)
    results = {
        language_label(language.spec): measure_language(
            settings, language, out, extra, force, stages
        )
        for language in settings.languages
    }
    # one seed for every language's runs: the one the last language's AR was trained with
    seed = training_seed(out / language_label(settings.languages[-1].spec) / "ar")
    report = Report(
        f"AR vs masked diffusion on synthetic languages: preset `{preset}`",
        out,
        config={"preset": preset, "settings": dataclasses.asdict(settings)},
        seeds={"train": seed, "sampling": 0},
    )
    report.text(INTRODUCTION)
    report.table(likelihood_table(results))
    report.table(samples_table(results))
    probes = probes_table(results)
    if probes.rows:
        report.table(probes)
    _plots(report, results)
    report.results.update({"languages": results, "wall_seconds": time.perf_counter() - started})
    return report.write()


def measure_language(
    settings: SyntheticSettings,
    language: Language,
    out: Path,
    extra: dict[str, Any],
    force: bool,
    stages: Stages,
) -> dict[str, Any]:
    """Train the AR and MDM models of one language (reused when finished) and measure both
    against its true distribution (a stored stage unless the training or settings changed)."""
    label = language_label(language.spec)
    overrides = settings.overrides | {
        "dataset": language.spec,
        "tokenizer": "byte",
        "protocol": "padded",
        "seq_len": language.seq_len,
        "max_seq_len": max(64, language.seq_len),
    }
    summaries = train_both(settings.preset, out / label, overrides | extra, "tokens", force)
    key = {
        "train": {k: v["step"] for k, v in summaries.items()},
        "settings": dataclasses.asdict(settings),
        "spec": language.spec,
    }
    result = stages.run(
        f"exact-{label}",
        key,
        lambda: synthetic_report(
            str(out / label / "ar"),
            str(out / label / "mdm"),
            language.spec,
            settings.samples,
            n_heldout=settings.heldout,
            nelbo_samples=settings.nelbo_samples,
        ),
    )
    result["training"] = {
        k: {"tokens_seen": v["tokens_seen"], "step": v["step"]} for k, v in summaries.items()
    }
    return result


INTRODUCTION = (
    "Every number below is measured against the *true* distribution of the language: the "
    "entropy is exact (or a labelled Monte-Carlo estimate), the judge of the samples is the "
    "true probability, validity is decided by the language's own rules. Gaps are in nats "
    "per token with EOS counted; the MDM gap uses its NELBO (an upper bound)."
)

MODELS = ("ar", "mdm")


def likelihood_table(results: dict[str, Any]) -> Table:
    """Each model's NLL/NELBO against the language's exact entropy."""
    rows = []
    for label, result in results.items():
        entropy = result["language"]["entropy"]["nats_per_token"]
        for name in MODELS:
            likelihood = result[name]["likelihood"]
            rows.append(
                [
                    label,
                    name.upper(),
                    entropy,
                    likelihood["model_nats_per_token"],
                    likelihood["gap_to_true_nll"],
                    likelihood["gap_to_true_nll_stderr"],
                    likelihood["gap_to_entropy"],
                ]
            )
    return Table(
        "Likelihood against the exact entropy",
        [
            "language",
            "model",
            "true entropy",
            "model nats/token",
            "gap to true NLL",
            "stderr",
            "gap to entropy",
        ],
        rows,
    )


def samples_table(results: dict[str, Any]) -> Table:
    """Each model's samples judged by the true distribution."""
    rows = []
    for label, result in results.items():
        for name in MODELS:
            samples = result[name]["samples"]
            rows.append(
                [
                    label,
                    name.upper(),
                    samples["valid_fraction"],
                    samples.get("true_nll_nats_per_token", float("nan")),
                    samples.get("kl_plugin", float("nan")),
                    samples.get("kl_mc", "-"),
                ]
            )
    return Table(
        "Samples judged by the true distribution",
        [
            "language",
            "model",
            "valid fraction",
            "true NLL/token (valid)",
            "KL plug-in",
            "KL Monte Carlo",
        ],
        rows,
        note="KL plug-in is biased upward with few samples; the Monte-Carlo KL "
        "needs the sampler's own log q and exists for AR only.",
    )


def probes_table(results: dict[str, Any]) -> Table:
    """Infilling, completion and reversal scores with their references (true posterior,
    chance); a table without rows when no language has a probe."""
    rows = [row for label, result in results.items() for row in probe_rows(label, result)]
    return Table(
        "Capability probes",
        ["language", "model", "probe", "score"],
        rows,
        note="infill: agreement with the exact posterior mode of a masked "
        "span (the MDM sees both sides, AR only the prefix); completion: "
        "fraction of valid completions of half-strings; reversal: accuracy of b_i "
        "given a_i (forward) and of a_i given b_i in the same order for both models "
        "(reverse: the AR's next token after b_i, the MDM's fill after b_i), on the "
        "held-out facts (never seen reversed; the reversal-curse query) and the paired "
        "ones (seen reversed too). 'reverse, likelihood-scored' is argmax_a "
        "p_AR(a, b_i) over the held-out a's: the AR answering through its forward "
        "direction, not a reverse query.",
    )


def probe_rows(label: str, result: dict[str, Any]) -> list[list[Any]]:
    """One language's probe rows: each model's probes, then the references."""
    rows = []
    for name in MODELS:
        section = result[name]
        for probe in ("infill", "infill_prefix_only", "completion"):
            if probe in section:
                rows.append([label, name.upper(), probe, _probe_score(section[probe])])
        for key, probe in REVERSAL_ROWS:
            if section.get("reversal", {}).get(key) is not None:
                rows.append([label, name.upper(), probe, section["reversal"][key]])
    if "infill_oracle" in result:
        rows.append([label, "true posterior", "infill", _probe_score(result["infill_oracle"])])
    if "reversal" in result["ar"]:
        rows.append([label, "chance (1/held-out)", "reversal", result["ar"]["reversal"]["chance"]])
    return rows


REVERSAL_ROWS = (
    ("forward_accuracy", "reversal: forward"),
    ("reverse_held_out_accuracy", "reversal: reverse, held-out facts"),
    ("reverse_paired_accuracy", "reversal: reverse, paired facts"),
    ("reverse_scored_accuracy", "reversal: reverse, likelihood-scored"),
    ("infill_reverse_accuracy", "reversal: infill position 1 (a training conditional)"),
)


def _probe_score(probe: dict[str, Any]) -> float:
    for key in ("mode_agreement", "valid_fraction", "accuracy"):
        if key in probe:
            return float(probe[key])
    return float("nan")


def _plots(report, results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(results)
    for name, title, ylabel, pick in (
        (
            "gap_to_entropy",
            "Likelihood gap to the true entropy",
            "nats/token",
            lambda s: s["likelihood"]["gap_to_entropy"],
        ),
        (
            "valid_fraction",
            "Valid samples",
            "fraction of samples",
            lambda s: s["samples"]["valid_fraction"],
        ),
    ):
        figure, axis = plt.subplots(figsize=(6, 4))
        width = 0.38
        for offset, model in ((-width / 2, "ar"), (width / 2, "mdm")):
            axis.bar(
                [i + offset for i in range(len(labels))],
                [pick(results[lab][model]) for lab in labels],
                width,
                label=model.upper(),
            )
        axis.set_xticks(range(len(labels)), labels)
        axis.set_ylabel(ylabel)
        axis.set_title(title)
        axis.legend()
        axis.grid(alpha=0.3, axis="y")
        report.plot(name, figure, title)
