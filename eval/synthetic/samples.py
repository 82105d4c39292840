"""Samples judged by the true distribution of a synthetic language: their exact log-probability
(a perfect judge), the fraction that is valid, and KL(sample distribution || data) estimates (see
``sample_metrics``); and the exact samplers that draw them from an AR or an MDM model."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount
from eval.synthetic.likelihood import model_device, ratio_stderr, true_entropy
from shared.data.synthetic.base import Language
from shared.tokenizer import Tokenizer


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
    ``tv_plugin``: TV(q_hat, p) over all samples (invalid ones count whole), biased upward by at
        most ``tv_plugin_bias_bound`` in expectation (``plugin_tv``).
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
    out.update(plugin_tv(samples, log_p))
    if valid.any():
        out.update(valid_sample_metrics(samples, log_p))
    if sample_log_q is not None:
        out.update(monte_carlo_kl(sample_log_q, log_p))
    return out


def valid_sample_metrics(samples: Sequence[str], log_p: np.ndarray) -> dict[str, Any]:
    """The true NLL of the valid samples (finite ``log_p``) per string and per token (EOS
    counted), and the plug-in KL(q_hat || p) of their empirical distribution q_hat."""
    valid = np.isfinite(log_p)
    good = [s for s, ok in zip(samples, valid) if ok]
    nll = -log_p[valid]
    tokens = np.array([len(s) + 1 for s in good], dtype=np.float64)
    counts = Counter(good)
    q_hat = np.array(list(counts.values()), dtype=np.float64) / len(good)
    p_of = dict(zip(good, log_p[valid]))
    log_p_distinct = np.array([p_of[s] for s in counts])
    return {
        "true_nll_nats_per_string": float(nll.mean()),
        "true_nll_nats_per_token": float(nll.sum() / tokens.sum()),
        "true_nll_nats_per_token_stderr": ratio_stderr(nll, tokens),
        "distinct_valid": len(counts),
        "kl_plugin": float((q_hat * (np.log(q_hat) - log_p_distinct)).sum()),
        "kl_plugin_note": "plug-in KL(q_hat||p) over valid samples; biased upward",
    }


def plugin_tv(samples: Sequence[str], log_p: np.ndarray) -> dict[str, float]:
    """The total variation between the samples' empirical distribution q_hat and p: half of
    sum |q_hat - p| over the strings sampled, plus p's mass on the strings never sampled, with an
    invalid sample's share counted whole (p gives it nothing). Biased upward: by Jensen
    TV <= E[tv_plugin] <= TV + sum_x sqrt(q(x) (1 - q(x)) / n) / 2, the bound estimated with q_hat
    in ``tv_plugin_bias_bound`` (checked against the exact TV of a small language:
    tests/test_exact_sampler_kl.py)."""
    n = len(samples)
    counts = Counter(samples)
    p_of = dict(zip(samples, np.exp(log_p)))
    q_hat = np.array([c / n for c in counts.values()])
    p_seen = np.array([p_of[s] for s in counts])
    tv = 0.5 * (np.abs(q_hat - p_seen).sum() + max(0.0, 1.0 - p_seen.sum()))
    bound = 0.5 * np.sqrt(q_hat * (1 - q_hat) / n).sum()
    return {"tv_plugin": float(tv), "tv_plugin_bias_bound": float(bound)}


def monte_carlo_kl(sample_log_q: Sequence[float], log_p: np.ndarray) -> dict[str, Any]:
    """mean(log q - log p) over the sampler's own samples, an unbiased estimate of KL(q || p),
    with its standard error; infinite when any sample is invalid (p = 0 where q > 0)."""
    n = len(log_p)
    log_q = np.asarray(sample_log_q, dtype=np.float64)
    if log_q.shape != (n,):
        raise ValueError(f"sample_log_q has shape {log_q.shape}; expected ({n},)")
    if np.isfinite(log_p).all():
        diff = log_q - log_p
        kl = {
            "kl_mc": float(diff.mean()),
            "kl_mc_stderr": float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan,
        }
    else:
        kl = {"kl_mc": math.inf, "kl_mc_stderr": math.nan}
    return kl | {"kl_mc_note": "mean(log q - log p) over the model's own samples: KL(q||p)"}


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
    device = model_device(model)
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
            texts.append(sample_text(body, tokenizer))
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
        texts += [sample_text(row, tokenizer) for row in result.tokens]  # cut before EOS
    return texts


# A character in no synthetic alphabet: a sample that holds a token other than a symbol (PAD,
# MASK, BOS) before its EOS is no string of the language, and must score p = 0 rather than be
# read as the symbols around it.
NOT_A_SYMBOL = "\ufffd"


def sample_text(body: Sequence[int], tokenizer: Tokenizer) -> str:
    """The string a sample's tokens before its EOS spell (symbols are the ids below EOS), with
    ``NOT_A_SYMBOL`` appended when any other id is among them, so the language scores it
    invalid."""
    text = tokenizer.decode([t for t in body if t < tokenizer.eos_id])
    return text + NOT_A_SYMBOL if any(t >= tokenizer.eos_id for t in body) else text
