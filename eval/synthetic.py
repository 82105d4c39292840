"""Exact metrics on synthetic languages (``shared.synthetic``), where the truth is known.

* Likelihood: the true entropy of the language and, for a model, the gap between its NLL (AR)
  or NELBO (MDM) and the truth on held-out strings, scored on rows built like the padded
  training rows (``[EOS] + string + [EOS] + PAD``) so EOS counts as a token on both sides.
* Samples: their exact log-probability under the true distribution (a perfect judge), the
  fraction that is valid, and KL(sample distribution || data) estimates (see ``sample_metrics``).
* Infilling (HMM): a masked middle span filled by the model, compared with the exact posterior
  mode of each span position (forward-backward), against an AR prefix-only baseline.
* Reversal (facts): facts ``a_i b_i`` seen in one direction only, queried forward (a_i -> b_i)
  and in reverse (b_i -> a_i); see ``reversal_probe``.

Two gaps are reported, both in nats per token:
``gap_to_true_nll`` = model - exact true NLL *of the same strings*: a paired estimate of
    KL(data || model) per token (plus the ELBO's looseness for an MDM), with little noise.
``gap_to_entropy`` = model - entropy rate of the language (E[-log p] / E[tokens]).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dllm.canvas import Canvas, mask_token_id
from dllm.generate import SamplerConfig
from dllm.generator import DiffusionGenerator
from dllm.strategies import FixedCount
from eval.likelihood import Estimate, ar_nll, mdm_nelbo
from shared.data import pad_rows
from shared.sampling import SamplingConfig
from shared.synthetic import (
    FactsLanguage,
    HMMLanguage,
    Language,
    PCFGLanguage,
    build_language,
    derive_seed,
)
from shared.tokenizer import Tokenizer

MASKED_LOGIT = -1e4  # "impossible" without -inf, which would turn 0 * -inf into NaN


# ---- rows and token accounting ------------------------------------------------------------------


def symbol_ids(language: Language, tokenizer: Tokenizer) -> list[int]:
    """Token id of each alphabet symbol; every symbol must be exactly one token."""
    ids = [tokenizer.encode(symbol) for symbol in language.alphabet]
    bad = [s for s, i in zip(language.alphabet, ids) if len(i) != 1]
    if bad:
        raise ValueError(
            f"tokenizer kind {tokenizer.kind!r} does not map each symbol of {language.name} to one "
            f"token (symbols {bad!r}); exact per-token metrics need the 'byte' tokenizer"
        )
    return [i[0] for i in ids]


def language_rows(
    strings: Sequence[str], tokenizer: Tokenizer, seq_len: int, language: Language
) -> np.ndarray:
    """Padded rows ``[EOS] + string + [EOS] + PAD...`` (the padded training protocol)."""
    symbol_ids(language, tokenizer)
    longest = max((len(s) for s in strings), default=0)
    if longest + 2 > seq_len:
        raise ValueError(
            f"seq_len={seq_len} is too short for a string of {longest} symbols plus BOS and EOS; "
            f"use seq_len >= {longest + 2} (the language allows up to {language.max_len})"
        )
    encoded = [np.asarray(ids, dtype=np.int32) for ids in tokenizer.encode_batch(list(strings))]
    return pad_rows(encoded, seq_len=seq_len, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)


def ratio_stderr(nats: np.ndarray, tokens: np.ndarray) -> float:
    """Standard error of sum(nats) / sum(tokens) over i.i.d. strings (delta method)."""
    n = len(nats)
    if n < 2:
        return math.nan
    ratio = nats.sum() / tokens.sum()
    residual = nats - ratio * tokens
    return float(math.sqrt((residual**2).sum() / (n * (n - 1))) / tokens.mean())


# ---- likelihood ---------------------------------------------------------------------------------


def true_entropy(language: Language, **options: Any) -> dict[str, Any]:
    """The language's entropy per string and per token (EOS counted), exact where tractable."""
    return language.entropy(**options).as_dict()


