"""Uniform-state diffusion (UDLM / Duo family, continuous time) as a training objective.

Forward process: each scored token stays with probability alpha_t, else it is replaced by a
token drawn uniformly from the prior's support, so z_t ~ Cat(alpha_t x + (1 - alpha_t) / N).
The support is every tokenizer id but padding (N = vocabulary - 1): the BOS/EOS id is data in
packed rows, so it can be noised into and predicted; padding is never data here (the padded
protocol is refused). There is no ``[MASK]`` row: the backbone has the AR model's vocabulary.

Schedule: alpha_t = 1 - (1 - delta) t with delta = 1e-3 (Duo's), so alpha_1 = delta and the
loss weight stays finite; t is drawn stratified over the global batch from [t_eps, 1].

The model sees the whole noised row (bidirectional attention) and gives, at every scored
position, x_theta = softmax of its logits over the support. Unlike masked diffusion, every
scored position carries loss, changed or not (the model cannot tell which tokens are clean).
With xbar = N alpha_t x + (1 - alpha_t) and xbar_theta = N alpha_t x_theta + (1 - alpha_t), the
continuous-time NELBO of one position whose noised token is i (Schiff et al. 2024; Sahoo et al.
2025) is

    L_t = (-alpha'_t / (N alpha_t)) [ N / xbar_theta_i - N / xbar_i
          + sum_j (xbar_j / xbar_i) log( xbar_theta_i xbar_j / (xbar_theta_j xbar_i) ) ],

zero when x_theta = x. Since xbar takes two values, the sum needs one pass over the support,
sum_j log xbar_theta_j (``position_nelbo``). The reported bound adds the prior term
KL(q(z_1 | x) || uniform), a constant of the schedule, so that it bounds -log p(x) and is
reported in nats per token on exactly the tokens AR and MDM are scored on.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dllm.noise import check_time_range, repeated_times, stratified_times
from dllm.uniform.curriculum import (
    GAMMA_MAX,
    GAMMA_MIN,
    TAU,
    AlphaMap,
    gaussian_latents,
    row_normals,
)
from shared.errors import ConfigError
from shared.objective import (
    LossOutput,
    annealed_attention,
    loss_positions,
    register_objective,
    sum_per_row,
)
from shared.time_embedding import SoftInput

DELTA = 1e-3  # alpha_1: the clean share left at t = 1


def alpha(t: torch.Tensor) -> torch.Tensor:
    return 1.0 - (1.0 - DELTA) * t


def alpha_derivative(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, -(1.0 - DELTA))


def support_index(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Position of each (non-padding) token id in the support: ids above padding move down one."""
    return ids - (ids > pad_id).long()


def support_ids(index: torch.Tensor, pad_id: int) -> torch.Tensor:
    """The token id of each support position (the inverse of ``support_index``)."""
    return index + (index >= pad_id).long()


def position_nelbo(
    log_x_theta: torch.Tensor, clean: torch.Tensor, noised: torch.Tensor, t: torch.Tensor
) -> torch.Tensor:
    """L_t above for each position: ``log_x_theta`` [n, N] the model's log-probabilities over
    the support, ``clean`` and ``noised`` [n] support positions of x and z_t, ``t`` [n]."""
    return nelbo_at(log_x_theta, clean, noised, alpha(t), alpha_derivative(t))


