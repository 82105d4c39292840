"""The ``Language`` base every synthetic language implements, its ``EntropyValue``, and the
helpers the families share (seed streams, entropy of a distribution, argument checks)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

LETTERS = "abcdefghijklmnopqrstuvwxyz"
# enumerate the whole support for an exact entropy when it has at most this many strings
ENUMERATION_LIMIT = 200_000
MC_ENTROPY_SAMPLES = 20_000


@dataclass(frozen=True)
class EntropyValue:
    """Entropy of the string distribution (nats per string) and the exact expected length.

    ``stderr`` is 0 for exact values; ``method`` says how it was computed. Per-token values count
    the end-of-string token, as the training rows do (one EOS after each document)."""

    nats_per_string: float
    stderr: float
    method: str
    expected_length: float  # symbols per string, excluding EOS

    @property
    def exact(self) -> bool:
        return self.stderr == 0.0

    @property
    def tokens_per_string(self) -> float:
        return self.expected_length + 1.0

    @property
    def nats_per_token(self) -> float:
        # ratio of expectations: what sum(nats) / sum(tokens) converges to over a corpus
        return self.nats_per_string / self.tokens_per_string

    def as_dict(self) -> dict[str, float | str | bool]:
        return {
            "nats_per_string": self.nats_per_string,
            "nats_per_string_stderr": self.stderr,
            "nats_per_token": self.nats_per_token,
            "nats_per_token_stderr": self.stderr / self.tokens_per_string,
            "expected_length": self.expected_length,
            "tokens_per_string": self.tokens_per_string,
            "method": self.method,
            "exact": self.exact,
        }


def entropy_of(probs: np.ndarray) -> float:
    """-sum p log p in nats, with 0 log 0 = 0."""
    p = np.asarray(probs, dtype=np.float64)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def derive_seed(seed: int, tag: int) -> int:
    """An independent 63-bit seed for stream ``tag`` of ``seed``."""
    return int(np.random.SeedSequence([seed, tag]).generate_state(2, np.uint32).view(np.uint64)[0])


class Language(ABC):
    """A distribution over non-empty strings of ``alphabet`` symbols, at most ``max_len`` long.

    ``next_log_probs(prefix)`` is the exact next-symbol conditional (the last entry is the end of
    the string), which defines everything else: the chain-rule ``log_prob`` and the enumeration.
    """

    name: str
    alphabet: str
    max_len: int

    @abstractmethod
    def next_log_probs(self, prefix: str) -> np.ndarray:
        """float64 [len(alphabet) + 1]: log P(next symbol | prefix); the last entry is the end.

        Raises ValueError for a prefix of probability zero."""

    @abstractmethod
    def sample(self, n: int, seed: int) -> list[str]:
        """``n`` i.i.d. strings; a pure function of (the language, n, seed)."""

    @abstractmethod
    def expected_length(self) -> float:
        """Exact expected number of symbols per string."""

    def support_size_bound(self) -> int:
        """An upper bound on the number of strings (decides whether enumeration is feasible)."""
        v = len(self.alphabet)
        return sum(v**length for length in range(1, self.max_len + 1))

    # ---- derived -------------------------------------------------------------------------------

    def symbol_index(self, symbol: str) -> int:
        index = self.alphabet.find(symbol)
        if index < 0 or len(symbol) != 1:
            raise ValueError(f"symbol {symbol!r} is not in the alphabet {self.alphabet!r}")
        return index

    def _outside_support(self, string: str) -> bool:
        return not 1 <= len(string) <= self.max_len or any(c not in self.alphabet for c in string)

    def log_prob(self, string: str) -> float:
        """Exact log P(string) in nats (-inf outside the support), by the chain rule."""
        if self._outside_support(string):
            return -math.inf
        total = 0.0
        for t in range(len(string) + 1):
            logp = self.next_log_probs(string[:t])
            step = logp[-1] if t == len(string) else logp[self.alphabet.index(string[t])]
            if step == -math.inf:
                return -math.inf
            total += float(step)
        return total

    def log_probs(self, strings: Sequence[str]) -> np.ndarray:
        return np.array([self.log_prob(s) for s in strings], dtype=np.float64)

    def is_valid(self, string: str) -> bool:
        """True when the string has positive probability under the language."""
        return self.log_prob(string) > -math.inf

    def enumerate(self) -> Iterator[tuple[str, float]]:
        """Every string of positive probability with its log-probability (depth-first over
        prefixes); only for tiny settings, see ``support_size_bound``."""
        stack: list[tuple[str, float]] = [("", 0.0)]
        while stack:
            prefix, logp = stack.pop()
            nxt = self.next_log_probs(prefix)
            if prefix and nxt[-1] > -math.inf:
                yield prefix, logp + float(nxt[-1])
            if len(prefix) < self.max_len:
                for i, symbol in enumerate(self.alphabet):
                    if nxt[i] > -math.inf:
                        stack.append((prefix + symbol, logp + float(nxt[i])))

    def entropy(self, mc_samples: int = MC_ENTROPY_SAMPLES, seed: int = 0) -> EntropyValue:
        """Exact by enumeration when the support is small, else a labelled Monte-Carlo estimate
        (mean of the exact -log P over ``mc_samples`` fresh strings, with its standard error)."""
        if self.support_size_bound() <= ENUMERATION_LIMIT:
            logps = np.array([lp for _, lp in self.enumerate()])
            value = float(-(np.exp(logps) * logps).sum())
            return EntropyValue(
                value, 0.0, f"exact: enumeration of {len(logps)} strings", self.expected_length()
            )
        return self.mc_entropy(mc_samples, seed)

    def mc_entropy(self, n: int, seed: int) -> EntropyValue:
        nll = -self.log_probs(self.sample(n, derive_seed(seed, 99)))
        return EntropyValue(
            float(nll.mean()),
            float(nll.std(ddof=1) / math.sqrt(n)),
            f"monte carlo: mean exact -log p of {n} samples (stderr is its sampling error)",
            self.expected_length(),
        )


def _check_int(field: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{field}={value!r} must be an integer in [{low}, {high}]")
