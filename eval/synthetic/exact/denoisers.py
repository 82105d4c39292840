"""The exact denoisers: the true conditional each family's network approximates, as "models"
the project's samplers call exactly like the trained network (``forward(tokens, attention,
output_mask, ..., time=...)`` returning logits over the model's vocabulary).

- ``ExactAR``: p(x_i | x_<i) at every position (logits at i predict i + 1), with EOS ending the
  document and PAD after it, as the padded rows hold them.
- ``ExactAbsorbing`` (masked and block diffusion): p(x_i | the unmasked tokens) at every position;
  a [MASK] contributes no emission and positions past the input are summed out, so a block
  model's input (the clean prefix and the block, ``dllm.block.sampler.BlockCausalForward``) gets
  the same conditional given what it sees.
- ``ExactUniform``: p(x0_i | z_t at every other position) where every position after BOS went
  through the uniform-state channel: kept with alpha_t, else a uniform draw from the N support
  ids (every tokenizer id but padding, ``dllm.uniform.objective``), read from the ``time``
  argument. Position i's own noisy token is left out: that is the NELBO's minimiser and what
  the uniform sampler's posterior step needs (``ExactUniform``).

Impossible evidence (a token no row of the language holds at that place) leaves the true
conditional undefined; an absorbing denoiser completes it by its ``completion``: "uniform" (uniform
logits over the row symbols) or "prefix" (condition on the longest run of positions from the
start whose tokens are possible: the tokens up to the first EOS where the conflict is after it).
Both agree with the true conditionals wherever the evidence is possible; a sampler that never
reaches impossible evidence (the full-support language) gives one answer under both. The
uniform-state denoiser's ``row_start`` says where its rows start: "boundary" (a document's first
symbol) or "packed" (a packed row cut at a fixed offset: ``chain.packed_start``).
Probability zero is the logit ``MASKED_LOGIT``, as ``eval.synthetic.likelihood``'s
stand-ins do. Not supported: the KV-cache paths (``KVCache`` needs a real backbone's shape), so
AR generation runs with ``GenerationConfig(use_cache=False)`` and block diffusion with
``kv_cache=False``; both are the reference paths the cached ones are tested to match.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dllm.uniform.objective import alpha
from eval.synthetic.exact.chain import (
    RowChain,
    next_symbol_probs,
    packed_start,
    row_chain,
    symbol_posteriors,
)
from eval.synthetic.likelihood import MASKED_LOGIT, symbol_ids
from shared.data.synthetic.hmm import HMMLanguage
from shared.tokenizer import Tokenizer


@dataclass(frozen=True)
class ExactConfig:
    """The part of a backbone's config the samplers read."""

    vocab_size: int
    max_seq_len: int
    shift_logits: bool = False


@dataclass(frozen=True)
class RowTokens:
    """Token ids of the row symbols (alphabet, EOS, then PAD in the padded layout)."""

    ids: tuple[int, ...]
    eos_id: int
    pad_id: int

    def index_of(self, token: int) -> int:
        """Row-symbol index of a token id, -1 for an id no row holds."""
        return self.ids.index(token) if token in self.ids else -1


def row_tokens(language: HMMLanguage, tokenizer: Tokenizer, layout: str) -> RowTokens:
    ids = [*symbol_ids(language, tokenizer), tokenizer.eos_id]
    if layout == "padded":
        ids.append(tokenizer.pad_id)
    return RowTokens(tuple(ids), tokenizer.eos_id, tokenizer.pad_id)