def likelihood_gap(
    estimate: Estimate, language: Language, strings: Sequence[str], entropy: dict | None = None
) -> dict[str, Any]:
    """Compare a model's estimate on ``strings`` (rows from ``language_rows``, in order) with the
    truth: the exact true NLL of the same strings and the language's entropy rate."""
    if len(estimate.row_nats) != len(strings):
        raise ValueError(
            f"estimate has {len(estimate.row_nats)} rows but {len(strings)} strings were given"
        )
    tokens = np.array([len(s) + 1 for s in strings], dtype=np.float64)
    if int(tokens.sum()) != estimate.tokens:
        raise ValueError(
            f"estimate covers {estimate.tokens} tokens but the strings have {int(tokens.sum())} "
            "(symbols + one EOS each): were the rows built with language_rows?"
        )
    true_nats = -language.log_probs(strings)
    model_nats = np.asarray(estimate.row_nats, dtype=np.float64)
    entropy = entropy or true_entropy(language)
    model_per_token = estimate.nats_per_token
    true_per_token = float(true_nats.sum() / tokens.sum())
    return {
        "estimate_kind": estimate.kind,
        "strings": len(strings),
        "tokens": int(tokens.sum()),
        "model_nats_per_token": model_per_token,
        "model_mc_stderr": estimate.stderr / tokens.sum(),
        "true_nll_nats_per_token": true_per_token,
        "true_nll_stderr": ratio_stderr(true_nats, tokens),
        "entropy_nats_per_token": entropy["nats_per_token"],
        "entropy_stderr": entropy["nats_per_token_stderr"],
        "entropy_method": entropy["method"],
        "gap_to_true_nll": model_per_token - true_per_token,
        # sampling error across strings plus the estimator's own Monte-Carlo error
        "gap_to_true_nll_stderr": math.hypot(
            ratio_stderr(model_nats - true_nats, tokens), estimate.stderr / tokens.sum()
        ),
        "gap_to_entropy": model_per_token - entropy["nats_per_token"],
        "model_nats_per_string": float(model_nats.mean()),
        "true_nats_per_string": float(true_nats.mean()),
    }


def model_estimate(
    model: nn.Module,
    objective: Any,
    rows: np.ndarray,
    tokenizer: Tokenizer,
    *,
    nelbo_samples: int = 8,
    batch_size: int = 64,
    seed: int = 0,
) -> Estimate:
    """Exact NLL for an AR objective, Monte-Carlo NELBO for an MDM objective."""
    token_bytes = tokenizer.token_bytes()
    if objective.name == "ar":
        return ar_nll(model, objective, rows, token_bytes, batch_size=batch_size)
    if objective.name == "mdm":
        return mdm_nelbo(
            model,
            objective,
            rows,
            token_bytes,
            samples=nelbo_samples,
            batch_size=batch_size,
            seed=seed,
        )
    raise ValueError(f"objective {objective.name!r} is not supported here; valid: 'ar', 'mdm'")


class TrueConditionalModel(nn.Module):
    """A stand-in AR "model" whose logits are the language's exact next-token log-probabilities
    (log P(end) at EOS): scoring it with ``ar_nll`` gives exactly the true NLL, a reference and a
    test of the token accounting. Positions after a row's first EOS get uniform logits."""

    def __init__(self, language: Language, tokenizer: Tokenizer) -> None:
        super().__init__()
        self.language = language
        self.vocab_size = tokenizer.vocab_size
        self.eos_id = tokenizer.eos_id
        self.ids = symbol_ids(language, tokenizer)
        self.symbol_of = {i: s for s, i in zip(language.alphabet, self.ids)}
        self._cache: dict[str, torch.Tensor] = {}

    def logits_after(self, prefix: str) -> torch.Tensor:
        if prefix not in self._cache:
            log_probs = self.language.next_log_probs(prefix)
            logits = torch.full((self.vocab_size,), MASKED_LOGIT, dtype=torch.float64)
            logits[self.ids] = torch.as_tensor(log_probs[:-1]).clamp(min=MASKED_LOGIT)
            logits[self.eos_id] = max(float(log_probs[-1]), MASKED_LOGIT)
            self._cache[prefix] = logits
        return self._cache[prefix]

    def forward(self, tokens: torch.Tensor, attention: str = "causal", output_mask=None):
        batch, length = tokens.shape
        out = torch.zeros((batch, length, self.vocab_size), dtype=torch.float64)
        for b, row in enumerate(tokens.tolist()):
            prefix = ""
            for t, token in enumerate(row):
                if t > 0 and token not in self.symbol_of:
                    break  # the document ended; the rest is never scored
                if t > 0:
                    prefix += self.symbol_of[token]
                out[b, t] = self.logits_after(prefix)
        return out if output_mask is None else out[output_mask]


class UniformModel(nn.Module):
    """Uniform over the alphabet's tokens and EOS: NLL log(V + 1) per token, a known baseline."""

    def __init__(self, language: Language, tokenizer: Tokenizer) -> None:
        super().__init__()
        self.logits = torch.full((tokenizer.vocab_size,), MASKED_LOGIT)
        self.logits[symbol_ids(language, tokenizer) + [tokenizer.eos_id]] = 0.0

    def forward(self, tokens: torch.Tensor, attention: str = "causal", output_mask=None):
        out = self.logits.expand(*tokens.shape, -1)
        return out if output_mask is None else out[output_mask]


