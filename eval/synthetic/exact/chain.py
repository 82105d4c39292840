"""A training row of the hidden Markov language as one token-level hidden Markov chain, and the
forward-backward pass that gives every exact conditional the exact denoisers hand out.

A row is ``[BOS] + string + [EOS] + ...`` (``shared.data.rows``). Its positions 1, 2, ... are
emitted by a chain whose states are (HMM state k, symbol index t within the document) for
t = 1..max_len, one EOS state and, in the ``padded`` layout, one absorbing PAD state:

- (k, t) emits symbol v with probability emit[k, v]; it moves to (k', t + 1) with
  (1 - stop_t[k]) trans[k, k'] and to EOS with stop_t[k] (stop_max_len = 1: the length cap);
- ``padded`` (the padded protocol the masked, block and AR models train on): EOS -> PAD -> PAD;
- ``stream`` (packed rows, which the uniform family trains on, without padding in its support):
  EOS starts a fresh document, EOS -> (k, 1) with start[k]; the row starts at a document
  boundary, which is where a generated sample (cut at its first EOS) starts.

The symbol index is part of the state because the stop probability depends on it (forced at
max_len), which keeps the chain homogeneous and lets a document start anywhere in a row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.data.synthetic.hmm import HMMLanguage

LAYOUTS = ("padded", "stream")


@dataclass(frozen=True)
class RowChain:
    """``start`` [S], ``trans`` [S, S], ``emit`` [S, R] over the R row symbols: the language's
    alphabet in order, then EOS, then (``padded`` only) PAD."""

    start: np.ndarray
    trans: np.ndarray
    emit: np.ndarray
    layout: str

    @property
    def n_symbols(self) -> int:
        return self.emit.shape[1]


def row_chain(language: HMMLanguage, layout: str) -> RowChain:
    """The token-level chain of ``language``'s rows under ``layout`` (see the module docstring)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is unknown; valid layouts: {LAYOUTS}")
    k, m, v = len(language.start), language.max_len, len(language.alphabet)
    eos = k * m
    padded = layout == "padded"
    n_states = eos + (2 if padded else 1)
    n_symbols = v + (2 if padded else 1)
    start = np.zeros(n_states)
    start[:k] = language.start
    trans = np.zeros((n_states, n_states))
    emit = np.zeros((n_states, n_symbols))
    for t in range(1, m + 1):
        rows = slice((t - 1) * k, t * k)
        stop = language.stop_at(t)
        emit[rows, :v] = language.emit
        trans[rows, eos] = stop
        if t < m:
            trans[rows, t * k : (t + 1) * k] = (1 - stop)[:, None] * language.trans
    emit[eos, v] = 1.0
    if padded:
        trans[eos, eos + 1] = trans[eos + 1, eos + 1] = 1.0
        emit[eos + 1, v + 1] = 1.0
    else:
        trans[eos, :k] = language.start
    return RowChain(start, trans, emit, layout)


def packed_start(chain: RowChain) -> RowChain:
    """The ``stream`` chain with the start law of a packed row cut at a fixed offset of a long
    stream of documents: the chain's stationary law (the row's BOS stands before whatever
    position of a document the cut falls on). Documents of several lengths make the chain
    aperiodic, so the law of a row's start converges to it as rows go on."""
    if chain.layout != "stream":
        raise ValueError(f"layout={chain.layout!r}: a packed row's start needs the stream layout")
    values, vectors = np.linalg.eig(chain.trans.T)
    stationary = np.real(vectors[:, np.argmin(np.abs(values - 1.0))])
    stationary = np.clip(stationary / stationary.sum(), 0.0, None)
    return RowChain(stationary / stationary.sum(), chain.trans, chain.emit, chain.layout)


def _normalised(vector: np.ndarray) -> tuple[np.ndarray, bool]:
    total = vector.sum()
    return (vector / total, True) if total > 0 else (vector, False)


def state_messages(chain: RowChain, likelihood: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Forward and backward messages [n, S] of a row with per-position symbol likelihoods
    ``likelihood`` [n, R]: forward[i] ~ P(state_i, evidence before i), backward[i] ~
    P(evidence after i | state_i), each scaled to sum 1. The flag is False when the evidence has
    probability zero (then the messages mean nothing)."""
    evidence = likelihood @ chain.emit.T  # [n, S]: P(what position i shows | its state)
    n = len(likelihood)
    forward = np.zeros((n, len(chain.start)))
    backward = np.ones_like(forward)
    message, possible = chain.start.copy(), True
    for i in range(n):
        forward[i] = message
        message, ok = _normalised(message * evidence[i])
        possible &= ok
        message = message @ chain.trans
    message = np.ones(len(chain.start))
    for i in range(n - 1, 0, -1):
        backward[i] = message
        message, ok = _normalised(chain.trans @ (evidence[i] * message))
        possible &= ok
    backward[0] = message
    return forward, backward, possible


def symbol_posteriors(chain: RowChain, likelihood: np.ndarray) -> np.ndarray | None:
    """P(symbol at position i | every position's evidence, its own included) [n, R], or None
    when the evidence is impossible. An unobserved (masked) position has likelihood 1 for every
    symbol, so it contributes no emission; positions after the row's end are summed out."""
    forward, backward, possible = state_messages(chain, likelihood)
    if not possible:
        return None
    joint = ((forward * backward) @ chain.emit) * likelihood
    totals = joint.sum(1, keepdims=True)
    if (totals <= 0).any():
        return None
    return joint / totals


def next_symbol_probs(chain: RowChain, observed: np.ndarray) -> np.ndarray | None:
    """P(symbol at position i + 1 | the symbols at positions 1..i) [n + 1, R] for a row prefix
    ``observed`` [n] of symbol indices (row 0 is the first symbol's distribution), or None when
    the prefix has probability zero."""
    probs = np.zeros((len(observed) + 1, chain.n_symbols))
    message = chain.start.copy()
    for i in range(len(observed) + 1):
        probs[i] = message @ chain.emit
        if i == len(observed):
            break
        message, ok = _normalised(message * chain.emit[:, observed[i]])
        if not ok:
            return None
        message = message @ chain.trans
    return probs
