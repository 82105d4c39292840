"""A table of random one-to-one facts ``a_i b_i``, most seen in one direction only: the ground
truth of the reversal probe."""

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
    """``pairs`` random one-to-one facts (a_i, b_i). Every string is two symbols: ``a_i b_i`` for
    every fact, and also ``b_i a_i`` for the first ``both`` facts (the *paired* facts, which
    teach the reversed order as a format); uniform over those ``pairs + both`` strings.

    The a's are the first ``pairs`` lowercase letters, the b's ``pairs`` distinct uppercase letters
    drawn and matched at random from ``seed`` (so no byte offset relates a fact's two symbols).
    The *held-out* facts (index >= ``both``) are seen forward only: asking for a_i after b_i is
    the reversal probe of ``eval.synthetic.probes.reversal_probe``, a surface order the paired
    facts make familiar and the held-out fact never appeared in.
    """

    def __init__(self, *, pairs: int = 16, both: int = 0, seed: int = 0) -> None:
        _check_int("pairs", pairs, 1, len(LETTERS))
        _check_int("both", both, 0, pairs - 1)
        rng = np.random.default_rng(derive_seed(seed, 0))
        self.firsts = LETTERS[:pairs]
        self.seconds = "".join(UPPER[i] for i in rng.permutation(len(UPPER))[:pairs])
        self.pairs, self.both = pairs, both
        self.forward_map = dict(zip(self.firsts, self.seconds))
        self.reverse_map = dict(zip(self.seconds, self.firsts))
        self.alphabet = self.firsts + "".join(sorted(self.seconds))
        self.max_len = 2
        self.name = (
            f"facts(pairs={pairs}, seed={seed})"
            if not both
            else (f"facts(pairs={pairs}, both={both}, seed={seed})")
        )
        self.strings = [a + b for a, b in self.facts] + [b + a for a, b in self.paired]

    @property
    def paired(self) -> list[tuple[str, str]]:
        """The facts also seen reversed."""
        return self.facts[: self.both]

    @property
    def held_out(self) -> list[tuple[str, str]]:
        """The facts seen forward only: their reversed order never appears in training."""
        return self.facts[self.both :]

    @property
    def facts(self) -> list[tuple[str, str]]:
        return list(zip(self.firsts, self.seconds))

    def next_log_probs(self, prefix: str) -> np.ndarray:
        out = np.full(len(self.alphabet) + 1, -math.inf)
        each = -math.log(len(self.strings))
        if prefix == "":
            for string in self.strings:
                out[self.alphabet.index(string[0])] = each
        elif len(prefix) == 1 and any(s[0] == prefix for s in self.strings):
            (string,) = [s for s in self.strings if s[0] == prefix]
            out[self.alphabet.index(string[1])] = 0.0
        elif prefix in self.strings:
            out[-1] = 0.0
        else:
            raise ValueError(f"prefix {prefix!r} has probability zero under {self.name}")
        return out

    def log_prob(self, string: str) -> float:
        return -math.log(len(self.strings)) if string in self.strings else -math.inf

    def sample(self, n: int, seed: int) -> list[str]:
        _check_int("n", n, 0, 10**9)
        picks = np.random.default_rng(seed).integers(0, len(self.strings), size=n)
        return [self.strings[i] for i in picks.tolist()]

    def expected_length(self) -> float:
        return 2.0

    def support_size_bound(self) -> int:
        return len(self.strings)

    def enumerate(self) -> Iterator[tuple[str, float]]:
        for string in self.strings:
            yield string, -math.log(len(self.strings))

    def entropy(self, mc_samples: int = MC_ENTROPY_SAMPLES, seed: int = 0) -> EntropyValue:
        n = len(self.strings)
        return EntropyValue(math.log(n), 0.0, f"exact: uniform over {n} strings", 2.0)