# ---- samples -----------------------------------------------------------------------------------


def sample_metrics(
    language: Language,
    samples: Sequence[str],
    *,
    sample_log_q: Sequence[float] | None = None,
    entropy: dict | None = None,
) -> dict[str, Any]:
    """Judge samples by the true distribution.

    ``true_nll_*``: the exact -log p of the valid samples (low = typical or mode-seeking; compare
        with the entropy: a perfect sampler's mean equals it).
    ``kl_plugin``: KL(q_hat || p) with q_hat the empirical distribution of the valid samples:
        sum q_hat log(q_hat / p). Plug-in, so biased upward (by about (distinct - 1) / (2 n) nats)
        unless n_samples is much larger than the number of distinct strings; use it on small
        languages. Invalid samples are excluded (KL(q || p) is infinite if any exist).
    ``kl_mc``: with ``sample_log_q`` (the sampler's own exact log-probability of each sample, as
        an AR model gives), mean(log q - log p) over the samples: an unbiased Monte-Carlo
        estimate of KL(q || p) with its standard error (infinite if any sample is invalid).
    """
    n = len(samples)
    if n == 0:
        raise ValueError("samples is empty: give at least one sample string")
    log_p = language.log_probs(samples)
    valid = np.isfinite(log_p)
    entropy = entropy or true_entropy(language)
    out: dict[str, Any] = {
        "n_samples": n,
        "valid_fraction": float(valid.mean()),
        "mean_length": float(np.mean([len(s) for s in samples])),
        "entropy_nats_per_string": entropy["nats_per_string"],
        "entropy_nats_per_token": entropy["nats_per_token"],
    }
    if valid.any():
        good = [s for s, ok in zip(samples, valid) if ok]
        nll = -log_p[valid]
        tokens = np.array([len(s) + 1 for s in good], dtype=np.float64)
        counts = Counter(good)
        q_hat = np.array(list(counts.values()), dtype=np.float64) / len(good)
        p_of = dict(zip(good, log_p[valid]))
        log_p_distinct = np.array([p_of[s] for s in counts])
        out.update(
            {
                "true_nll_nats_per_string": float(nll.mean()),
                "true_nll_nats_per_token": float(nll.sum() / tokens.sum()),
                "true_nll_nats_per_token_stderr": ratio_stderr(nll, tokens),
                "distinct_valid": len(counts),
                "kl_plugin": float((q_hat * (np.log(q_hat) - log_p_distinct)).sum()),
                "kl_plugin_note": "plug-in KL(q_hat||p) over valid samples; biased upward",
            }
        )
    if sample_log_q is not None:
        log_q = np.asarray(sample_log_q, dtype=np.float64)
        if log_q.shape != (n,):
            raise ValueError(f"sample_log_q has shape {log_q.shape}; expected ({n},)")
        if valid.all():
            diff = log_q - log_p
            out["kl_mc"] = float(diff.mean())
            out["kl_mc_stderr"] = float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
        else:
            out["kl_mc"] = math.inf
            out["kl_mc_stderr"] = math.nan
        out["kl_mc_note"] = "mean(log q - log p) over the model's own samples: KL(q||p)"
    return out


@torch.no_grad()
def ar_sample(
    model: nn.Module,
    tokenizer: Tokenizer,
    n: int,
    max_tokens: int,
    *,
    seed: int = 0,
    batch_size: int = 256,
) -> tuple[list[str], list[float]]:
    """Exact ancestral samples from an AR model (temperature 1, no truncation), started from
    BOS and stopped at EOS, with each sample's exact log q (including its EOS; -inf when it hit
    ``max_tokens`` without one, i.e. it is not a complete document)."""
    generator = torch.Generator().manual_seed(seed)
    device = next(iter(model.parameters()), torch.empty(0)).device
    texts: list[str] = []
    log_qs: list[float] = []
    vocab = tokenizer.vocab_size
    for start in range(0, n, batch_size):
        size = min(batch_size, n - start)
        tokens = torch.full((size, 1), tokenizer.eos_id, dtype=torch.long)
        log_q = torch.zeros(size, dtype=torch.float64)
        done = torch.zeros(size, dtype=torch.bool)
        for _ in range(max_tokens):
            logits = model(tokens.to(device), attention="causal")[:, -1, :vocab].double().cpu()
            log_probs = torch.log_softmax(logits, -1)
            nxt = torch.multinomial(log_probs.exp(), 1, generator=generator)[:, 0]
            nxt = torch.where(done, torch.full_like(nxt, tokenizer.pad_id), nxt)
            log_q += torch.where(done, 0.0, log_probs.gather(1, nxt[:, None])[:, 0])
            tokens = torch.cat([tokens, nxt[:, None]], 1)
            done |= nxt == tokenizer.eos_id
            if done.all():
                break
        for row, finished, lq in zip(tokens[:, 1:].tolist(), done.tolist(), log_q.tolist()):
            body = row[: row.index(tokenizer.eos_id)] if finished else row
            texts.append(tokenizer.decode([t for t in body if t < tokenizer.eos_id]))
            log_qs.append(lq if finished else -math.inf)
    return texts, log_qs


