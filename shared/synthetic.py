"""Synthetic languages whose string probabilities are known exactly.

On such a language the gap between a model's NLL and the true entropy, and the quality of its
samples, can be measured exactly rather than judged. Four families:

* ``HMMLanguage``: a random hidden Markov model with per-state stop probabilities and a hard
  length cap (the string always ends at ``max_len``), so the support is finite and probabilities
  sum to exactly 1. ``P(string)`` by the forward algorithm.
* ``PCFGLanguage``: nested typed brackets (a branching process with a depth and a children cap).
  The grammar is unambiguous, so ``P(string)`` is the probability of its unique derivation, and
  the entropy follows exactly from a recursion over depths.
* ``FactsLanguage``: ``pairs`` random one-to-one facts ``a_i b_i`` (two symbols, forward
  direction only), uniform: the ground truth of the reversal probe.
* ``TeacherLanguage``: fixed-length strings drawn from a small random causal ``Transformer`` with
  a fixed seed; ``P(string)`` by the chain rule.

Every symbol is one printable ASCII character, so the byte tokenizer gives one token per symbol
and a string is one document. Every string has at least one symbol (empty documents are dropped by
the data pipeline). Dataset specs for ``shared.data.load_corpus``::

    synthetic:hmm
    synthetic:pcfg?max_depth=3&seed=2
    synthetic:teacher?seed=1&n=20000&n_val=1000
    synthetic:facts?pairs=16&seed=0

``n``/``n_val`` are the numbers of train/validation strings (drawn i.i.d. from different seeds),
``seed`` picks the language itself; the other keys are the constructor arguments below.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

PREFIX = "synthetic:"
LETTERS = "abcdefghijklmnopqrstuvwxyz"
OPENERS = "([{<"
CLOSERS = ")]}>"
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


def _draw_rows(cum: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Categorical draws: row i of the cumulative table ``cum`` [n, k] at uniform u[i]."""
    return np.minimum((cum < u[:, None]).sum(1), cum.shape[1] - 1)


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


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


# ---- hidden Markov model ------------------------------------------------------------------------


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


# ---- probabilistic context-free grammar ---------------------------------------------------------


