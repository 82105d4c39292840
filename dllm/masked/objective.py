"""Masked diffusion (MDLM-style absorbing state, continuous time) as a training objective.

Forward process: each loss token is independently replaced by ``[MASK]`` with probability
1 - alpha_t. The model sees the noised row with bidirectional attention and predicts the clean
token at every masked position (SUBS parameterisation: ``[MASK]`` is never a prediction, and
unmasked positions are copied through, so they carry no loss). The per-row loss is

    w(t) * sum over masked positions of -log p(x_i | x_t),    w(t) = -alpha'_t / (1 - alpha_t),

and dividing the batch sum by the number of loss tokens gives the NELBO in nats per token, an
upper bound on the NLL that is directly comparable with the autoregressive loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dllm.noise import (
    AbsorbingObjective,
    check_time_range,
    diffusion_options,
    repeated_times,
    stratified_times,
)
from shared.objective import (
    LossOutput,
    annealed_attention,
    noised_positions,
    register_objective,
    sum_per_row,
)


def mask_exact_count(
    scored: torch.Tensor, uniforms: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaDA's estimator: mask exactly k of a row's n loss positions, k = ceil(u n) (uniform on
    1..n for uniform u), chosen uniformly at random, and weight the row by n / k.

    Summing over k and mask sets, its expectation is sum_M CE(M) / (|M| C(n, |M|)), the NELBO of
    the linear schedule, without the 1/t weights that explode for rows with tiny t.
    """
    n = scored.sum(-1)
    k = torch.ceil(u * n).clamp(min=1)
    # Rank the loss positions of each row by their uniform; the k lowest are masked.
    keys = torch.where(scored, uniforms, torch.full_like(uniforms, 2.0))
    rank = keys.argsort(-1).argsort(-1)
    masked = (rank < k[:, None]) & scored
    return masked, n.double() / k.double()


ESTIMATORS = ("time", "count")


@register_objective
class MaskedDiffusionObjective(AbsorbingObjective):
    name = "mdm"
    attention = "bidirectional"
    metric = "nelbo"
    streams = 1  # rows through the network per data row (FLOP budgets count each)

    def __init__(
        self,
        *,
        pad_id: int,
        mask_id: int | None = None,
        schedule: str = "linear",
        t_eps: float = 1e-3,
        estimator: str = "time",
        pad_is_data: bool = False,
    ):
        check_time_range(t_eps)
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator={estimator!r} must be one of {ESTIMATORS}")
        if estimator == "count" and schedule != "linear":
            raise ValueError(
                "estimator='count' estimates the linear-schedule NELBO; use schedule='linear'"
            )
        super().__init__(
            pad_id=pad_id, mask_id=mask_id, schedule=schedule, t_eps=t_eps, pad_is_data=pad_is_data
        )
        self.estimator = estimator

    @classmethod
    def options_from_config(cls, train_config: dict, *, full_noise_range: bool) -> dict:
        return diffusion_options(train_config) | {
            "estimator": train_config.get("estimator", "time")
        }

    @classmethod
    def check_config(cls, train_config) -> None:
        pass  # the estimator and schedule are checked when the objective is built

    def sample_noise(
        self, n_rows: int, seq_len: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        t = stratified_times(n_rows, generator, self.t_eps)
        uniforms = torch.rand((n_rows, seq_len), generator=generator, dtype=torch.float64)
        return {"t": t, "uniforms": uniforms}

    def repeated_noise(
        self, n_rows: int, samples: int, seq_len: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Noise for ``samples`` copies of each of ``n_rows`` rows (row-major: copies of row 0
        first), with t stratified across the copies of each row, for Monte-Carlo evaluation."""
        t = repeated_times(n_rows, samples, generator, self.t_eps)
        uniforms = torch.rand((n_rows * samples, seq_len), generator=generator, dtype=torch.float64)
        return {"t": t, "uniforms": uniforms}

    def noised_positions(self, tokens: torch.Tensor) -> torch.Tensor:
        return noised_positions(tokens, self.pad_id, self.pad_is_data)

    def noise_rows(
        self,
        tokens: torch.Tensor,
        noise: dict[str, torch.Tensor],
        scored: torch.Tensor | None = None,
    ):
        """Apply the forward process to the ``scored`` positions (default: the loss positions):
        returns (noised tokens, masked positions, per-row weight)."""
        if scored is None:
            scored = self.noised_positions(tokens)
        uniforms = noise["uniforms"].to(tokens.device)
        t = noise["t"].to(tokens.device)
        if self.estimator == "time":
            masked = (uniforms < (1.0 - self.schedule.alpha(t))[:, None]) & scored
            weight = self.schedule.loss_weight(t)
        else:
            masked, weight = mask_exact_count(scored, uniforms, t)
        noised = torch.where(masked, torch.full_like(tokens, self.mask_id), tokens)
        return noised, masked, weight

    def loss(
        self,
        model: nn.Module,
        tokens: torch.Tensor,
        noise: dict[str, torch.Tensor],
        scored: torch.Tensor | None = None,
    ) -> LossOutput:
        scored, counted = self.noised_and_counted(tokens, scored)
        noised, masked, weight = self.noise_rows(tokens, noise, scored)
        # Full attention, except in the first training steps of a run with attention annealing.
        attention = annealed_attention(noise, self.attention, tokens.shape[1], tokens.device)
        logits = model(noised, attention=attention, output_mask=masked)
        # SUBS: drop the [MASK] column so the softmax runs over real tokens only.
        token_nats = F.cross_entropy(
            logits[:, : self.mask_id].float(), tokens[masked], reduction="none"
        )
        row_of_token = masked.nonzero()[:, 0]
        weighted = token_nats.double() * weight[row_of_token]
        row_nats = sum_per_row(weighted, row_of_token, len(tokens))
        # Per-token normalisation counts real tokens only, as the AR loss does, so the padding's
        # (small) nats are charged to the text they delimit.
        return LossOutput(nats=weighted.sum().float(), n_tokens=counted.sum(), row_nats=row_nats)
