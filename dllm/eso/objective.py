"""Eso-LM (Sahoo et al. 2025, arXiv 2506.01928, variant B) as a training objective, "eso".

A row is generated in two phases. A masked-diffusion phase reveals an expected share
``alpha_0`` of the positions in a random order (alpha_t = alpha_0 (1 - t)); an autoregressive
phase then fills the positions still masked, left to right. Its NELBO is the sum of the two
phases' terms:

    diffusion:   E_t [ alpha_0 / (1 - alpha_t) * sum over masked i of z_t: -log p(x_i | z_t) ]
    sequential:  E_z0 [ sum over masked l of z_0: -log p(x_l | z_0, x_<l) ]

alpha_0 = 1 leaves nothing to the sequential phase (a masked diffusion model with the linear
schedule, weight 1/t); alpha_0 = 0 gives the diffusion term weight 0 and masks every position
of z_0 (the autoregressive NLL).

Both terms run the backbone causally over a *permuted* row, which is what lets the sampler
keep a KV cache in both phases: BOS first, then the clean tokens in a random order, then the
masked positions (random order in the diffusion term, ascending in the sequential one), each
token at its own RoPE position. A masked token is predicted at its own slot (no shift), from
the clean tokens and the masks before it. The sequential term needs the masked tokens twice,
as [MASK] queries and as clean keys for the positions after them: its input is [permuted x,
permuted [MASK] queries] with block-size-1 two-stream attention (``sequential_attention``).
Each row draws one of the two terms (probability 1/2, weight 2: unbiased for their sum, half
the cost); alpha_0 in {0, 1} has one term only.
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
from shared.attention import positional_mask, within_window
from shared.errors import ConfigError
from shared.model import backbone_config
from shared.objective import LossOutput, register_objective, sum_per_row


def check_alpha_0(alpha_0: float, flag: str = "alpha_0") -> float:
    if isinstance(alpha_0, bool) or not isinstance(alpha_0, int | float) or not 0 <= alpha_0 <= 1:
        raise ConfigError(
            f"{flag}={alpha_0!r} must be in [0, 1] (1 = a masked diffusion model, 0 = "
            "autoregressive)"
        )
    return float(alpha_0)


def eso_alpha(alpha_0: float, t: torch.Tensor) -> torch.Tensor:
    """The share of clean positions at diffusion time t: alpha_0 at t = 0, none at t = 1."""
    return alpha_0 * (1.0 - t)


def diffusion_weight(alpha_0: float, t: torch.Tensor) -> torch.Tensor:
    """-alpha'_t / (1 - alpha_t) for alpha_t = alpha_0 (1 - t); 1/t at alpha_0 = 1."""
    return alpha_0 / (1.0 - eso_alpha(alpha_0, t))


def permutation(
    clean: torch.Tensor, order_uniforms: torch.Tensor, masks_ascending: bool
) -> torch.Tensor:
    """[B, L] slot -> position: position 0 (BOS) first, the ``clean`` positions in the random
    order of ``order_uniforms``, then the masked positions, ascending or in random order."""
    length = clean.shape[1]
    position = torch.arange(length, device=clean.device, dtype=torch.float64)
    mask_key = position / length if masks_ascending else order_uniforms
    key = torch.where(clean, order_uniforms, 1.0 + mask_key)
    key[:, 0] = -1.0
    return key.argsort(-1)