class _ExactModel(nn.Module):
    """Shared part: the chain, the id mapping, logits from row-symbol probabilities, a memo."""

    layout = "padded"
    extra_rows = 0  # vocabulary rows beyond the tokenizer's ([MASK] for absorbing models)

    def __init__(self, language: HMMLanguage, tokenizer: Tokenizer, max_seq_len: int) -> None:
        super().__init__()
        # samplers read the device (and AR generation the dtype) from the first parameter
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.language = language
        self.chain: RowChain = row_chain(language, self.layout)
        self.tokens = row_tokens(language, tokenizer, self.layout)
        vocab = tokenizer.vocab_size + self.extra_rows
        self.config = ExactConfig(vocab_size=vocab, max_seq_len=max_seq_len)
        self._memo: dict[tuple, torch.Tensor] = {}

    def to_logits(self, probs: np.ndarray | None, n: int) -> torch.Tensor:
        """[n, vocab] float64 logits: log probs on the row symbols, MASKED_LOGIT elsewhere."""
        if probs is None:  # impossible evidence: uniform over the row symbols
            probs = np.full((n, self.chain.n_symbols), 1.0 / self.chain.n_symbols)
        out = torch.full((n, self.config.vocab_size), MASKED_LOGIT, dtype=torch.float64)
        with np.errstate(divide="ignore"):
            logs = torch.from_numpy(np.log(probs)).clamp(min=MASKED_LOGIT)
        out[:, list(self.tokens.ids)] = logs
        return out

    def row_logits(self, row: tuple[int, ...], time: float | None) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self,
        tokens: torch.Tensor,
        attention: object = "causal",
        output_mask: torch.Tensor | None = None,
        *,
        time: torch.Tensor | None = None,
        **ignored: object,
    ) -> torch.Tensor:
        """Logits [B, T, vocab] (or [selected, vocab] under ``output_mask``); ``attention`` and
        the cache arguments are ignored: the conditioning is fixed by the family."""
        times = [None] * len(tokens) if time is None else [float(t) for t in time]
        rows = []
        for row, t in zip(tokens.tolist(), times):
            key = (tuple(row), t)
            if key not in self._memo:
                self._memo[key] = self.row_logits(key[0], t)
            rows.append(self._memo[key])
        out = torch.stack(rows).to(tokens.device)
        return out if output_mask is None else out[output_mask.to(out.device)]


class ExactAR(_ExactModel):
    """The true next-token conditional of the padded rows (``TrueConditionalModel`` with PAD)."""

    def row_logits(self, row: tuple[int, ...], time: float | None) -> torch.Tensor:
        observed = [self.tokens.index_of(token) for token in row[1:]]
        known = observed.index(-1) if -1 in observed else len(observed)
        probs = next_symbol_probs(self.chain, np.array(observed[:known], dtype=np.int64))
        logits = self.to_logits(probs, known + 1)
        if known < len(observed):  # after an impossible token: uniform
            rest = self.to_logits(None, len(observed) - known)
            logits = torch.cat([logits, rest])
        return logits


COMPLETIONS = ("uniform", "prefix")
ROW_STARTS = ("boundary", "packed")


class ExactAbsorbing(_ExactModel):
    """p(x_i | the unmasked tokens) for masked and block diffusion; [MASK] is the last id.
    ``completion`` says what it returns where that evidence is impossible (module docstring)."""

    extra_rows = 1

    def __init__(self, *args, completion: str = "uniform") -> None:
        if completion not in COMPLETIONS:
            raise ValueError(f"completion={completion!r} is unknown; valid: {COMPLETIONS}")
        super().__init__(*args)
        self.completion = completion

    def evidence(self, row: tuple[int, ...]) -> np.ndarray:
        """[n, R] likelihoods of the positions after BOS: 1 for every symbol where masked."""
        mask_id = self.config.vocab_size - 1
        likelihood = np.ones((len(row) - 1, self.chain.n_symbols))
        for i, token in enumerate(row[1:]):
            if token != mask_id:
                likelihood[i] = 0.0
                index = self.tokens.index_of(token)
                if index >= 0:
                    likelihood[i, index] = 1.0
        return likelihood

    def possible(self, row: tuple[int, ...]) -> bool:
        """Whether some row of the language holds every unmasked token of ``row``."""
        return symbol_posteriors(self.chain, self.evidence(row)) is not None

    def row_logits(self, row: tuple[int, ...], time: float | None) -> torch.Tensor:
        likelihood = self.evidence(row)
        probs = symbol_posteriors(self.chain, likelihood)
        if probs is None and self.completion == "prefix":
            probs = self.possible_prefix_posteriors(likelihood)
        bos = self.to_logits(None, 1)  # position 0 is never predicted
        return torch.cat([bos, self.to_logits(probs, len(row) - 1)])

    def possible_prefix_posteriors(self, likelihood: np.ndarray) -> np.ndarray:
        """The posteriors given the longest possible run of evidence from the first position
        (the positions after it read as masked); the empty run is always possible."""
        for kept in range(len(likelihood) - 1, -1, -1):
            truncated = likelihood.copy()
            truncated[kept:] = 1.0
            probs = symbol_posteriors(self.chain, truncated)
            if probs is not None:
                return probs
        raise AssertionError("a row with no evidence is always possible")