class PCFGLanguage(Language):
    """Typed balanced brackets from a capped branching process.

    The document is the children of a root; every node at depth < ``max_depth`` has n children
    with P(n) = ``children[n]`` (n = 0..len(children) - 1; the root conditions on n >= 1), each
    an opening bracket of a type drawn from ``type_probs``, its own children, and the matching
    closing bracket. Nodes at ``max_depth`` have no children. As a grammar::

        Node_d -> open_i Node_{d+1}^n close_i     with probability type_probs[i] * children[n]

    which is unambiguous, so P(string) is the product over its unique derivation; generating left
    to right, the next-symbol conditional depends only on the stack of open nodes.
    """

    def __init__(
        self,
        *,
        types: int = 3,
        max_depth: int = 4,
        children: Sequence[float] = (0.4, 0.35, 0.25),
        type_probs: Sequence[float] | None = None,
        seed: int = 0,
    ) -> None:
        _check_int("types", types, 1, len(OPENERS))
        _check_int("max_depth", max_depth, 1, 32)
        c = np.asarray(children, dtype=np.float64)
        if (
            c.ndim != 1
            or len(c) < 2
            or (c < 0).any()
            or abs(c.sum() - 1) > 1e-9
            or c[1:].sum() == 0
        ):
            raise ValueError(
                f"children={list(children)} must be probabilities of 0, 1, ... children summing "
                "to 1, with some mass on n >= 1"
            )
        if type_probs is None:
            # a seeded random (not uniform) type distribution, so types carry information
            w = np.random.default_rng(derive_seed(seed, 0)).dirichlet(np.full(types, 2.0))
        else:
            w = np.asarray(type_probs, dtype=np.float64)
            if w.shape != (types,) or (w < 0).any() or abs(w.sum() - 1) > 1e-9:
                raise ValueError(f"type_probs={list(type_probs)} must be {types} probabilities")
        self.children = c
        self.root_children = np.concatenate([[0.0], c[1:] / c[1:].sum()])
        self.type_probs = w
        self.max_depth = max_depth
        self.types = types
        self.alphabet = OPENERS[:types] + CLOSERS[:types]
        max_children = len(c) - 1
        self.max_len = 2 * sum(max_children**d for d in range(1, max_depth + 1))
        self.name = f"pcfg(types={types}, max_depth={max_depth}, children={c.tolist()})"

    def _counts_at(self, depth: int) -> np.ndarray:
        return self.root_children if depth == 0 else self.children

    def parse(self, prefix: str) -> list[tuple[int, int]] | None:
        """The stack [(type, children so far)] of open nodes after ``prefix`` (the root first,
        with type -1), or None when the prefix is impossible."""
        stack = [(-1, 0)]
        max_children = len(self.children) - 1
        for c in prefix:
            kind, count = stack[-1]
            depth = len(stack) - 1
            if c in OPENERS[: self.types]:
                if depth >= self.max_depth or count >= max_children:
                    return None
                stack[-1] = (kind, count + 1)
                stack.append((OPENERS.index(c), 0))
            elif c in CLOSERS[: self.types]:
                if depth == 0 or CLOSERS.index(c) != kind:
                    return None
                stack.pop()
            else:
                return None
        return stack

    def next_log_probs(self, prefix: str) -> np.ndarray:
        stack = self.parse(prefix)
        if stack is None:
            raise ValueError(f"prefix {prefix!r} has probability zero under {self.name}")
        kind, count = stack[-1]
        depth = len(stack) - 1
        probs = np.zeros(2 * self.types + 1)
        if depth >= self.max_depth:
            close = 1.0
        else:
            counts = self._counts_at(depth)
            tail = counts[count:].sum()  # P(n >= count)
            close = counts[count] / tail if count < len(counts) else 1.0
            probs[: self.types] = (1 - close) * self.type_probs
        if depth == 0:
            probs[-1] = close  # closing the root ends the string
        else:
            probs[self.types + kind] = close
        with np.errstate(divide="ignore"):
            return np.log(probs)

    def log_prob(self, string: str) -> float:
        if self._outside_support(string) or self.parse(string) is None:
            return -math.inf
        return super().log_prob(string)

    def is_balanced(self, string: str) -> bool:
        """Structural validity only: brackets of this alphabet, properly nested and matched
        (ignores the depth and children caps, which ``is_valid`` also checks)."""
        stack: list[int] = []
        for c in string:
            if c in OPENERS[: self.types]:
                stack.append(OPENERS.index(c))
            elif c in CLOSERS[: self.types] and stack and stack[-1] == CLOSERS.index(c):
                stack.pop()
            else:
                return False
        return bool(string) and not stack

    def sample(self, n: int, seed: int) -> list[str]:
        _check_int("n", n, 0, 10**9)
        rng = random.Random(seed)
        child_cum = np.cumsum(self.children).tolist()
        root_cum = np.cumsum(self.root_children).tolist()
        type_cum = np.cumsum(self.type_probs).tolist()

        def draw(cum: list[float]) -> int:
            return min(bisect.bisect_right(cum, rng.random()), len(cum) - 1)

        def node(depth: int, out: list[str]) -> None:
            if depth >= self.max_depth:
                return
            for _ in range(draw(root_cum if depth == 0 else child_cum)):
                kind = draw(type_cum)
                out.append(OPENERS[kind])
                node(depth + 1, out)
                out.append(CLOSERS[kind])

        strings = []
        for _ in range(n):
            out: list[str] = []
            node(0, out)
            strings.append("".join(out))
        return strings

    def _mean_children(self, depth: int) -> float:
        counts = self._counts_at(depth)
        return float((np.arange(len(counts)) * counts).sum())

    def expected_length(self) -> float:
        length = 0.0  # expected symbols inside a node at depth d, from the deepest level up
        for depth in range(self.max_depth - 1, -1, -1):
            length = self._mean_children(depth) * (2 + length)
        return length

    def entropy(self, mc_samples: int = MC_ENTROPY_SAMPLES, seed: int = 0) -> EntropyValue:
        """Exact: H(string) = H(derivation) (unambiguous grammar), and the derivation entropy of
        a node at depth d is H(n_d) + E[n_d] * (H(type) + H(node at d + 1))."""
        h_type = entropy_of(self.type_probs)
        h = 0.0
        for depth in range(self.max_depth - 1, -1, -1):
            h = entropy_of(self._counts_at(depth)) + self._mean_children(depth) * (h_type + h)
        return EntropyValue(
            h, 0.0, "exact: recursion over the unique derivation", self.expected_length()
        )

    def support_size_bound(self) -> int:
        # forests at each depth: f_d = sum_n (types * f_{d+1})^n
        f = 1
        for _ in range(self.max_depth):
            f = sum((self.types * f) ** n for n in range(len(self.children)))
        return f


# ---- teacher transformer ------------------------------------------------------------------------


