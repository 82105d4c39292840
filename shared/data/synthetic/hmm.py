"""A random hidden Markov model with exact string probabilities (forward algorithm), exact
entropy while the support is small enough, and exact posterior marginals of a masked span."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shared.data.synthetic.base import (
    LETTERS,
    MC_ENTROPY_SAMPLES,
    EntropyValue,
    Language,
    _check_int,
    derive_seed,
    entropy_of,
)


def _draw_rows(cum: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Categorical draws: row i of the cumulative table ``cum`` [n, k] at uniform u[i]."""
    return np.minimum((cum < u[:, None]).sum(1), cum.shape[1] - 1)


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


class HMMLanguage(Language):
    """Random HMM: z1 ~ start; emit x_t ~ emit[z_t]; then stop with probability stop[z_t] (always
    at t = max_len), else z_{t+1} ~ trans[z_t]. At least one symbol is always emitted.

    Rows of ``trans`` and ``emit`` are Dirichlet(``concentration``) draws (small = peaked, more
    structure); ``stop`` is uniform in [stop_min, stop_max]. ``stop_max=0`` gives fixed length.
    """

    def __init__(
        self,
        *,
        states: int = 4,
        vocab: int = 4,
        max_len: int = 10,
        stop_min: float = 0.05,
        stop_max: float = 0.2,
        concentration: float = 0.5,
        seed: int = 0,
    ) -> None:
        _check_int("states", states, 1, 64)
        _check_int("vocab", vocab, 1, len(LETTERS))
        _check_int("max_len", max_len, 1, 4096)
        if not 0.0 <= stop_min <= stop_max <= 1.0:
            raise ValueError(
                f"stop_min={stop_min} and stop_max={stop_max} must satisfy 0 <= min <= max <= 1"
            )
        if not concentration > 0:
            raise ValueError(f"concentration={concentration} must be > 0")
        rng = np.random.default_rng(derive_seed(seed, 0))
        self.start = rng.dirichlet(np.ones(states))
        self.trans = rng.dirichlet(np.full(states, concentration), size=states)
        self.emit = rng.dirichlet(np.full(vocab, concentration), size=states)
        self.stop = rng.uniform(stop_min, stop_max, size=states)
        self.alphabet = LETTERS[:vocab]
        self.max_len = max_len
        self.name = f"hmm(states={states}, vocab={vocab}, max_len={max_len}, seed={seed})"

    @classmethod
    def from_arrays(
        cls,
        start: np.ndarray,
        trans: np.ndarray,
        emit: np.ndarray,
        stop: np.ndarray,
        max_len: int,
    ) -> HMMLanguage:
        """An HMM with given parameters (for tests and hand-built examples)."""
        lang = cls(states=len(start), vocab=emit.shape[1], max_len=max_len)
        lang.start, lang.trans, lang.emit = (
            np.asarray(a, np.float64) for a in (start, trans, emit)
        )
        lang.stop = np.asarray(stop, np.float64)
        lang.name = f"hmm(custom, max_len={max_len})"
        return lang

    def stop_at(self, t: int) -> np.ndarray:
        """Stop probability per state after emitting symbol t (1-based): forced at max_len."""
        return self.stop if t < self.max_len else np.ones_like(self.stop)

    def forward(self, indices: Sequence[int]) -> np.ndarray:
        """Unnormalised alpha after the prefix: P(x_1..t, z_t = k, not stopped before t)."""
        alpha = self.start.copy()
        for t, x in enumerate(indices, start=1):
            if t > 1:
                alpha = (alpha * (1 - self.stop_at(t - 1))) @ self.trans
            alpha = alpha * self.emit[:, x]
        return alpha

    def next_log_probs(self, prefix: str) -> np.ndarray:
        if len(prefix) > self.max_len:
            raise ValueError(f"prefix of length {len(prefix)} exceeds max_len={self.max_len}")
        indices = [self.symbol_index(c) for c in prefix]
        if not indices:
            probs = np.append(self.start @ self.emit, 0.0)
        else:
            alpha = self.forward(indices)
            mass = alpha.sum()
            if mass <= 0:
                raise ValueError(f"prefix {prefix!r} has probability zero")
            t = len(indices)
            go_on = (alpha * (1 - self.stop_at(t))) @ self.trans
            probs = np.append(go_on @ self.emit, alpha @ self.stop_at(t)) / mass
        with np.errstate(divide="ignore"):
            return np.log(probs)

    def log_prob(self, string: str) -> float:
        if self._outside_support(string):
            return -math.inf
        # scaled forward pass: O(len * states^2), no re-running of prefixes
        indices = [self.alphabet.index(c) for c in string]
        alpha = self.start * self.emit[:, indices[0]]
        logp = 0.0
        for t in range(2, len(indices) + 1):
            mass = alpha.sum()
            if mass <= 0:
                return -math.inf
            logp += math.log(mass)
            alpha = ((alpha / mass) * (1 - self.stop_at(t - 1))) @ self.trans
            alpha = alpha * self.emit[:, indices[t - 1]]
        return logp + _log(float(alpha @ self.stop_at(len(indices))))

    def sample(self, n: int, seed: int) -> list[str]:
        _check_int("n", n, 0, 10**9)
        rng = np.random.default_rng(seed)
        cum_start, cum_trans, cum_emit = (
            np.cumsum(a, -1) for a in (self.start, self.trans, self.emit)
        )
        z = _draw_rows(np.broadcast_to(cum_start, (n, len(self.start))), rng.random(n))
        symbols = np.zeros((n, self.max_len), dtype=np.int64)
        lengths = np.zeros(n, dtype=np.int64)
        alive = np.ones(n, dtype=bool)
        for t in range(1, self.max_len + 1):
            x = _draw_rows(cum_emit[z], rng.random(n))
            symbols[alive, t - 1] = x[alive]
            lengths[alive] = t
            stopped = rng.random(n) < self.stop_at(t)[z]
            alive &= ~stopped
            if not alive.any():
                break
            z = _draw_rows(cum_trans[z], rng.random(n))
        letters = np.array(list(self.alphabet))
        return ["".join(letters[row[:length]]) for row, length in zip(symbols, lengths)]

    def expected_length(self) -> float:
        # P(length >= t) is the mass still running when symbol t is emitted
        running = self.start.copy()
        total = 0.0
        for t in range(1, self.max_len + 1):
            total += running.sum()
            running = (running * (1 - self.stop_at(t))) @ self.trans
        return float(total)

    def entropy(self, mc_samples: int = MC_ENTROPY_SAMPLES, seed: int = 0) -> EntropyValue:
        """Exact by a vectorised forward pass over every string (all prefixes of each length at
        once) while that fits in memory; else a labelled Monte-Carlo estimate. (The entropy of an
        HMM's output distribution has no closed form: the state is hidden.)"""
        v, k = len(self.alphabet), len(self.start)
        if v**self.max_len * k > 1 << 23:
            return self.mc_entropy(mc_samples, seed)
        alpha = self.start[None, :] * self.emit.T  # [v, k]: every prefix of length 1
        total, count = 0.0, 0
        for t in range(1, self.max_len + 1):
            total += entropy_of(alpha @ self.stop_at(t))
            count += alpha.shape[0]
            if t == self.max_len:
                break
            go_on = (alpha * (1 - self.stop_at(t))) @ self.trans  # [v^t, k]
            alpha = (go_on[:, None, :] * self.emit.T[None, :, :]).reshape(-1, k)
        return EntropyValue(
            total, 0.0, f"exact: forward pass over all {count} strings", self.expected_length()
        )

    def span_posteriors(self, string: str, start: int, stop: int) -> np.ndarray:
        """float64 [stop - start, vocab]: the exact posterior marginal of each symbol in
        ``string[start:stop]`` given every other symbol and the string's length (the end of the
        string is observed too), by forward-backward with the span's emissions summed out."""
        n = len(string)
        if not 0 <= start < stop <= n or n > self.max_len:
            raise ValueError(
                f"span [{start}, {stop}) must lie inside the string of length {n} "
                f"(and the string within max_len={self.max_len})"
            )
        k = len(self.start)
        evidence = np.ones((n, k))
        for t, c in enumerate(string):
            if not start <= t < stop:
                evidence[t] = self.emit[:, self.symbol_index(c)]
        alphas = np.zeros((n, k))  # before the emission at t (prior predictive of z_t)
        alpha = self.start.copy()
        for t in range(n):
            alphas[t] = alpha
            alpha = alpha * evidence[t]
            alpha = alpha / max(alpha.sum(), 1e-300)
            alpha = (alpha * (1 - self.stop_at(t + 1))) @ self.trans
        betas = np.zeros((n, k))  # P(rest of the evidence and the end | z_t), emissions t+1..
        beta = self.stop_at(n).copy()
        for t in range(n - 1, -1, -1):
            betas[t] = beta
            beta = (1 - self.stop_at(t)) * (self.trans @ (evidence[t] * beta)) if t > 0 else beta
            beta = beta / max(beta.sum(), 1e-300)
        post = np.stack([(alphas[t] * betas[t]) @ self.emit for t in range(start, stop)])
        return post / post.sum(1, keepdims=True)
