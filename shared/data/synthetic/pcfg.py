"""Typed balanced brackets from a capped branching process: an unambiguous grammar, so string
probabilities and the entropy are exact."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence

import numpy as np

from shared.data.synthetic.base import (
    MC_ENTROPY_SAMPLES,
    EntropyValue,
    Language,
    _check_int,
    derive_seed,
    entropy_of,
)

OPENERS = "([{<"
CLOSERS = ")]}>"


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
