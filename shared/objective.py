"""The small interface every training objective offers to ``train.py`` and the evaluators.

An objective decides three things: how many vocabulary rows the backbone needs, which attention
pattern it runs with, and how a batch of token rows becomes a sum of nats. Randomness (diffusion
noise) is drawn for the *global* batch from a generator seeded by the step, then sliced per
process, so any number of processes and any resume point see exactly the same noise.

Row format (see ``shared.data``): every row starts with the BOS/EOS id; loss positions are the
positions >= 1 that are not padding. Every objective is scored on exactly those tokens, so their
nats per token are directly comparable. ``loss(..., scored=mask)`` narrows the scored positions
(e.g. to a continuation after a prompt, which stays visible).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


@dataclass
class LossOutput:
    nats: torch.Tensor  # summed over loss tokens; differentiable
    n_tokens: torch.Tensor  # how many loss tokens the sum covers (the per-token denominator)
    row_nats: torch.Tensor  # [B] the same sum per row (for per-sequence estimates and errors)


class Objective(Protocol):
    name: str  # "ar", "mdm", ...
    attention: str  # attention pattern the backbone runs with
    metric: str  # what nats/token means for it: "nll" (exact) or "nelbo" (an upper bound)

    def model_vocab_size(self, tokenizer_vocab_size: int) -> int: ...

    def sample_noise(
        self, n_rows: int, seq_len: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]: ...

    def loss(
        self,
        model: nn.Module,
        tokens: torch.Tensor,
        noise: dict[str, torch.Tensor],
        scored: torch.Tensor | None = None,
    ) -> LossOutput: ...


def loss_positions(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Boolean [B, L]: the positions every objective is scored on (not BOS, not padding)."""
    positions = tokens != pad_id
    positions[:, 0] = False
    return positions


def noised_positions(tokens: torch.Tensor, pad_id: int, pad_is_data: bool) -> torch.Tensor:
    """Positions a diffusion forward process may mask: every position but BOS when padding is
    data (padded protocol: the model must generate the length), otherwise the loss positions."""
    if not pad_is_data:
        return loss_positions(tokens, pad_id)
    positions = torch.ones_like(tokens, dtype=torch.bool)
    positions[:, 0] = False
    return positions


def sum_per_row(values: torch.Tensor, rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Sum per-token ``values`` [N] into their rows (``rows`` [N] row indices) -> [n_rows]."""
    out = torch.zeros(n_rows, dtype=values.dtype, device=values.device)
    return out.index_add(0, rows, values)


def slice_noise(noise: dict[str, torch.Tensor], start: int, stop: int) -> dict[str, torch.Tensor]:
    """Rows start..stop of a global-batch noise draw (every entry has the batch as dim 0)."""
    return {key: value[start:stop] for key, value in noise.items()}


# name -> "module:factory". A new objective registers here and touches no other objective.
OBJECTIVES = {
    "ar": "arlm.objective:AutoregressiveObjective",
    "mdm": "dllm.objective:MaskedDiffusionObjective",
    "bd": "dllm.block_objective:BlockDiffusionObjective",
}


def build_objective(name: str, *, pad_id: int, **options) -> Objective:
    if name not in OBJECTIVES:
        raise ValueError(f"objective={name!r} is unknown; valid objectives: {sorted(OBJECTIVES)}")
    module_name, factory = OBJECTIVES[name].split(":")
    return getattr(importlib.import_module(module_name), factory)(pad_id=pad_id, **options)


def objective_options(name: str, train_config: dict, *, full_noise_range: bool = False) -> dict:
    """The options a run's objective was built with, from its training config (as saved in every
    checkpoint). ``full_noise_range`` drops a clipped training range (block diffusion's t_max),
    which is a variance device, not the NELBO: evaluation always wants the full range."""
    if name not in ("mdm", "bd"):
        return {}
    options = {
        "schedule": train_config["schedule"],
        "t_eps": train_config["t_eps"],
        # padded protocol: padding is data the diffusion model must generate (see dllm/objective)
        "pad_is_data": train_config.get("protocol") == "padded",
    }
    if name == "mdm":
        options["estimator"] = train_config.get("estimator", "time")
    else:
        options["block_size"] = train_config["block_size"]
        options["t_max"] = 1.0 if full_noise_range else train_config.get("t_max", 1.0)
    return options


def objective_for_run(
    name: str, train_config: dict, tokenizer, *, full_noise_range: bool = True, **overrides
) -> Objective:
    """The objective ``name`` of a run, ready to score (its [MASK] id set from the tokenizer)."""
    options = objective_options(name, train_config, full_noise_range=full_noise_range) | overrides
    objective = build_objective(name, pad_id=tokenizer.pad_id, **options)
    objective.model_vocab_size(tokenizer.vocab_size)
    return objective
