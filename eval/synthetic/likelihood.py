"""Likelihood on synthetic languages against the exact truth.

A model's NLL (AR) or NELBO (MDM) on held-out strings is scored on rows built like the padded
training rows (``[EOS] + string + [EOS] + PAD``) so EOS counts as a token on both sides. Two
gaps are reported, both in nats per token:
``gap_to_true_nll`` = model - exact true NLL *of the same strings*: a paired estimate of
    KL(data || model) per token (plus the ELBO's looseness for an MDM), with little noise.
``gap_to_entropy`` = model - entropy rate of the language (E[-log p] / E[tokens]).

``TrueConditionalModel`` and ``UniformModel`` are reference "models" with known scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from eval.likelihood import Estimate, ar_nll, mdm_nelbo
from shared.data.rows import pad_rows
from shared.data.synthetic.base import Language
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


def model_device(model: nn.Module) -> torch.device:
    """Where the model's weights live (the CPU for a stand-in without parameters)."""
    return next(iter(model.parameters()), torch.empty(0)).device


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