class TeacherLanguage(Language):
    """Strings of exactly ``length`` symbols from a fixed random causal Transformer.

    Weights are N(0, 1/fan_in) (embeddings N(0, 1)) from ``seed``, much larger than training
    init so the teacher's conditionals depend on the context; logits are multiplied by
    ``sharpness`` (higher = lower entropy). Token ids: symbols 0..vocab-1, BOS = vocab.
    """

    def __init__(
        self,
        *,
        vocab: int = 6,
        length: int = 16,
        dim: int = 32,
        layers: int = 2,
        sharpness: float = 1.0,
        seed: int = 0,
    ) -> None:
        from shared.config import ModelConfig
        from shared.model import Transformer

        _check_int("vocab", vocab, 2, len(LETTERS))
        _check_int("length", length, 1, 1024)
        _check_int("dim", dim, 4, 1024)
        _check_int("layers", layers, 1, 16)
        if not sharpness > 0:
            raise ValueError(f"sharpness={sharpness} must be > 0")
        cfg = ModelConfig(
            vocab_size=vocab + 1,
            dim=dim,
            n_layers=layers,
            n_heads=2 if dim % 2 == 0 else 1,
            n_kv_heads=2 if dim % 2 == 0 else 1,
            hidden_dim=2 * dim,
            max_seq_len=length + 1,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, 0))
            model = Transformer(cfg)
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if name.endswith("norm.weight"):
                        continue
                    std = 1.0 if "embeddings" in name else 1.0 / math.sqrt(param.shape[-1])
                    param.normal_(0.0, std)
        self.model = model.double().eval()
        self.vocab = vocab
        self.bos = vocab
        self.sharpness = float(sharpness)
        self.alphabet = LETTERS[:vocab]
        self.max_len = length
        self.name = (
            f"teacher(vocab={vocab}, length={length}, dim={dim}, layers={layers}, seed={seed})"
        )

    def _outside_support(self, string: str) -> bool:
        return len(string) != self.max_len or any(c not in self.alphabet for c in string)

    @torch.no_grad()
    def _log_conditionals(self, ids: torch.Tensor) -> torch.Tensor:
        """[B, T, vocab] log P(symbol at t + 1 | BOS + ids[:, :t]) for prefixes ids [B, T - 1]."""
        tokens = torch.cat([torch.full((len(ids), 1), self.bos, dtype=torch.long), ids], 1)
        logits = self.model(tokens, attention="causal")[..., : self.vocab]
        return torch.log_softmax(self.sharpness * logits, dim=-1)

    def next_log_probs(self, prefix: str) -> np.ndarray:
        if len(prefix) > self.max_len:
            raise ValueError(f"prefix of length {len(prefix)} exceeds length={self.max_len}")
        out = np.full(self.vocab + 1, -math.inf)
        if len(prefix) == self.max_len:
            out[-1] = 0.0
            return out
        ids = torch.tensor([[self.symbol_index(c) for c in prefix]], dtype=torch.long)
        out[:-1] = self._log_conditionals(ids)[0, -1].numpy()
        return out

    def log_probs(self, strings: Sequence[str], batch_size: int = 2048) -> np.ndarray:
        out = np.full(len(strings), -math.inf)
        ok = [i for i, s in enumerate(strings) if not self._outside_support(s)]
        for start in range(0, len(ok), batch_size):
            chunk = ok[start : start + batch_size]
            ids = torch.tensor([[self.alphabet.index(c) for c in strings[i]] for i in chunk])
            logp = self._log_conditionals(ids[:, :-1]).gather(2, ids[..., None])[..., 0]
            out[chunk] = logp.sum(1).numpy()
        return out

    def log_prob(self, string: str) -> float:
        return float(self.log_probs([string])[0])

    @torch.no_grad()
    def sample(self, n: int, seed: int, batch_size: int = 4096) -> list[str]:
        _check_int("n", n, 0, 10**9)
        generator = torch.Generator().manual_seed(seed)
        letters = np.array(list(self.alphabet))
        strings: list[str] = []
        for start in range(0, n, batch_size):
            ids = torch.zeros((min(batch_size, n - start), 0), dtype=torch.long)
            for _ in range(self.max_len):
                probs = self._log_conditionals(ids)[:, -1].exp()
                ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], 1)
            strings += ["".join(letters[row]) for row in ids.numpy()]
        return strings

    def expected_length(self) -> float:
        return float(self.max_len)

    def support_size_bound(self) -> int:
        return self.vocab**self.max_len

    def enumerate(self) -> Iterator[tuple[str, float]]:
        strings = ["".join(t) for t in itertools.product(self.alphabet, repeat=self.max_len)]
        yield from zip(strings, self.log_probs(strings).tolist())


