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

from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Protocol

import torch
from torch import nn

from shared.errors import ConfigError


@dataclass
class LossOutput:
    nats: torch.Tensor  # summed over loss tokens; differentiable
    n_tokens: torch.Tensor  # how many loss tokens the sum covers (the per-token denominator)
    row_nats: torch.Tensor  # [B] the same sum per row (for per-sequence estimates and errors)


class Objective(Protocol):
    name: str  # "ar", "mdm", ...
    attention: str  # attention pattern the backbone runs with
    metric: str  # what nats/token means for it: "nll" (exact) or "nelbo" (an upper bound)
    streams: int  # rows through the network per data row (block diffusion: noisy and clean)

    @classmethod
    def options_from_config(cls, train_config: dict, *, full_noise_range: bool) -> dict:
        """Constructor options (besides ``pad_id``) from a run's training config."""
        ...

    @classmethod
    def check_config(cls, train_config) -> None:
        """Raise ``ConfigError`` when a training config cannot train this objective."""
        ...

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


def answer_positions(tokens: torch.Tensor, separator_id: int, pad_id: int) -> torch.Tensor:
    """Boolean [B, L]: the loss positions after the first ``separator_id`` of each row, for
    prompt -> answer data (``--answer-after``): the AR predicts only them, the diffusion
    objectives mask and predict only them, with the prompt always visible."""
    separator = (tokens == separator_id).long()
    after_first = (separator.cumsum(1) - separator) > 0
    return after_first & loss_positions(tokens, pad_id)


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


# ---- attention annealing (training only) -------------------------------------------------------
#
# DiffuLLaMA (Gong et al. 2024) adapts an AR model into a masked diffusion model by easing its
# attention from causal to full: at training step s < K every query sees the past plus a random
# share s/K of the future positions; from step K on, and in every evaluation and sampler, the
# objective's own (full) attention. It is chosen over the paper's other device, the shift (hidden
# state i-1 predicts token i), because annealing lives in training alone, while the shift would
# change every place that reads MDM logits (the loss, the evaluation harness, likelihoods, the
# samplers and their KV-cached predictor, the synthetic probes). The mask is part of the step's
# noise: drawn from the step's generator after the objective's own noise (which stays as it is),
# so every process and every micro-batch of a step, and a resumed run, see the same mask.


def annealing_noise(
    anneal_steps: int, step: int, n_rows: int, generator: torch.Generator, window: int = 0
) -> dict[str, torch.Tensor]:
    """Noise entries asking step ``step`` (0-based) for annealed attention: the share of future
    positions seen, ``step / anneal_steps``, and the seed of which ones (the same for every row,
    one entry per row so ``slice_noise`` splits them with the batch), and the model's sliding
    ``window`` (0 = none), which the mask keeps. Empty from ``anneal_steps`` on (and when it is
    0), which leaves the objective's full attention."""
    if step >= anneal_steps:
        return {}
    seed = torch.randint(0, 2**62, (), generator=generator)
    return {
        "anneal_share": torch.full((n_rows,), step / anneal_steps, dtype=torch.float64),
        "anneal_seed": seed.repeat(n_rows),
        "anneal_window": torch.full((n_rows,), window, dtype=torch.long),
    }


def annealed_attention(
    noise: dict[str, torch.Tensor], default: str, seq_len: int, device: torch.device | str
) -> str | torch.Tensor:
    """The attention a training step asked for: ``default`` without annealing entries, else a
    boolean mask [seq_len, seq_len] (True = may attend): causal, plus each future position with
    probability ``anneal_share`` (share 0 is exactly causal), within the sliding window if the
    model has one (a mask tensor replaces the model's own window, so it must carry it)."""
    if "anneal_share" not in noise:
        return default
    share = float(noise["anneal_share"][0])
    generator = torch.Generator().manual_seed(int(noise["anneal_seed"][0]))
    future = torch.rand((seq_len, seq_len), generator=generator, dtype=torch.float64) < share
    causal = torch.ones((seq_len, seq_len), dtype=torch.bool).tril()
    allowed = causal | future
    window = int(noise["anneal_window"][0]) if "anneal_window" in noise else 0
    if window:
        position = torch.arange(seq_len)
        allowed &= (position[:, None] - position[None, :]).abs() < window
    return allowed.to(device)


# ---- the registry ------------------------------------------------------------------------------
#
# Objectives live above this package (arlm/, dllm/), which it never imports by name. Each objective
# class adds itself with ``@register_objective`` when its module is imported; the packages declare
# those modules as entry points of the group below in pyproject.toml, so a lookup finds every
# installed objective without this file listing them.

ENTRY_POINT_GROUP = "duolm.objectives"
_REGISTRY: dict[str, type] = {}


def register_objective(cls: type) -> type:
    """Class decorator: make ``cls`` (with a unique ``name``) buildable by name."""
    if _REGISTRY.get(cls.name, cls) is not cls:
        raise ValueError(f"objective name {cls.name!r} is registered twice")
    _REGISTRY[cls.name] = cls
    return cls


@cache
def _load_installed_objectives() -> None:
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()


def added_vocab_rows(name: str | None) -> int:
    """Vocabulary rows a model of objective ``name`` has beyond its tokenizer's ids (1 for the
    [MASK] row of the absorbing-state diffusion objectives, their class's ``added_rows``); 0
    for an objective that adds none or that is not registered."""
    _load_installed_objectives()
    return getattr(_REGISTRY.get(name), "added_rows", 0)


def objective_names() -> list[str]:
    _load_installed_objectives()
    return sorted(_REGISTRY)


def objective_class(name: str) -> type:
    _load_installed_objectives()
    if name not in _REGISTRY:
        if not _REGISTRY:
            raise ConfigError(
                f"objective={name!r}: no objective is registered; install the project "
                "(pip install -e .) so arlm/ and dllm/ register theirs"
            )
        raise ConfigError(f"objective={name!r} is unknown; valid objectives: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def build_objective(name: str, *, pad_id: int, **options) -> Objective:
    return objective_class(name)(pad_id=pad_id, **options)


def objective_for_run(
    name: str, train_config: dict, tokenizer, *, full_noise_range: bool = True, **overrides
) -> Objective:
    """The objective ``name`` of a run, ready to score (its [MASK] id set from the tokenizer).

    Its options come from the run's training config (as saved in every checkpoint) through the
    objective class's ``options_from_config``. ``full_noise_range`` drops a clipped training
    noise range (block diffusion's t_max), a variance device rather than the NELBO: evaluation
    always wants the full range."""
    cls = objective_class(name)
    options = cls.options_from_config(train_config, full_noise_range=full_noise_range)
    objective = cls(pad_id=tokenizer.pad_id, **(options | overrides))
    objective.model_vocab_size(tokenizer.vocab_size)
    return objective