def sequential_attention(length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[2L, 2L] boolean mask over [clean stream, query stream], both in slot order: a clean
    slot sees the clean slots up to itself; query slot k sees the clean slots before k and
    itself (BD3-LM's two-stream mask with blocks of one)."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    top = torch.cat([causal, torch.zeros_like(causal)], 1)
    bottom = torch.cat([causal.tril(-1), torch.eye(length, dtype=torch.bool, device=device)], 1)
    return torch.cat([top, bottom], 0)


def permuted_attention(window: int, positions: torch.Tensor, start: int = 0):
    """The attention of a forward over a permuted row: its keys at RoPE positions ``positions``
    [B, K] in slot order (a KV cache's and then the inputs'), its inputs the keys from slot
    ``start`` on. Causal over the slots; a model with a sliding window keeps it over the
    positions (``shared.attention.positional_mask``), as its other families see it."""
    if not window:
        return "causal"
    slots = torch.arange(positions.shape[1], device=positions.device)
    return positional_mask(slots[start:], slots, positions[:, start:], positions, window=window)


def gather_rows(values: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    return values.gather(1, order)


@register_objective
class EsoObjective(AbsorbingObjective):
    name = "eso"
    # Descriptive: the loss builds its own permuted causal and two-stream forwards.
    attention = "causal"
    metric = "nelbo"
    estimator = "time"  # Bernoulli masks at t (read by eval.likelihood)

    def __init__(
        self,
        *,
        pad_id: int,
        alpha_0: float = 0.5,
        mask_id: int | None = None,
        schedule: str = "linear",
        t_eps: float = 1e-3,
        pad_is_data: bool = False,
    ):
        check_time_range(t_eps)
        if schedule != "linear":
            raise ConfigError(
                f"schedule={schedule!r}: objective='eso' defines alpha_t = alpha_0 (1 - t), "
                "the linear schedule; use --schedule linear"
            )
        super().__init__(
            pad_id=pad_id, mask_id=mask_id, schedule=schedule, t_eps=t_eps, pad_is_data=pad_is_data
        )
        self.alpha_0 = check_alpha_0(alpha_0)

    @property
    def streams(self) -> float:
        """Rows through the network per data row, on average: 1 for a diffusion-term row, 2 for
        a sequential one ([clean, queries]), each drawn half the time when both terms count."""
        if self.alpha_0 == 1.0:
            return 1.0
        return 2.0 if self.alpha_0 == 0.0 else 1.5

    @classmethod
    def options_from_config(cls, train_config: dict, *, full_noise_range: bool) -> dict:
        return diffusion_options(train_config) | {"alpha_0": train_config.get("alpha_0", 0.5)}

    @classmethod
    def check_config(cls, train_config) -> None:
        check_alpha_0(train_config.alpha_0, "alpha_0 (--alpha-0)")
        if train_config.schedule != "linear":
            raise ConfigError(
                f"schedule={train_config.schedule!r}: objective='eso' uses alpha_t = "
                "alpha_0 (1 - t), the linear schedule; use --schedule linear"
            )

    def sample_noise(
        self, n_rows: int, seq_len: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        t = stratified_times(n_rows, generator, self.t_eps)
        return self._row_noise(t, n_rows, seq_len, generator)

    def repeated_noise(
        self, n_rows: int, samples: int, seq_len: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Noise for ``samples`` copies of each row (copies of row 0 first), t stratified
        across the copies of a row, for Monte-Carlo evaluation."""
        t = repeated_times(n_rows, samples, generator, self.t_eps)
        return self._row_noise(t, n_rows * samples, seq_len, generator)

    def _row_noise(self, t, n_rows: int, seq_len: int, generator) -> dict[str, torch.Tensor]:
        def uniforms() -> torch.Tensor:
            return torch.rand((n_rows, seq_len), generator=generator, dtype=torch.float64)

        phase = torch.rand(n_rows, generator=generator, dtype=torch.float64)
        return {"t": t, "uniforms": uniforms(), "order": uniforms(), "phase": phase}

    def sequential_rows(self, phase: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Which rows score the sequential term, and the weight of each term's rows."""
        if self.alpha_0 in (0.0, 1.0):
            return torch.full_like(phase, self.alpha_0 == 0.0, dtype=torch.bool), 1.0
        return phase < 0.5, 2.0

    def loss(
        self,
        model: nn.Module,
        tokens: torch.Tensor,
        noise: dict[str, torch.Tensor],
        scored: torch.Tensor | None = None,
    ) -> LossOutput:
        scored, counted = self.noised_and_counted(tokens, scored)
        noise = {key: value.to(tokens.device) for key, value in noise.items()}
        sequential, weight = self.sequential_rows(noise["phase"])
        row_nats = torch.zeros(len(tokens), dtype=torch.float64, device=tokens.device)
        for rows, term in ((~sequential, self.diffusion_term), (sequential, self.sequential_term)):
            if rows.any():
                part = {key: value[rows] for key, value in noise.items()}
                row_nats[rows] = weight * term(model, tokens[rows], part, scored[rows])
        return LossOutput(nats=row_nats.sum().float(), n_tokens=counted.sum(), row_nats=row_nats)

    def masked_nats(
        self, model: nn.Module, inputs, targets, order, output, attention
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token nats of the ``output`` slots (their target tokens ``targets`` [B, S]) and
        the row of each, the network run on ``inputs`` at RoPE positions ``order``."""
        logits = model(inputs, attention=attention, output_mask=output, positions=order)
        # SUBS: [MASK] is never a prediction.
        nats = F.cross_entropy(logits[:, : self.mask_id].float(), targets[output], reduction="none")
        return nats.double(), output.nonzero()[:, 0]

    def diffusion_term(self, model, tokens, noise, scored) -> torch.Tensor:
        """[B] alpha_0 / (1 - alpha_t) times the nats of the positions masked at t."""
        t = noise["t"]
        masked = (noise["uniforms"] < (1.0 - eso_alpha(self.alpha_0, t))[:, None]) & scored
        order = permutation(~masked, noise["order"], masks_ascending=False)
        noised = torch.where(masked, torch.full_like(tokens, self.mask_id), tokens)
        output = gather_rows(masked, order)
        attention = permuted_attention(backbone_config(model).sliding_window, order)
        nats, row = self.masked_nats(
            model, gather_rows(noised, order), gather_rows(tokens, order), order, output, attention
        )
        weighted = nats * diffusion_weight(self.alpha_0, t)[row]
        return sum_per_row(weighted, row, len(tokens))

    def sequential_term(self, model, tokens, noise, scored) -> torch.Tensor:
        """[B] the nats of the positions masked in z_0, each predicted from the clean tokens
        of z_0 and the masked positions before it."""
        masked = (noise["uniforms"] < 1.0 - self.alpha_0) & scored
        order = permutation(~masked, noise["order"], masks_ascending=True)
        clean = gather_rows(tokens, order)
        queries = torch.full_like(clean, self.mask_id)
        output = torch.cat([torch.zeros_like(masked), gather_rows(masked, order)], 1)
        positions = torch.cat([order, order], 1)
        attention = sequential_attention(tokens.shape[1], tokens.device)
        window = backbone_config(model).sliding_window
        if window:  # a mask tensor replaces the model's own window: it carries it
            attention = attention & within_window(positions, positions, window)
        nats, row = self.masked_nats(
            model,
            torch.cat([clean, queries], 1),
            torch.cat([clean, clean], 1),
            positions,
            output,
            attention,
        )
        return sum_per_row(nats, row, len(tokens))