class ExactUniform(_ExactModel):
    """What a uniform-state network is trained to output: p(x0_i | z_t at every position but i),
    every position after BOS a noisy token. Not p(x0_i | z_t): the NELBO's minimiser
    (``dllm.uniform.objective.nelbo_at``) leaves position i's own noisy token out, because the
    reverse step (``dllm.uniform.sampler``, Duo's posterior) weighs x_theta by the channel
    q(z_t,i | x0_i) itself; given p(x0_i | z_t) it counts that token twice, and the sampler
    does not approach the language however many steps it takes (tested both ways)."""

    layout = "stream"

    def __init__(self, *args, row_start: str = "boundary") -> None:
        if row_start not in ROW_STARTS:
            raise ValueError(f"row_start={row_start!r} is unknown; valid: {ROW_STARTS}")
        super().__init__(*args)
        self.row_start = row_start
        if row_start == "packed":
            self.chain = packed_start(self.chain)

    def channel_likelihood(self, row: tuple[int, ...], time: float) -> np.ndarray:
        """[n, R]: P(z_i = row[i] | x_i = r) = alpha_t 1{r = z_i} + (1 - alpha_t) / N."""
        n_support = self.config.vocab_size - 1  # every tokenizer id but padding
        keep = float(alpha(torch.tensor(time, dtype=torch.float64)))
        likelihood = np.full((len(row) - 1, self.chain.n_symbols), (1.0 - keep) / n_support)
        for i, token in enumerate(row[1:]):
            index = self.tokens.index_of(token)
            if index >= 0:
                likelihood[i, index] += keep
        return likelihood

    def row_logits(self, row: tuple[int, ...], time: float | None) -> torch.Tensor:
        if time is None:
            raise ValueError("the exact uniform-state denoiser needs the time t (time=...)")
        likelihood = self.channel_likelihood(row, time)
        probs = leave_own_token_out(symbol_posteriors(self.chain, likelihood), likelihood)
        return torch.cat([self.to_logits(None, 1), self.to_logits(probs, len(row) - 1)])


def leave_own_token_out(posteriors: np.ndarray | None, likelihood: np.ndarray) -> np.ndarray | None:
    """p(x_i | evidence at every position but i) from p(x_i | all evidence) [n, R]: divide out
    position i's own likelihood and renormalise (exact: the evidence at i depends on x_i only,
    and the channel never gives a symbol likelihood 0)."""
    if posteriors is None:
        return None
    left_out = posteriors / likelihood
    return left_out / left_out.sum(axis=1, keepdims=True)


# Eso-LM's network approximates the same truth as the masked one: p(x_i | the clean tokens)
DENOISERS = {
    "ar": ExactAR,
    "mdm": ExactAbsorbing,
    "bd": ExactAbsorbing,
    "udm": ExactUniform,
    "eso": ExactAbsorbing,
}


def exact_denoiser(
    family: str, language: HMMLanguage, tokenizer: Tokenizer, max_seq_len: int, **options: str
) -> _ExactModel:
    """The exact denoiser of ``family`` ("ar", "mdm", "bd", "udm" or "eso") on ``language``;
    ``options``: ``completion`` (mdm, bd) or ``row_start`` (udm)."""
    if family not in DENOISERS:
        raise ValueError(f"family={family!r} is unknown; valid: {sorted(DENOISERS)}")
    return DENOISERS[family](language, tokenizer, max_seq_len, **options)
