"""A table of random one-to-one facts ``a_i b_i``, seen in one direction only: the ground truth
of the reversal probe."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from shared.data.synthetic.base import (
    LETTERS,
    MC_ENTROPY_SAMPLES,
    EntropyValue,
    Language,
    _check_int,
    derive_seed,
)

UPPER = LETTERS.upper()


class FactsLanguage(Language):
    """``pairs`` random one-to-one facts (a_i, b_i): every string is exactly the two symbols
    ``a_i b_i`` (the forward direction only), uniform over the facts.

    The a's are the first ``pairs`` lowercase letters, the b's ``pairs`` distinct uppercase letters
    drawn and matched at random from ``seed`` (so no byte offset relates a fact's two symbols).
    A model trained on it has only ever seen each b in second position: asking for a_i given b_i
    is the reversal probe of ``eval.synthetic_probes.reversal_probe``.
    """

    def __init__(self, *, pairs: int = 16, seed: int = 0) -> None:
        _check_int("pairs", pairs, 1, len(LETTERS))
        rng = np.random.default_rng(derive_seed(seed, 0))
        self.firsts = LETTERS[:pairs]
        self.seconds = "".join(UPPER[i] for i in rng.permutation(len(UPPER))[:pairs])
        self.pairs = pairs
        self.forward_map = dict(zip(self.firsts, self.seconds))
        self.reverse_map = dict(zip(self.seconds, self.firsts))
        self.alphabet = self.firsts + "".join(sorted(self.seconds))
        self.max_len = 2
        self.name = f"facts(pairs={pairs}, seed={seed})"

    @property
    def facts(self) -> list[tuple[str, str]]:
        return list(zip(self.firsts, self.seconds))

    def next_log_probs(self, prefix: str) -> np.ndarray:
        out = np.full(len(self.alphabet) + 1, -math.inf)
        if prefix == "":
            out[: self.pairs] = -math.log(self.pairs)  # the a's come first in the alphabet
        elif len(prefix) == 1 and prefix in self.forward_map:
            out[self.alphabet.index(self.forward_map[prefix])] = 0.0
        elif len(prefix) == 2 and self.forward_map.get(prefix[0]) == prefix[1]:
            out[-1] = 0.0
        else:
            raise ValueError(f"prefix {prefix!r} has probability zero under {self.name}")
        return out

    def log_prob(self, string: str) -> float:
        if len(string) == 2 and self.forward_map.get(string[0]) == string[1]:
            return -math.log(self.pairs)
        return -math.inf

    def sample(self, n: int, seed: int) -> list[str]:
        _check_int("n", n, 0, 10**9)
        picks = np.random.default_rng(seed).integers(0, self.pairs, size=n)
        return [self.firsts[i] + self.seconds[i] for i in picks.tolist()]

    def expected_length(self) -> float:
        return 2.0

    def support_size_bound(self) -> int:
        return self.pairs

    def enumerate(self) -> Iterator[tuple[str, float]]:
        for a, b in self.facts:
            yield a + b, -math.log(self.pairs)

    def entropy(self, mc_samples: int = MC_ENTROPY_SAMPLES, seed: int = 0) -> EntropyValue:
        return EntropyValue(
            math.log(self.pairs), 0.0, f"exact: uniform over {self.pairs} facts", 2.0
        )
