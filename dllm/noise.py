"""What the diffusion objectives share: noise times, their range, the options every one reads
from a run's config, and the fields and ``[MASK]`` row of the absorbing-state ones (masked and
block).

Each family's objective lives in its own folder (``dllm.masked``, ``dllm.block``,
``dllm.uniform``); what more than one of them uses lives here.
"""

from __future__ import annotations

import torch

from dllm.schedules import get_schedule
from shared.objective import loss_positions, noised_positions


def stratified_times(n_rows: int, generator: torch.Generator, eps: float) -> torch.Tensor:
    """One t per row, t_i = eps + (1 - eps) (i + u) / n with one shared uniform u.

    Every row still has a uniform marginal on [eps, 1], so the estimator stays unbiased, but the
    batch covers the interval evenly, which lowers the variance of the batch mean.
    """
    u = torch.rand((), generator=generator, dtype=torch.float64)
    return eps + (1.0 - eps) * (torch.arange(n_rows, dtype=torch.float64) + u) / n_rows


def repeated_times(n_rows: int, samples: int, generator: torch.Generator, eps: float):
    """t for ``samples`` copies of each of ``n_rows`` rows (copies of row 0 first), stratified
    across the copies of each row (``stratified_times``), for Monte-Carlo evaluation."""
    return torch.cat([stratified_times(samples, generator, eps) for _ in range(n_rows)])


def check_time_range(t_eps: float, t_max: float = 1.0) -> None:
    """Diffusion times are drawn from [t_eps, t_max], a non-empty part of [0, 1]."""
    if not 0.0 <= t_eps < 1.0:
        raise ValueError(f"t_eps={t_eps!r} must be in [0, 1)")
    if not t_eps < t_max <= 1.0:
        raise ValueError(f"t_max={t_max!r} must be in (t_eps={t_eps}, 1]")


def diffusion_options(train_config: dict) -> dict:
    """The options every diffusion objective takes from a run's training config."""
    return {
        "schedule": train_config["schedule"],
        "t_eps": train_config["t_eps"],
        # padded protocol: padding is data the diffusion model must generate (see below)
        "pad_is_data": train_config.get("protocol") == "padded",
    }


class AbsorbingObjective:
    """What the absorbing diffusion objectives (masked, block) share: their fields, and the
    ``[MASK]`` id, one extra vocabulary row, the last id, so tokenizer ids are unchanged (and
    every diffusion objective has the same number of parameters)."""

    added_rows = 1  # the [MASK] row checkpoints carry beyond the tokenizer's ids

    def __init__(
        self,
        *,
        pad_id: int,
        mask_id: int | None,
        schedule: str,
        t_eps: float,
        pad_is_data: bool,
    ):
        """The fields both absorbing objectives hold: the padding id, the ``[MASK]`` id (set by
        ``model_vocab_size`` when not given), the noise schedule, the smallest time, and whether
        padding is data. Under the padded protocol padding after EOS is part of the data: it is
        noised and predicted like any token, or the visible padding tells the model each row's
        length for free and the NELBO bounds -log p(x | length) instead of -log p(x)."""
        self.pad_id = pad_id
        self.mask_id = mask_id
        self.schedule = get_schedule(schedule)
        self.t_eps = t_eps
        self.pad_is_data = pad_is_data

    def model_vocab_size(self, tokenizer_vocab_size: int) -> int:
        self.mask_id = tokenizer_vocab_size
        return tokenizer_vocab_size + 1

    def noised_and_counted(
        self, tokens: torch.Tensor, scored: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions the forward process may mask, positions the loss is divided over): every
        noisable position and the loss positions by default; a given ``scored`` is both."""
        if self.mask_id is None:
            raise RuntimeError("call model_vocab_size() before loss() so the [MASK] id is known")
        if scored is None:
            noisable = noised_positions(tokens, self.pad_id, self.pad_is_data)
            return noisable, loss_positions(tokens, self.pad_id)
        return scored, scored
