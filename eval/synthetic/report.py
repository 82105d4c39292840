"""Exact metrics on synthetic languages (``shared.data.synthetic``), where the truth is known,
for an AR and/or an MDM checkpoint in one report (``synthetic_report``):

* Likelihood (``eval.synthetic.likelihood``): the true entropy of the language and, for a model,
  the gap between its NLL (AR) or NELBO (MDM) and the truth on held-out strings.
* Samples (``eval.synthetic.samples``): their exact log-probability under the true distribution
  (a perfect judge), the fraction that is valid, and KL(sample distribution || data) estimates.
* Probes (``eval.synthetic.probes``): infilling (HMM) against the exact posterior mode,
  constrained completion (PCFG), and the reversal probe (facts); ``eval.synthetic.pathstar_probe``
  on the path-star planning task.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from eval.synthetic.likelihood import language_rows, likelihood_gap, model_estimate, true_entropy
from eval.synthetic.pathstar_probe import pathstar_probe
from eval.synthetic.probes import (
    InfillTask,
    ar_complete,
    ar_prefix_infills,
    completion_metrics,
    completion_prefixes,
    infill_tasks,
    mdm_complete,
    mdm_infills,
    oracle_infills,
    reversal_probe,
    score_infills,
)
from eval.synthetic.samples import ar_sample, mdm_sample, sample_metrics
from shared.checkpoint import load_model_from_checkpoint
from shared.data.synthetic.base import Language, derive_seed
from shared.data.synthetic.facts import FactsLanguage
from shared.data.synthetic.hmm import HMMLanguage
from shared.data.synthetic.pathstar import PathStarLanguage
from shared.data.synthetic.pcfg import PCFGLanguage
from shared.data.synthetic.specs import build_language
from shared.objective import objective_for_run
from shared.tokenizer import Tokenizer


def _load(checkpoint: str | Path) -> tuple[nn.Module, Tokenizer, dict, Any]:
    model, tokenizer, state = load_model_from_checkpoint(Path(checkpoint))
    objective = objective_for_run(state["objective"], state["train_config"], tokenizer)
    return model, tokenizer, state, objective


def synthetic_report(
    ar_checkpoint: str | Path | None,
    mdm_checkpoint: str | Path | None,
    language_spec: str,
    n_samples: int,
    *,
    n_heldout: int = 1000,
    nelbo_samples: int = 8,
    infill_span: int = 2,
    infill_tasks_max: int = 200,
    seed: int = 0,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Exact metrics for an AR and/or an MDM checkpoint trained on ``language_spec``.

    Held-out strings are fresh i.i.d. draws (a seed stream the corpus never uses), scored on
    padded rows of each checkpoint's own ``seq_len``. For an MDM trained with the packed
    protocol, padded rows are a (documented) shift from its training rows; AR is unaffected."""
    language = build_language(language_spec)
    entropy = true_entropy(language)
    heldout = language.sample(n_heldout, derive_seed(seed, 1000))
    report: dict[str, Any] = {
        "language": {"spec": language_spec, "name": language.name, "entropy": entropy},
        "n_heldout": n_heldout,
        "n_samples": n_samples,
    }
    tasks: list[InfillTask] = []
    if isinstance(language, HMMLanguage) and infill_span > 0:
        tasks = infill_tasks(language, heldout, infill_span, limit=infill_tasks_max)
        report["infill_oracle"] = score_infills(tasks, oracle_infills(tasks), language)
    prefixes = []
    if isinstance(language, PCFGLanguage):
        prefixes = completion_prefixes(heldout, infill_tasks_max)
    shared = _Shared(
        language, entropy, heldout, tasks, prefixes, n_samples, nelbo_samples, infill_tasks_max
    )
    for label, checkpoint in (("ar", ar_checkpoint), ("mdm", mdm_checkpoint)):
        if checkpoint is not None:
            report[label] = model_section(label, checkpoint, shared, seed, batch_size)
    return report


@dataclass(frozen=True)
class _Shared:
    """What every model of one report is measured on."""

    language: Language
    entropy: dict[str, Any]
    heldout: list[str]
    tasks: list[InfillTask]  # the HMM's infilling tasks; none for other languages
    prefixes: list[str]  # the PCFG's completion prefixes; none for other languages
    n_samples: int
    nelbo_samples: int
    probe_max: int  # examples per probe


def model_section(
    label: str, checkpoint: str | Path, shared: _Shared, seed: int, batch_size: int
) -> dict[str, Any]:
    """One checkpoint's likelihood gap, samples and the probes its language has."""
    model, tokenizer, state, objective = _load(checkpoint)
    if objective.name != label:
        raise ValueError(
            f"{label}_checkpoint={str(checkpoint)!r} was trained with objective "
            f"{objective.name!r}; expected {label!r}"
        )
    language = shared.language
    seq_len = int(state["train_config"]["seq_len"])
    rows = language_rows(shared.heldout, tokenizer, seq_len, language)
    estimate = model_estimate(
        model,
        objective,
        rows,
        tokenizer,
        nelbo_samples=shared.nelbo_samples,
        batch_size=batch_size,
        seed=seed,
    )
    section: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "protocol": state["train_config"].get("protocol"),
        "likelihood": likelihood_gap(estimate, language, shared.heldout, shared.entropy),
    }
    samples, texts = _samples(label, model, tokenizer, seq_len, shared, seed)
    section.update(samples)
    if isinstance(language, FactsLanguage):
        section["reversal"] = reversal_probe(model, tokenizer, language, label, seq_len)
    if isinstance(language, PathStarLanguage):
        probe = shared.heldout[: shared.probe_max]
        section["pathstar"] = pathstar_probe(
            model, tokenizer, language, label, seq_len, probe, batch_size=batch_size, seed=seed
        )
    if shared.prefixes:
        complete = ar_complete if label == "ar" else mdm_complete
        completions = complete(model, tokenizer, shared.prefixes, seq_len, seed=seed)
        section["completion"] = completion_metrics(language, shared.prefixes, completions)
    section["sample_examples"] = texts[:5]
    return section


def _samples(
    label: str,
    model: nn.Module,
    tokenizer: Tokenizer,
    seq_len: int,
    shared: _Shared,
    seed: int,
) -> tuple[dict[str, Any], list[str]]:
    """The model's samples judged by the true distribution and its infills of the HMM's tasks
    (the AR from the prefix alone, the MDM seeing both sides); and the sample texts."""
    language, entropy = shared.language, shared.entropy
    section: dict[str, Any] = {}
    if label == "ar":
        texts, log_q = ar_sample(model, tokenizer, shared.n_samples, seq_len - 1, seed=seed)
        section["samples"] = sample_metrics(language, texts, sample_log_q=log_q, entropy=entropy)
        if shared.tasks:
            fills = ar_prefix_infills(model, tokenizer, language, shared.tasks)
            section["infill_prefix_only"] = score_infills(shared.tasks, fills, language)
    else:
        texts = mdm_sample(model, tokenizer, shared.n_samples, seq_len - 1, seed=seed)
        section["samples"] = sample_metrics(language, texts, entropy=entropy)
        if shared.tasks:
            fills = mdm_infills(model, tokenizer, language, shared.tasks, seq_len)
            section["infill"] = score_infills(shared.tasks, fills, language)
    return section, texts
