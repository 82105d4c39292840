"""Validation loss in nats/token and bits per byte, the same way for every objective.

Diffusion noise is drawn from a generator seeded by (seed, batch index), so successive
evaluations during training see identical noise and their differences reflect the model only.
Training validates with ``evaluate_rows``; ``eval.likelihood`` builds its estimates on the same
pieces.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from shared.objective import LossOutput, Objective, loss_positions, slice_noise


def noise_generator(seed: int, index: int) -> torch.Generator:
    """A generator whose stream is a pure function of (seed, index)."""
    mixed = np.random.SeedSequence([seed, index]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(mixed[0]) << 32 | int(mixed[1]))


@dataclass
class LossTotals:
    """Summed validation loss, plus the per-row sums that give its standard error (all of them
    add up across processes, so a reduction of the fields is the totals of every row)."""

    nats: float
    tokens: int
    bytes: int
    rows: int = 0
    nats_sq: float = 0.0  # sum over rows of (row nats)^2
    tokens_sq: float = 0.0  # sum over rows of (row tokens)^2
    nats_tokens: float = 0.0  # sum over rows of row nats * row tokens

    FIELDS = ("nats", "tokens", "bytes", "rows", "nats_sq", "tokens_sq", "nats_tokens")

    def add(self, out: LossOutput, row_tokens: torch.Tensor, n_bytes: int) -> None:
        """Add one forward's loss (its sums as the objective computed them, so totals do not
        depend on whether the error is wanted) and its rows' moments."""
        self.nats += float(out.nats)
        self.tokens += int(out.n_tokens)
        self.bytes += n_bytes
        row_nats, row_tokens = out.row_nats.double().cpu(), row_tokens.double().cpu()
        self.rows += len(row_nats)
        self.nats_sq += float((row_nats**2).sum())
        self.tokens_sq += float((row_tokens**2).sum())
        self.nats_tokens += float((row_nats * row_tokens).sum())

    @property
    def stderr_per_token(self) -> float:
        """Standard error of nats/token as a ratio estimate over the rows (for a diffusion model
        the rows' noise draws are part of what varies): sqrt(N/(N-1) sum (n_i - r t_i)^2) / T."""
        if self.rows < 2 or not self.tokens:
            return float("nan")
        r = self.nats_per_token
        spread = self.nats_sq - 2 * r * self.nats_tokens + r * r * self.tokens_sq
        return math.sqrt(max(spread, 0.0) * self.rows / (self.rows - 1)) / self.tokens

    @property
    def nats_per_token(self) -> float:
        return self.nats / max(self.tokens, 1)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.nats_per_token, 700.0))

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / max(self.bytes, 1)

    def merged(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> LossTotals:
        """The totals of every process: ``reduce`` sums a float64 tensor of the fields over
        processes (each keeps its type: counts stay integers)."""
        fields = [getattr(self, name) for name in self.FIELDS]
        summed = reduce(torch.tensor(fields, dtype=torch.float64)).tolist()
        return LossTotals(*(type(v)(float(t)) for v, t in zip(fields, summed, strict=True)))

    def as_dict(self, prefix: str) -> dict[str, float | None]:
        """The record a run logs; a standard error that cannot be measured (fewer than two
        validation rows) is None, written as JSON null rather than NaN (not valid JSON)."""
        stderr = self.stderr_per_token
        return {
            f"{prefix}_nats_per_token": self.nats_per_token,
            f"{prefix}_ppl": self.perplexity,
            f"{prefix}_bpb": self.bits_per_byte,
            f"{prefix}_nats_per_token_se": None if math.isnan(stderr) else stderr,
            f"{prefix}_tokens": self.tokens,
            f"{prefix}_bytes": self.bytes,
        }


def standard_error(record: dict[str, Any], prefix: str = "val") -> float:
    """A logged record's standard error of nats/token; NaN where it was not measurable (the
    record holds null)."""
    value = record.get(f"{prefix}_nats_per_token_se")
    return math.nan if value is None else float(value)


@torch.no_grad()
def evaluate_rows(
    model: nn.Module,
    objective: Objective,
    rows: np.ndarray,
    token_bytes: np.ndarray,
    *,
    batch_size: int,
    seed: int,
    device: torch.device,
    pad_id: int,
    n_batches: int | None = None,
    micro_batch: int | None = None,
    rank: int = 0,
    world: int = 1,
    scored: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> LossTotals:
    """Summed loss over ``rows`` [N, L], cut into batches of ``batch_size`` rows.

    Batch ``i`` draws its noise from a generator seeded by (seed, i) for all of its rows, so the
    result does not depend on how the work is split: ``rank``/``world`` evaluate a contiguous
    share of every batch, ``micro_batch`` bounds how many rows go through the model at once,
    and the totals of all ranks add up to the single-process totals.

    Every rank runs the same number of forward passes (a rank whose share ran out repeats one
    row and discards it): a sharded (FSDP) model gathers its weights collectively in each
    forward, so ranks that ran different numbers of them would wait on each other forever.

    ``scored`` maps a batch to the positions it is scored on (default: every loss position).
    """
    was_training = model.training
    model.eval()
    totals = LossTotals(0.0, 0, 0)
    byte_table = torch.as_tensor(token_bytes)
    total_batches = math.ceil(len(rows) / batch_size)
    n_batches = total_batches if n_batches is None else min(n_batches, total_batches)
    for index in range(n_batches):
        batch = torch.as_tensor(
            rows[index * batch_size : (index + 1) * batch_size], dtype=torch.long
        )
        noise = objective.sample_noise(len(batch), batch.shape[1], noise_generator(seed, index))
        bounds = np.linspace(0, len(batch), world + 1).round().astype(int)
        share_start, share_stop = int(bounds[rank]), int(bounds[rank + 1])
        largest_share = int(np.diff(bounds).max())
        step = micro_batch or max(largest_share, 1)
        for start in range(share_start, share_start + largest_share, step):
            if start >= share_stop:  # this rank's share is done; keep in step with the others
                objective.loss(model, batch[:1].to(device), slice_noise(noise, 0, 1))
                continue
            stop = min(start + step, share_stop)
            tokens = batch[start:stop]
            counted = loss_positions(tokens, pad_id) if scored is None else scored(tokens)
            out = objective.loss(
                model,
                tokens.to(device),
                slice_noise(noise, start, stop),
                None if scored is None else counted.to(device),
            )
            totals.add(out, counted.sum(1), int(byte_table[tokens[counted]].sum()))
    model.train(was_training)
    return totals
