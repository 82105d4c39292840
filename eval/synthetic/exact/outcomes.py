"""What a sample is, the language's exact distribution over samples, the divergences between
two such distributions, and the refusals of the exact computation.

A sample is the generated tokens before the first EOS (``dllm.canvas.apply_eos_policy`` "stop",
and AR decoding stopped at EOS); it is a string of the language's alphabet when every one of them
is a symbol token, and ``INVALID`` otherwise (a PAD or any other id before the EOS), which the
language gives probability 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from shared.data.synthetic.base import Language
from shared.data.synthetic.hmm import HMMLanguage
from shared.errors import ConfigError

INVALID = None  # the outcome of a sample that is not a string of the alphabet
# the most partial rows (or whole rows) an exact sampler distribution may track
STATE_LIMIT = 200_000


def outcome(generated: Sequence[int], symbols: Mapping[int, str], eos_id: int) -> str | None:
    """The sample a generation region holds: its symbols before the first EOS, or INVALID."""
    tokens = list(generated)
    if eos_id in tokens:
        tokens = tokens[: tokens.index(eos_id)]
    if not all(token in symbols for token in tokens):
        return INVALID
    return "".join(symbols[token] for token in tokens)


def check_exact_language(language: Language) -> HMMLanguage:
    """Refuse a language without an exact denoiser (only the HMM has forward-backward)."""
    if not isinstance(language, HMMLanguage):
        raise ConfigError(
            f"{language.name} has no exact denoiser: exact sampler distributions need "
            "forward-backward, which only the hmm language has (pcfg, teacher, facts and "
            "pathstar have none); use a sample-based estimate (eval.synthetic.samples)"
        )
    return language


def check_state_count(what: str, count: int, language: Language) -> None:
    """Refuse a computation that would track more than STATE_LIMIT rows."""
    if count > STATE_LIMIT:
        raise ConfigError(
            f"{language.name} is too large to enumerate exactly: the {what} has up to {count} "
            f"rows to track, more than the limit of {STATE_LIMIT}; use a smaller language "
            "(vocab, max_len) or a sample-based estimate (eval.synthetic.samples.sample_metrics)"
        )


def language_distribution(language: Language) -> dict[str | None, float]:
    """P(string) of every string of positive probability (by enumeration)."""
    check_state_count("language", language.support_size_bound(), language)
    return {string: math.exp(log_p) for string, log_p in language.enumerate()}


def divergences(q: Mapping[str | None, float], p: Mapping[str | None, float]) -> dict[str, float]:
    """KL(q||p), KL(p||q) in nats and the total variation between two distributions over
    samples (infinite KL where one puts mass where the other has none)."""
    keys = set(q) | set(p)
    kl_qp = kl_pq = tv = 0.0
    for key in keys:
        qx, px = q.get(key, 0.0), p.get(key, 0.0)
        tv += abs(qx - px) / 2
        if qx > 0:
            kl_qp += qx * (math.log(qx / px) if px > 0 else math.inf)
        if px > 0:
            kl_pq += px * (math.log(px / qx) if qx > 0 else math.inf)
    return {"kl_qp": kl_qp, "kl_pq": kl_pq, "tv": tv}