def mdm_sample(
    model: nn.Module,
    tokenizer: Tokenizer,
    n: int,
    gen_length: int,
    *,
    seed: int = 0,
    config: Any = None,
    batch_size: int = 256,
) -> list[str]:
    """Unconditional MDM samples: ``[BOS] + [MASK] * gen_length``, cut at the first EOS. The
    default sampler reveals one random position per step (exact sampling of the model's joint
    in a random order)."""
    config = config or SamplerConfig(FixedCount(steps=gen_length, remasking="random"))
    generator = DiffusionGenerator(model, tokenizer)
    texts: list[str] = []
    for start in range(0, n, batch_size):
        size = min(batch_size, n - start)
        result = generator.generate([[]] * size, gen_length, config, seed=seed + start)
        texts += [
            tokenizer.decode([t for t in row if t < tokenizer.eos_id]) for row in result.tokens
        ]
    return texts


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


# ---- report ------------------------------------------------------------------------------------


def _load(checkpoint: str | Path) -> tuple[nn.Module, Tokenizer, dict, Any]:
    from shared.checkpoint import load_model_from_checkpoint
    from shared.objective import objective_for_run

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
    prefixes = completion_prefixes(heldout, infill_tasks_max)
    completion = isinstance(language, PCFGLanguage) and bool(prefixes)
    tasks: list[InfillTask] = []
    if isinstance(language, HMMLanguage) and infill_span > 0:
        tasks = infill_tasks(language, heldout, infill_span, limit=infill_tasks_max)
        report["infill_oracle"] = score_infills(tasks, oracle_infills(tasks), language)
    for label, checkpoint in (("ar", ar_checkpoint), ("mdm", mdm_checkpoint)):
        if checkpoint is None:
            continue
        model, tokenizer, state, objective = _load(checkpoint)
        if objective.name != label:
            raise ValueError(
                f"{label}_checkpoint={str(checkpoint)!r} was trained with objective "
                f"{objective.name!r}; expected {label!r}"
            )
        seq_len = int(state["train_config"]["seq_len"])
        rows = language_rows(heldout, tokenizer, seq_len, language)
        estimate = model_estimate(
            model,
            objective,
            rows,
            tokenizer,
            nelbo_samples=nelbo_samples,
            batch_size=batch_size,
            seed=seed,
        )
        section: dict[str, Any] = {
            "checkpoint": str(checkpoint),
            "protocol": state["train_config"].get("protocol"),
            "likelihood": likelihood_gap(estimate, language, heldout, entropy),
        }
        if label == "ar":
            texts, log_q = ar_sample(model, tokenizer, n_samples, seq_len - 1, seed=seed)
            section["samples"] = sample_metrics(
                language, texts, sample_log_q=log_q, entropy=entropy
            )
            if tasks:
                fills = ar_prefix_infills(model, tokenizer, language, tasks)
                section["infill_prefix_only"] = score_infills(tasks, fills, language)
        else:
            texts = mdm_sample(model, tokenizer, n_samples, seq_len - 1, seed=seed)
            section["samples"] = sample_metrics(language, texts, entropy=entropy)
            if tasks:
                fills = mdm_infills(model, tokenizer, language, tasks, seq_len)
                section["infill"] = score_infills(tasks, fills, language)
        if isinstance(language, FactsLanguage):
            section["reversal"] = reversal_probe(model, tokenizer, language, label, seq_len)
        if completion:
            if label == "ar":
                completions = ar_complete(model, tokenizer, prefixes, seq_len, seed=seed)
            else:
                completions = mdm_complete(model, tokenizer, prefixes, seq_len, seed=seed)
            section["completion"] = completion_metrics(language, prefixes, completions)
        section["sample_examples"] = texts[:5]
        report[label] = section
    return report
