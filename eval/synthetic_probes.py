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
from dllm.generate import SamplerConfig
from dllm.generator import DiffusionGenerator
from dllm.strategies import FixedCount
from eval.synthetic_likelihood import language_rows, symbol_ids
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
    device = next(iter(model.parameters()), torch.empty(0)).device
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
    device = next(iter(model.parameters()), torch.empty(0)).device
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


def _device(model: nn.Module) -> torch.device:
    return next(iter(model.parameters()), torch.empty(0)).device


def _accuracy(scores: torch.Tensor, answers: Sequence[int]) -> float:
    """Fraction of rows whose argmax (first on ties) is the answer's column."""
    return float((scores.argmax(-1).cpu() == torch.tensor(list(answers))).double().mean())


@torch.no_grad()
def reversal_probe(
    model: nn.Module, tokenizer: Tokenizer, language: FactsLanguage, objective: str, seq_len: int
) -> dict[str, Any]:
    """Facts learned in one direction (``a_i b_i``), queried in both.

    Every query is an argmax over the N candidate symbols of the asked role (the b's forward,
    the a's in reverse), so chance is exactly 1/N and a uniform model scores 1/N.

    MDM (``objective="mdm"``): forward = the masked-token prediction of position 2 on the padded
    training row ``[BOS, a_i, MASK, EOS, ...]``; reverse = position 1 on ``[BOS, MASK, b_i, ...]``.
    Training masks either position, so both directions are trained.

    AR: forward = the next token after ``[BOS, a_i]``. Reverse, two ways:
    ``reverse_prompted_accuracy``: the next token after ``[BOS, b_i]``, the reversal-curse query
        (no b was ever a first symbol in training, so this asks for a fact the model was never
        trained to produce from that prompt);
    ``reverse_scored_accuracy``: argmax over a of log p(a | BOS) + log p(b_i | BOS, a), the
        likelihood of the two-symbol prefix: the AR answers the reverse question through its
        forward conditionals by scoring all N candidates (N forward passes' worth of work), which
        is not a reverse query of the model.
    """
    if objective not in ("ar", "mdm"):
        raise ValueError(f"objective={objective!r}; valid: 'ar', 'mdm'")
    ids = symbol_ids(language, tokenizer)
    id_of = dict(zip(language.alphabet, ids))
    a_ids = [id_of[a] for a in language.firsts]
    b_ids = [id_of[b] for b in language.seconds]
    n = language.pairs
    answers = list(range(n))  # pair i: a_i is column i of a_ids, b_i column i of b_ids
    device = _device(model)
    out: dict[str, Any] = {"n_pairs": n, "chance": 1.0 / n, "objective": objective}
    if objective == "mdm":
        mask_id = mask_token_id(model, tokenizer)
        rows = torch.as_tensor(
            language_rows([a + b for a, b in language.facts], tokenizer, seq_len, language),
            dtype=torch.long,
        )
        forward, reverse = rows.clone(), rows.clone()
        forward[:, 2] = mask_id
        reverse[:, 1] = mask_id
        logits = model(torch.cat([forward, reverse]).to(device), attention="bidirectional")
        out["forward_accuracy"] = _accuracy(logits[:n, 2][:, b_ids], answers)
        out["reverse_accuracy"] = _accuracy(logits[n:, 1][:, a_ids], answers)
        out["reverse_method"] = "infill position 1 given position 2 (bidirectional)"
        return out
    bos = tokenizer.eos_id
    vocab = tokenizer.vocab_size
    firsts = torch.tensor([[bos, a] for a in a_ids], device=device)
    log_p = torch.log_softmax(model(firsts, attention="causal")[..., :vocab].double(), -1).cpu()
    out["forward_accuracy"] = _accuracy(log_p[:, 1][:, b_ids], answers)
    prompted = torch.tensor([[bos, b] for b in b_ids], device=device)
    logits = model(prompted, attention="causal")[:, 1, :vocab].cpu()
    out["reverse_prompted_accuracy"] = _accuracy(logits[:, a_ids], answers)
    # scored[i, j] = log p(a_j | BOS) + log p(b_i | BOS, a_j)
    scored = log_p[0, 0, a_ids][None, :] + log_p[:, 1, b_ids].T
    out["reverse_scored_accuracy"] = _accuracy(scored, answers)
    out["reverse_method"] = (
        "prompted: next token after [BOS, b_i]; scored: argmax_a log p(a, b_i) over all N a's"
    )
    return out