def nelbo_at(
    log_x_theta: torch.Tensor,
    clean: torch.Tensor,
    noised: torch.Tensor,
    alpha_t: torch.Tensor,
    dalpha_t: torch.Tensor,
) -> torch.Tensor:
    """``position_nelbo`` for any schedule: ``alpha_t`` [n] and its time derivative ``dalpha_t``
    [n] given directly (the Gaussian curriculum's alpha is a map of gamma, not of t)."""
    n_support = log_x_theta.shape[-1]
    a = alpha_t.to(log_x_theta.dtype)
    noise_share = 1.0 - a  # the weight of the uniform part of xbar
    # log xbar_theta_j = log(N alpha x_theta_j + 1 - alpha), computed in log space
    log_xbar_theta = torch.logaddexp(
        torch.log(n_support * a)[:, None] + log_x_theta, torch.log(noise_share)[:, None]
    )
    log_theta_i = log_xbar_theta.gather(1, noised[:, None])[:, 0]
    log_theta_x = log_xbar_theta.gather(1, clean[:, None])[:, 0]
    sum_log_theta = log_xbar_theta.sum(-1)
    # xbar has two values: N alpha + 1 - alpha at x, 1 - alpha elsewhere
    xbar_clean = n_support * a + noise_share
    xbar_i = torch.where(noised == clean, xbar_clean, noise_share)
    entropy_part = xbar_clean * torch.log(xbar_clean) + (n_support - 1) * noise_share * torch.log(
        noise_share
    )
    cross_part = n_support * a * log_theta_x + noise_share * sum_log_theta
    bracket = (
        n_support * torch.exp(-log_theta_i)
        - n_support / xbar_i
        + (n_support / xbar_i) * (log_theta_i - torch.log(xbar_i))
        + (entropy_part - cross_part) / xbar_i
    )
    weight = -dalpha_t.to(log_x_theta.dtype) / (n_support * a)
    return weight * bracket


def prior_nats(n_support: int, alpha_1: float = DELTA) -> float:
    """KL(q(z_1 | x) || uniform) of one position: the same for every token x."""
    clean = alpha_1 + (1.0 - alpha_1) / n_support
    other = (1.0 - alpha_1) / n_support
    return clean * math.log(clean * n_support) + (n_support - 1) * other * math.log(
        other * n_support
    )


