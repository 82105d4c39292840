"""Probes of what a model learned about one synthetic language, each against an exact answer.

* Infilling (HMM): a masked middle span filled by the model, compared with the exact posterior
  mode of each span position (forward-backward), against an AR prefix-only baseline.
* Constrained completion (PCFG): the model completes the first half of a held-out string; the
  whole is judged valid or not by the grammar, with the completion's exact log-probability given
  the prefix.
* Reversal (facts): facts ``a_i b_i`` seen in one direction only, queried forward (a_i -> b_i)
  and in reverse (b_i -> a_i); see ``reversal_probe``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from dllm.canvas import Canvas, mask_token_id
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount
from eval.synthetic.likelihood import language_rows, model_device, symbol_ids
from shared.data.synthetic.base import Language
from shared.data.synthetic.facts import FactsLanguage
from shared.data.synthetic.hmm import HMMLanguage
from shared.data.synthetic.pcfg import PCFGLanguage
from shared.sampling import SamplingConfig
from shared.tokenizer import Tokenizer

# ---- infilling probe (HMM) ----------------------------------------------------------------------


@dataclass(frozen=True)
class InfillTask:
    string: str
    start: int
    stop: int
    posterior: np.ndarray  # [stop - start, vocab] exact posterior marginals

    @property
    def mode(self) -> list[int]:
        return self.posterior.argmax(1).tolist()


def infill_tasks(
    language: HMMLanguage, strings: Sequence[str], span: int, limit: int | None = None
) -> list[InfillTask]:
    """Mask the middle ``span`` symbols of every string with at least one symbol on each side."""
    tasks = []
    for s in strings:
        if len(s) < span + 2:
            continue
        start = (len(s) - span) // 2
        tasks.append(
            InfillTask(s, start, start + span, language.span_posteriors(s, start, start + span))
        )
        if limit is not None and len(tasks) >= limit:
            break
    return tasks


def score_infills(
    tasks: Sequence[InfillTask], fills: Sequence[Sequence[int]], language: Language
) -> dict[str, float]:
    """Per-position scores of symbol-index fills: agreement with the exact posterior mode, the
    expected accuracy against the hidden truth (mean posterior mass of the chosen symbol), and
    the realised accuracy against the held-out symbols."""
    if not tasks:
        return {"n_tasks": 0}
    mode, expected, truth, total = 0, 0.0, 0, 0
    for task, fill in zip(tasks, fills, strict=True):
        for j, chosen in enumerate(fill):
            total += 1
            mode += int(chosen == task.mode[j])
            if 0 <= chosen < task.posterior.shape[1]:
                expected += float(task.posterior[j, chosen])
            truth += int(chosen == language.alphabet.find(task.string[task.start + j]))
    return {
        "n_tasks": len(tasks),
        "positions": total,
        "mode_agreement": mode / total,
        "expected_accuracy": expected / total,
        "held_out_accuracy": truth / total,
    }


def oracle_infills(tasks: Sequence[InfillTask]) -> list[list[int]]:
    return [task.mode for task in tasks]


def _symbol_index(tokenizer: Tokenizer, language: Language, token: int) -> int:
    text = tokenizer.decode([token]) if token < tokenizer.eos_id else ""
    return language.alphabet.find(text) if len(text) == 1 else -1


@torch.no_grad()
def ar_prefix_infills(
    model: nn.Module, tokenizer: Tokenizer, language: Language, tasks: Sequence[InfillTask]
) -> list[list[int]]:
    """Baseline: greedy AR continuation of the prefix, blind to the suffix."""
    device = model_device(model)
    fills = []
    for task in tasks:
        tokens = [tokenizer.eos_id, *tokenizer.encode(task.string[: task.start])]
        fill = []
        for _ in range(task.stop - task.start):
            logits = model(torch.tensor([tokens], device=device), attention="causal")[0, -1]
            token = int(logits[: tokenizer.vocab_size].argmax())
            tokens.append(token)
            fill.append(_symbol_index(tokenizer, language, token))
        fills.append(fill)
    return fills


def mdm_infills(
    model: nn.Module,
    tokenizer: Tokenizer,
    language: Language,
    tasks: Sequence[InfillTask],
    seq_len: int,
    *,
    config: Any = None,
) -> list[list[int]]:
    """The MDM fills the span seeing both sides: the row is the padded training row with the
    span masked; default decoding is greedy, most confident position first."""
    if not tasks:
        return []
    span = tasks[0].stop - tasks[0].start
    config = config or SamplerConfig(
        FixedCount(steps=span, remasking="low_confidence"), sampling=SamplingConfig(temperature=0)
    )
    generator = DiffusionGenerator(model, tokenizer)
    rows = torch.as_tensor(
        language_rows([t.string for t in tasks], tokenizer, seq_len, language), dtype=torch.long
    )
    for i, task in enumerate(tasks):
        rows[i, 1 + task.start : 1 + task.stop] = generator.mask_id
    result = generator.fill(Canvas(rows, generator.mask_id), config, seed=0, eos="none").raw
    return [
        [
            _symbol_index(tokenizer, language, int(tok))
            for tok in result.tokens[i, 1 + task.start : 1 + task.stop]
        ]
        for i, task in enumerate(tasks)
    ]


# ---- constrained completion probe (PCFG) --------------------------------------------------------


def completion_prefixes(strings: Sequence[str], limit: int) -> list[str]:
    """The first half of each held-out string of 4+ symbols: usually leaves brackets open, so a
    valid completion must close them in the right order within the grammar's caps."""
    return [s[: len(s) // 2] for s in strings if len(s) >= 4][:limit]


def prefix_log_prob(language: Language, prefix: str) -> float:
    """log P(a string starts with ``prefix``), by the chain rule of next-symbol conditionals."""
    total = 0.0
    for t, symbol in enumerate(prefix):
        total += float(language.next_log_probs(prefix[:t])[language.symbol_index(symbol)])
    return total


def completion_metrics(
    language: Language, prefixes: Sequence[str], completions: Sequence[str]
) -> dict[str, Any]:
    """Validity of prefix + completion, and the exact true log P(completion | prefix) of the
    valid ones (the true model's own completions average minus the conditional entropy)."""
    if len(prefixes) != len(completions) or not prefixes:
        raise ValueError(
            f"got {len(prefixes)} prefixes and {len(completions)} completions; need equal, > 0"
        )
    full = [p + c for p, c in zip(prefixes, completions)]
    log_p = language.log_probs(full)
    valid = np.isfinite(log_p)
    out: dict[str, Any] = {"n": len(full), "valid_fraction": float(valid.mean())}
    if isinstance(language, PCFGLanguage):
        out["balanced_fraction"] = float(np.mean([language.is_balanced(s) for s in full]))
    if valid.any():
        conditional = [
            lp - prefix_log_prob(language, p) for p, lp, ok in zip(prefixes, log_p, valid) if ok
        ]
        out["true_log_prob_given_prefix"] = float(np.mean(conditional))
    return out


@torch.no_grad()
def ar_complete(
    model: nn.Module, tokenizer: Tokenizer, prefixes: Sequence[str], seq_len: int, seed: int = 0
) -> list[str]:
    """Ancestral AR continuation of each prefix until EOS or until the row (BOS + prefix +
    continuation) fills ``seq_len`` positions."""
    generator = torch.Generator().manual_seed(seed)
    device = model_device(model)
    out = []
    for prefix in prefixes:
        tokens = [tokenizer.eos_id, *tokenizer.encode(prefix)]
        generated: list[int] = []
        while len(tokens) < seq_len:
            logits = model(torch.tensor([tokens], device=device), attention="causal")[0, -1]
            probs = torch.softmax(logits[: tokenizer.vocab_size].double().cpu(), -1)
            token = int(torch.multinomial(probs, 1, generator=generator))
            if token == tokenizer.eos_id:
                break
            tokens.append(token)
            generated.append(token)
        out.append(tokenizer.decode([t for t in generated if t < tokenizer.eos_id]))
    return out


def mdm_complete(
    model: nn.Module, tokenizer: Tokenizer, prefixes: Sequence[str], seq_len: int, seed: int = 0
) -> list[str]:
    """MDM continuation of each prefix: ``[BOS] + prefix + [MASK]...`` up to ``seq_len``,
    sampled one random position per step, cut at the first EOS."""
    generator = DiffusionGenerator(model, tokenizer)
    out: dict[int, str] = {}
    by_length: dict[int, list[int]] = {}
    for i, prefix in enumerate(prefixes):
        by_length.setdefault(len(prefix), []).append(i)
    for length, indices in sorted(by_length.items()):
        gen_length = seq_len - 1 - length
        config = SamplerConfig(FixedCount(steps=gen_length, remasking="random"))
        result = generator.generate(
            [tokenizer.encode(prefixes[i]) for i in indices], gen_length, config, seed=seed + length
        )
        for i, row in zip(indices, result.tokens):
            out[i] = tokenizer.decode([t for t in row if t < tokenizer.eos_id])
    return [out[i] for i in range(len(prefixes))]


# ---- reversal probe (facts) ---------------------------------------------------------------------


def _accuracy(scores: torch.Tensor, answers: Sequence[int]) -> float:
    """Fraction of rows whose argmax (first on ties) is the answer's column."""
    return float((scores.argmax(-1).cpu() == torch.tensor(list(answers))).double().mean())


@torch.no_grad()
def reversal_probe(
    model: nn.Module, tokenizer: Tokenizer, language: FactsLanguage, objective: str, seq_len: int
) -> dict[str, Any]:
    """Facts learned forward (``a_i b_i``; the paired ones also reversed), queried both ways.

    Both objectives are asked the same questions in the same surface order:

    ``forward_accuracy``: b_i after ``[BOS, a_i]``, over every fact, argmax over all b's;
    ``reverse_held_out_accuracy``: a_i after ``[BOS, b_i]`` for the held-out facts, whose
    reversed order never appeared in training (the reversal-curse query), argmax over the
    held-out a's, so chance is 1/held-out;
    ``reverse_paired_accuracy``: the same query on the paired facts, which training showed
    reversed (a positive control that the reversed format is learned); None without pairs.

    The AR answers with the next token after ``[BOS, b_i]``; the MDM fills position 2 of
    ``[BOS, b_i, MASK, EOS, ...]``. Two more rows separate "cannot produce" from "cannot
    represent": the AR's ``reverse_scored_accuracy`` ranks the held-out a's by its own forward
    likelihood log p(a | BOS) + log p(b_i | BOS, a) (N forward passes, not a reverse query), and
    the MDM's ``infill_reverse_accuracy`` fills position 1 of ``[BOS, MASK, b_i, EOS]``, a
    conditional its training masks ask directly (so it is not a reversal test).
    """
    if objective not in ("ar", "mdm"):
        raise ValueError(f"objective={objective!r}; valid: 'ar', 'mdm'")
    out: dict[str, Any] = {
        "objective": objective,
        "n_pairs": language.pairs,
        "n_held_out": len(language.held_out),
        "n_paired": len(language.paired),
        "chance": 1.0 / len(language.held_out),
    }
    if objective == "mdm":
        return out | _mdm_reversal(model, tokenizer, language, seq_len)
    return out | _ar_reversal(model, tokenizer, language)


def _answered(
    scores: torch.Tensor, facts: Sequence[tuple[str, str]], role: int, id_of: dict[str, int]
) -> float:
    """Accuracy of ``scores`` [fact, vocab] restricted to the facts' symbols in ``role`` (0: a,
    1: b): fact i's answer is column i of that candidate list."""
    return _accuracy(scores[:, [id_of[fact[role]] for fact in facts]], range(len(facts)))


def _mdm_reversal(
    model: nn.Module, tokenizer: Tokenizer, language: FactsLanguage, seq_len: int
) -> dict[str, float | None]:
    """The MDM fills position 2 of ``[BOS, x, MASK, EOS, ...]`` for the forward and reverse
    queries, and position 1 of ``[BOS, MASK, b_i, EOS, ...]`` for the infill row."""
    id_of = dict(zip(language.alphabet, symbol_ids(language, tokenizer)))
    device = model_device(model)
    mask_id = mask_token_id(model, tokenizer)
    held_out, paired, facts = language.held_out, language.paired, language.facts

    def infill(strings: list[str], position: int) -> torch.Tensor:
        query = torch.as_tensor(
            language_rows(strings, tokenizer, seq_len, language), dtype=torch.long
        )
        query[:, position] = mask_id
        logits = model(query.to(device), attention="bidirectional")
        return logits[:, position].cpu()

    def reverse(asked: list[tuple[str, str]]) -> float:
        return _answered(infill([b + a for a, b in asked], 2), asked, 0, id_of)

    return {
        "forward_accuracy": _answered(infill([a + b for a, b in facts], 2), facts, 1, id_of),
        "reverse_held_out_accuracy": reverse(held_out),
        "reverse_paired_accuracy": reverse(paired) if paired else None,
        "infill_reverse_accuracy": _answered(
            infill([a + b for a, b in held_out], 1), held_out, 0, id_of
        ),
    }


def _ar_reversal(
    model: nn.Module, tokenizer: Tokenizer, language: FactsLanguage
) -> dict[str, float | None]:
    """The AR answers with its next token after ``[BOS, x]``; its likelihood-scored row ranks
    the held-out a's by its forward probability of each fact."""
    id_of = dict(zip(language.alphabet, symbol_ids(language, tokenizer)))
    device = model_device(model)
    bos, vocab = tokenizer.eos_id, tokenizer.vocab_size
    held_out, paired, facts = language.held_out, language.paired, language.facts

    def next_log_probs(firsts: list[str]) -> torch.Tensor:
        prompts = torch.tensor([[bos, id_of[x]] for x in firsts], device=device)
        logits = model(prompts, attention="causal")[..., :vocab].double()
        return torch.log_softmax(logits, -1).cpu()

    def reverse(asked: list[tuple[str, str]]) -> float:
        return _answered(next_log_probs([b for _, b in asked])[:, 1], asked, 0, id_of)

    forward = next_log_probs([a for a, _ in facts])
    return {
        "forward_accuracy": _answered(forward[:, 1], facts, 1, id_of),
        "reverse_held_out_accuracy": reverse(held_out),
        "reverse_paired_accuracy": reverse(paired) if paired else None,
        "reverse_scored_accuracy": _likelihood_scored_accuracy(forward, language, id_of),
    }


def _likelihood_scored_accuracy(
    forward: torch.Tensor, language: FactsLanguage, id_of: dict[str, int]
) -> float:
    """How often argmax_j log p(a_j, b_i) over the held-out facts j is fact i, from the AR's
    ``forward`` log-probabilities [fact, position (after BOS, after a), vocab]."""
    held_out = language.held_out
    rows_of = {a: i for i, (a, _) in enumerate(language.facts)}
    index = [rows_of[a] for a, _ in held_out]
    a_ids, b_ids = [id_of[a] for a, _ in held_out], [id_of[b] for _, b in held_out]
    # scored[i, j] = log p(a_j | BOS) + log p(b_i | BOS, a_j)
    scored = forward[index[0], 0, a_ids][None, :] + forward[index][:, 1, b_ids].T
    return _accuracy(scored, range(len(held_out)))