# ---- facts (the reversal probe) -----------------------------------------------------------------

UPPER = LETTERS.upper()


class FactsLanguage(Language):
    """``pairs`` random one-to-one facts (a_i, b_i): every string is exactly the two symbols
    ``a_i b_i`` (the forward direction only), uniform over the facts.

    The a's are the first ``pairs`` lowercase letters, the b's ``pairs`` distinct uppercase letters
    drawn and matched at random from ``seed`` (so no byte offset relates a fact's two symbols).
    A model trained on it has only ever seen each b in second position: asking for a_i given b_i
    is the reversal probe of ``eval.synthetic.reversal_probe``.
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


# ---- specs and corpora --------------------------------------------------------------------------

LANGUAGES: dict[str, type[Language]] = {
    "hmm": HMMLanguage,
    "pcfg": PCFGLanguage,
    "teacher": TeacherLanguage,
    "facts": FactsLanguage,
}
RANDOM_LANGUAGES = ["hmm", "pcfg", "teacher"]
PROBE_LANGUAGES = ["facts"]
CORPUS_KEYS = {"n": 20_000, "n_val": 1_000}
# spec keys per language and how to parse their values (``seed`` is common to all)
_PARAMS: dict[str, dict[str, type]] = {
    "hmm": {
        "states": int,
        "vocab": int,
        "max_len": int,
        "stop_min": float,
        "stop_max": float,
        "concentration": float,
    },
    "pcfg": {"types": int, "max_depth": int, "children": list, "type_probs": list},
    "teacher": {"vocab": int, "length": int, "dim": int, "layers": int, "sharpness": float},
    "facts": {"pairs": int},
}


def is_synthetic(spec: str) -> bool:
    return str(spec).startswith(PREFIX)


def parse_spec(spec: str) -> tuple[str, dict[str, object], dict[str, int]]:
    """``synthetic:<kind>?k=v&...`` -> (kind, language kwargs, corpus settings n/n_val)."""
    if not is_synthetic(spec):
        raise ValueError(f"dataset {spec!r} is not a synthetic spec (must start with {PREFIX!r})")
    body = spec[len(PREFIX) :]
    kind, _, query = body.partition("?")
    if kind not in LANGUAGES:
        raise ValueError(
            f"synthetic language {kind!r} in {spec!r} is unknown; valid: {RANDOM_LANGUAGES} "
            f"and {PROBE_LANGUAGES} (the reversal probe's fact table)"
        )
    kwargs: dict[str, object] = {}
    corpus = dict(CORPUS_KEYS)
    params = {**_PARAMS[kind], "seed": int}
    for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        try:
            if key in CORPUS_KEYS:
                corpus[key] = int(value)
            elif key in params:
                kind_of = params[key]
                kwargs[key] = (
                    [float(v) for v in value.split(",")] if kind_of is list else kind_of(value)
                )
            else:
                valid = sorted([*params, *CORPUS_KEYS])
                raise ValueError(f"unknown key {key!r}; valid keys for {kind}: {valid}")
        except ValueError as exc:
            raise ValueError(f"synthetic spec {spec!r}: {key}={value!r}: {exc}") from exc
    if corpus["n"] < 1 or corpus["n_val"] < 1:
        raise ValueError(
            f"synthetic spec {spec!r}: n={corpus['n']} and n_val={corpus['n_val']} must be >= 1"
        )
    return kind, kwargs, corpus


_CACHE: dict[str, Language] = {}


def build_language(spec: str) -> Language:
    """The language a ``synthetic:...`` spec names (corpus keys n/n_val are ignored). Cached:
    building the teacher or enumerating is not free, and languages are immutable in use."""
    kind, kwargs, _ = parse_spec(spec)
    key = f"{kind}?{sorted(kwargs.items())}"
    if key not in _CACHE:
        _CACHE[key] = LANGUAGES[kind](**kwargs)  # type: ignore[arg-type]
    return _CACHE[key]


def corpus_splits(spec: str) -> tuple[list[str], list[str]]:
    """(train, validation) strings for a spec: independent i.i.d. draws from two seed streams."""
    _, kwargs, corpus = parse_spec(spec)
    language = build_language(spec)
    seed = int(kwargs.get("seed", 0))  # type: ignore[arg-type]
    train = language.sample(corpus["n"], derive_seed(seed, 1))
    validation = language.sample(corpus["n_val"], derive_seed(seed, 2))
    return train, validation


def _check_int(field: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{field}={value!r} must be an integer in [{low}, {high}]")