@register_objective
class UniformDiffusionObjective:
    name = "udm"
    attention = "bidirectional"
    metric = "nelbo"
    streams = 1
    estimator = "time"  # t drawn per row (the MDM's count estimator has no uniform analogue)

    def __init__(
        self,
        *,
        pad_id: int,
        t_eps: float = 1e-3,
        schedule: str = "linear",
        curriculum_steps: int = 0,
        curriculum_tau: float = TAU,
        curriculum_gamma: tuple[float, float] = (GAMMA_MIN, GAMMA_MAX),
    ):
        check_time_range(t_eps)
        if schedule != "linear":
            raise ValueError(
                f"schedule={schedule!r}: udm uses alpha_t = 1 - (1 - 1e-3) t; use --schedule linear"
            )
        self.pad_id = pad_id
        self.t_eps = t_eps
        self.n_support: int | None = None  # set by model_vocab_size
        # the Gaussian curriculum (training steps 0..curriculum_steps-1; 0 = off; -1 = the first
        # half of the run, set by ``set_run_length`` once the run's length is known)
        self.curriculum_steps, self.curriculum_tau = curriculum_steps, curriculum_tau
        self.curriculum_gamma = tuple(curriculum_gamma)
        self._alpha_map: AlphaMap | None = None

    @classmethod
    def options_from_config(cls, train_config: dict, *, full_noise_range: bool) -> dict:
        options = {"t_eps": train_config["t_eps"], "schedule": train_config["schedule"]}
        if not full_noise_range and train_config.get("curriculum_steps", 0):
            # training only: evaluation always scores the exact discrete NELBO
            options |= {
                "curriculum_steps": train_config["curriculum_steps"],
                "curriculum_tau": train_config["curriculum_tau"],
                "curriculum_gamma": (
                    train_config["curriculum_gamma_min"],
                    train_config["curriculum_gamma_max"],
                ),
            }
        return options

    @classmethod
    def check_config(cls, train_config) -> None:
        if train_config.protocol == "padded":
            raise ConfigError(
                "objective='udm' trains on packed rows: padding is not in its support; use "
                "--protocol packed"
            )
        if train_config.schedule != "linear":
            raise ConfigError(
                f"schedule={train_config.schedule!r}: objective='udm' has its own schedule "
                "(alpha_t = 1 - (1 - 1e-3) t); use --schedule linear"
            )
        if train_config.block_size or train_config.t_max != 1.0:
            flag = "--block-size" if train_config.block_size else "--t-max"
            raise ConfigError(
                f"{flag} is a block-diffusion setting (objective 'bd'); objective='udm' noises "
                "the whole row over t in [t_eps, 1]"
            )

        if train_config.curriculum_steps:
            low, high = train_config.curriculum_gamma_min, train_config.curriculum_gamma_max
            if not low < high:
                raise ConfigError(
                    f"curriculum_gamma_min={low} must be below curriculum_gamma_max={high}"
                )
            if not train_config.curriculum_tau > 0:
                raise ConfigError(f"curriculum_tau={train_config.curriculum_tau!r} must be > 0")

    def model_vocab_size(self, tokenizer_vocab_size: int) -> int:
        if not 0 <= self.pad_id < tokenizer_vocab_size:
            raise ValueError(f"pad_id={self.pad_id} is outside the vocabulary")
        self.n_support = tokenizer_vocab_size - 1
        if self.n_support < 2:
            raise ConfigError("objective='udm' needs at least two token ids besides padding")
        return tokenizer_vocab_size

    def sample_noise(
        self, n_rows: int, seq_len: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        t = stratified_times(n_rows, generator, self.t_eps)
        keep = torch.rand((n_rows, seq_len), generator=generator, dtype=torch.float64)
        draw = torch.rand((n_rows, seq_len), generator=generator, dtype=torch.float64)
        return {"t": t, "uniforms": keep, "draws": draw}

    def set_run_length(self, total_steps: int) -> list[str]:
        """Resolve a curriculum of "the first half of the run" (-1) into steps; returns the line
        a run logs about it. A WSD branch resolves its own half, which lies before its branch
        point, so its cooldown trains the exact loss."""
        if self.curriculum_steps < 0:
            self.curriculum_steps = total_steps // 2
        if not self.curriculum_steps:
            return []
        return [
            f"curriculum: Gaussian-relaxed inputs for the first {self.curriculum_steps} of "
            f"{total_steps} steps"
        ]

    def step_noise(self, step: int, n_rows: int, generator: torch.Generator) -> dict:
        """Extra noise of training step ``step`` (drawn after the rest, so the exact steps draw
        what a run without the curriculum draws): during the curriculum, one seed per row of the
        global batch for its Gaussian latents, so any split of the batch sees the same latents."""
        if self.curriculum_steps < 0:
            raise RuntimeError("set_run_length first: the curriculum's length is not resolved")
        if step >= self.curriculum_steps:
            return {}
        return {"latent_seed": torch.randint(0, 2**62, (n_rows,), generator=generator)}

    def alpha_map(self) -> AlphaMap:
        if self._alpha_map is None:  # tabulated once, on first use
            self._alpha_map = AlphaMap(self.n_support, *self.curriculum_gamma)
        return self._alpha_map

    def repeated_noise(
        self, n_rows: int, samples: int, seq_len: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Noise for ``samples`` copies of each of ``n_rows`` rows (copies of row 0 first), t
        stratified across the copies of each row, for Monte-Carlo evaluation."""
        t = repeated_times(n_rows, samples, generator, self.t_eps)
        shape = (n_rows * samples, seq_len)
        keep = torch.rand(shape, generator=generator, dtype=torch.float64)
        draw = torch.rand(shape, generator=generator, dtype=torch.float64)
        return {"t": t, "uniforms": keep, "draws": draw}

    def noise_rows(
        self, tokens: torch.Tensor, noise: dict[str, torch.Tensor], scored: torch.Tensor
    ) -> torch.Tensor:
        """The forward process on the ``scored`` positions: each is replaced with probability
        1 - alpha_t by a uniform draw from the support (which may be the token itself)."""
        if self.n_support is None:
            raise RuntimeError("call model_vocab_size() before loss() so the support is known")
        t = noise["t"].to(tokens.device)
        replaced = (noise["uniforms"].to(tokens.device) < (1.0 - alpha(t))[:, None]) & scored
        drawn = (noise["draws"].to(tokens.device) * self.n_support).long()
        drawn = support_ids(drawn.clamp(max=self.n_support - 1), self.pad_id)
        return torch.where(replaced, drawn, tokens)

    def loss(
        self,
        model: nn.Module,
        tokens: torch.Tensor,
        noise: dict[str, torch.Tensor],
        scored: torch.Tensor | None = None,
    ) -> LossOutput:
        if scored is None:
            scored = loss_positions(tokens, self.pad_id)
        if "latent_seed" in noise:
            return self.curriculum_loss(model, tokens, noise, scored)
        noised = self.noise_rows(tokens, noise, scored)
        attention = annealed_attention(noise, self.attention, tokens.shape[1], tokens.device)
        logits = model(noised, attention=attention, output_mask=scored, time=noise["t"])
        support = support_ids(torch.arange(self.n_support, device=logits.device), self.pad_id)
        dtype = torch.promote_types(logits.dtype, torch.float32)
        log_x_theta = torch.log_softmax(logits[:, support].to(dtype), dim=-1)
        row_of_token = scored.nonzero()[:, 0]
        t = noise["t"].to(tokens.device)[row_of_token]
        token_nats = position_nelbo(
            log_x_theta,
            support_index(tokens[scored], self.pad_id),
            support_index(noised[scored], self.pad_id),
            t,
        ) + prior_nats(self.n_support)
        row_nats = sum_per_row(token_nats.double(), row_of_token, len(tokens))
        return LossOutput(nats=token_nats.sum(), n_tokens=scored.sum(), row_nats=row_nats)

    def curriculum_loss(
        self,
        model: nn.Module,
        tokens: torch.Tensor,
        noise: dict[str, torch.Tensor],
        scored: torch.Tensor,
        tau: float | None = None,
    ) -> LossOutput:
        """Duo's Gaussian relaxation (``dllm.uniform.curriculum``): each scored token's latent
        w from its row's seed at gamma(t); the network reads softmax(w / tau) @ E there, and the
        loss is the NELBO at z_t = argmax(w) with the alpha the Gaussian implies."""
        tau = self.curriculum_tau if tau is None else tau
        device = tokens.device
        alphas = self.alpha_map()
        gamma = alphas.gamma(noise["t"].cpu())
        alpha_t, dalpha_dgamma = alphas(gamma)
        span = alphas.gamma_max - alphas.gamma_min
        row_of_token = scored.nonzero()[:, 0]
        clean = support_index(tokens[scored], self.pad_id)
        eps = row_normals(noise["latent_seed"], scored, self.n_support, device)
        latents = gaussian_latents(clean, gamma.to(device)[row_of_token], self.n_support, eps)
        noised = tokens.clone()
        noised[scored] = support_ids(latents.argmax(-1), self.pad_id)
        support = support_ids(torch.arange(self.n_support, device=device), self.pad_id)
        soft = SoftInput(scored, torch.softmax(latents / tau, dim=-1), support)
        # a time-conditioned model reads the t at which the udm schedule has this alpha
        time = ((1.0 - alpha_t) / (1.0 - DELTA)).clamp(0.0, 1.0).float()
        attention = annealed_attention(noise, self.attention, tokens.shape[1], device)
        logits = model(
            noised, attention=attention, output_mask=scored, time=time.to(device), soft=soft
        )
        dtype = torch.promote_types(logits.dtype, torch.float32)
        log_x_theta = torch.log_softmax(logits[:, support].to(dtype), dim=-1)
        alpha_1 = float(alphas(torch.tensor([alphas.gamma_max]))[0][0])
        token_nats = nelbo_at(
            log_x_theta,
            clean,
            support_index(noised[scored], self.pad_id),
            alpha_t.to(device)[row_of_token],
            (dalpha_dgamma * span).to(device)[row_of_token],
        ) + prior_nats(self.n_support, alpha_1)
        row_nats = sum_per_row(token_nats.double(), row_of_token, len(tokens))
        return LossOutput(nats=token_nats.sum(), n_tokens=scored.sum(), row_nats=row_nats)
