"""Sampling from a uniform-state diffusion (udm) model: ancestral steps through the posterior.

    canvas = uniform_canvas(tokens, free, n_support, pad_id, generators)
    result = sample_uniform(model, canvas, free, UniformSamplerConfig(steps=64), generators, pad)

The generation positions (``free``) start as uniform draws from the support (z_1 is the prior);
the other positions (BOS, a prompt, an infilling suffix) are held clean throughout. Step k of
``steps`` goes from t = k / steps to s = (k - 1) / steps: the model gives x_theta at every
position, and each free position draws z_s from the uniform-state posterior with x_theta in
place of the clean token (reference: Duo's ``_compute_posterior``),

    p(z_s = j | z_t = i) oc [alpha_{t|s} 1{j = i} + (1 - alpha_{t|s}) / N]
                            * [alpha_s x_theta_j + (1 - alpha_s) / N],

with alpha_{t|s} = alpha_t / alpha_s; at s = 0 (alpha_0 = 1) this is x_theta reweighted by the
chance of having reached z_t.
``greedy_tail``: the last step takes the argmax of x_theta instead.
``corrector`` (kappa, Duo++'s Psi step with a constant kappa): z_s is drawn from
kappa * posterior + (1 - kappa) * (alpha_s x_hat + (1 - alpha_s) / N), where x_hat is the
posterior all the way to s = 0 (x_theta reweighted by the chance of reaching z_t) noised forward
again to s: a share 1 - kappa of the step forgets z_t and re-noises the model's guess, which can
undo earlier mistakes (a uniform-state token can always change again). kappa = 1 is the ancestral
step exactly; the last step (s = 0) is the same for every kappa.
``psi`` (Duo++'s Psi-samplers, arXiv 2602.21185) picks kappa per step (``psi_plan``): "constant"
(kappa = ``corrector`` at every step with t in [t_off, t_on]); "cap" and "rescale" (ReMDM's
sigma schedules carried over by kappa = 1 - sigma / (1 - alpha_s), clipped to [0, 1]: sigma =
min(eta, sigma_max) or eta * sigma_max, sigma_max = min(1, (1 - alpha_s) / alpha_t)); "loop"
(alpha rises linearly to ``alpha_on`` at ``t_on``, is held there until ``t_off`` with kappa =
1 - eta / (1 - alpha_on), a corrector chain at fixed noise, then rises linearly to 1; the model
is conditioned on the time whose alpha that is). Temperature, top-k and top-p
apply to x_theta, never to the posterior (greedy on the posterior gives near-random text).
Every draw is in float64 from the row's own CPU generator, so a row's sample does not depend on
the rows batched with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from dllm.remdm import loop_alpha, sigma_max
from dllm.uniform.objective import DELTA, alpha, support_ids, support_index
from shared.sampling import SamplingConfig, process_logits, sample_categorical


@dataclass(frozen=True)
class UniformSamplerConfig:
    """``steps``: denoising steps (one network evaluation each); ``greedy_tail``: the last step
    takes argmax x_theta; ``sampling``: temperature / top-k / top-p on x_theta (temperature 0
    is greedy at every step); ``corrector``: kappa of the predictor-corrector step (1 = the
    ancestral step)."""

    steps: int
    greedy_tail: bool = False
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    corrector: float = 1.0
    psi: str = "constant"
    eta: float = 0.0
    t_on: float = 1.0
    t_off: float = 0.0
    alpha_on: float = 0.9

    @property
    def name(self) -> str:
        plain = self.psi == "constant" and self.corrector == 1.0
        return "uniform-ancestral" if plain else "uniform-psi"

    def validate(self) -> UniformSamplerConfig:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps={self.steps!r} must be a positive integer")
        if not 0.0 <= self.corrector <= 1.0:
            raise ValueError(f"corrector={self.corrector!r} (kappa) must be in [0, 1]")
        check_psi_knobs(self)
        if self.sampling.min_p or self.sampling.repetition_penalty != 1.0:
            raise ValueError(
                "min_p and repetition_penalty are not applied by the udm sampler; it takes "
                "temperature, top_k and top_p (on x_theta)"
            )
        self.sampling.validate()
        return self


PSI_MODES = ("constant", "cap", "rescale", "loop")


def check_psi_knobs(config: UniformSamplerConfig) -> None:
    """One line per Psi knob out of range, naming it, its value and the valid range."""
    if config.psi not in PSI_MODES:
        raise ValueError(f"psi={config.psi!r} is unknown; valid: {list(PSI_MODES)}")
    if not 0.0 <= config.t_off < config.t_on <= 1.0:
        raise ValueError(
            f"t_on={config.t_on}, t_off={config.t_off} are out of range: valid "
            "0 <= t_off < t_on <= 1"
        )
    if not 0.0 < config.alpha_on < 1.0:
        raise ValueError(f"alpha_on={config.alpha_on} is out of range: valid (0, 1)")
    bound = 1.0 - config.alpha_on if config.psi == "loop" else 1.0
    if not 0.0 <= config.eta <= bound + 1e-12:  # 1 - 0.9 is 0.0999...98
        raise ValueError(
            f"eta={config.eta} is out of range for psi {config.psi}: valid [0, {bound:.4g}]"
        )


def psi_kappa(config: UniformSamplerConfig, t: float, s: float, a_t: float, a_s: float):
    """kappa of one step from t to s (alphas a_t, a_s) under ``config.psi``; 1 at s = 0."""
    if s == 0.0:
        return 1.0
    if config.psi == "loop":  # t is the model's time here: the held alpha marks the window
        held = a_t == a_s
        return 1.0 - config.eta / (1.0 - config.alpha_on) if held else 1.0
    if not config.t_off <= t <= config.t_on:
        return 1.0
    if config.psi == "constant":
        return config.corrector
    bound = sigma_max(a_t, a_s)
    sigma = min(config.eta, bound) if config.psi == "cap" else config.eta * bound
    return min(1.0, max(0.0, 1.0 - sigma / (1.0 - a_s)))


def psi_plan(config: UniformSamplerConfig) -> list[tuple[float, float, float]]:
    """(t, s, kappa) of every step, first to last: the uniform grid t = k / steps, or (loop) the
    times whose alpha follows the loop profile."""
    plan = []
    for k in range(config.steps, 0, -1):
        t, s = k / config.steps, (k - 1) / config.steps
        if config.psi == "loop":
            t, s = (loop_time(v, config) for v in (round(t, 12), round(s, 12)))
        a_t, a_s = (float(alpha(torch.tensor(v, dtype=torch.float64))) for v in (t, s))
        plan.append((t, s, psi_kappa(config, t, s, a_t, a_s)))
    return plan


def loop_time(grid_time: float, config: UniformSamplerConfig) -> float:
    """The model time whose alpha is the loop profile's alpha at ``grid_time`` (clipped to
    [0, 1]: the profile starts at alpha = 0, below the schedule's alpha_1)."""
    target = loop_alpha(grid_time, config.t_on, config.t_off, config.alpha_on)
    if grid_time == 0.0:
        return 0.0
    return min(1.0, (1.0 - target) / (1.0 - DELTA))


@dataclass
class UniformSampleResult:
    tokens: torch.Tensor  # [B, L] the final canvas
    nfe: int  # network evaluations
    changed: torch.Tensor  # [steps, B] free positions whose token changed at each step


def posterior(x_theta: torch.Tensor, noised: torch.Tensor, t: float, s: float) -> torch.Tensor:
    """p(z_s | z_t) over the support [n, N] (float64, normalised) for ``x_theta`` [n, N] and the
    noised support positions ``noised`` [n]."""
    n_support = x_theta.shape[-1]
    alpha_t, alpha_s = (float(alpha(torch.tensor(v, dtype=torch.float64))) for v in (t, s))
    alpha_ts = alpha_t / alpha_s
    stay = torch.nn.functional.one_hot(noised, n_support).to(torch.float64)
    weights = (alpha_ts * stay + (1.0 - alpha_ts) / n_support) * (
        alpha_s * x_theta.to(torch.float64) + (1.0 - alpha_s) / n_support
    )
    return weights / weights.sum(-1, keepdim=True)


def corrected_step(
    x_theta: torch.Tensor, noised: torch.Tensor, t: float, s: float, kappa: float
) -> torch.Tensor:
    """The Psi step's distribution of z_s [n, N] (float64): kappa * posterior + (1 - kappa) *
    the posterior to 0 noised forward to s. kappa = 1 returns the posterior itself."""
    step = posterior(x_theta, noised, t, s)
    if kappa == 1.0:
        return step
    alpha_s = float(alpha(torch.tensor(s, dtype=torch.float64)))
    renoised = alpha_s * posterior(x_theta, noised, t, 0.0) + (1.0 - alpha_s) / x_theta.shape[-1]
    return kappa * step + (1.0 - kappa) * renoised


def uniform_canvas(
    tokens: torch.Tensor,
    free: torch.Tensor,
    n_support: int,
    pad_id: int,
    generators: Sequence[torch.Generator],
) -> torch.Tensor:
    """``tokens`` with every ``free`` position replaced by a uniform draw from the support (z_1)."""
    canvas = tokens.clone()
    for row, generator in enumerate(generators):
        count = int(free[row].sum())
        draws = torch.randint(0, n_support, (count,), generator=generator)
        canvas[row, free[row]] = support_ids(draws, pad_id).to(canvas.device)
    return canvas


@torch.no_grad()
def sample_uniform(
    model: nn.Module,
    canvas: torch.Tensor,
    free: torch.Tensor,
    config: UniformSamplerConfig,
    generators: Sequence[torch.Generator],
    pad_id: int,
) -> UniformSampleResult:
    """Denoise the ``free`` positions of ``canvas`` [B, L] (z_1 already drawn) in
    ``config.steps`` ancestral steps."""
    config.validate()
    tokens = canvas.clone()
    n_support = model.config.vocab_size - 1
    support = support_ids(torch.arange(n_support, device=tokens.device), pad_id)
    # Every step works on the free positions of all rows at once (row-major, as tokens[free]
    # orders them); only the draws go row by row, each from its own generator.
    per_row = free.sum(1).tolist()
    row_of = free.nonzero()[:, 0]
    changed = torch.zeros(config.steps, len(tokens), dtype=torch.long)
    for k, (t, s, kappa) in zip(range(config.steps, 0, -1), psi_plan(config)):
        time = torch.full((len(tokens),), t, device=tokens.device)
        logits = model(tokens, attention="bidirectional", output_mask=free, time=time)[:, support]
        processed = process_logits(logits, config.sampling)
        current = tokens[free]
        if config.sampling.greedy or (k == 1 and config.greedy_tail):
            chosen = processed.argmax(-1)
        else:
            x_theta = torch.softmax(processed, dim=-1)
            noised = support_index(current, pad_id)
            steps = corrected_step(x_theta, noised, t, s, kappa).split(per_row)
            chosen = torch.cat(
                [
                    sample_categorical(probs, generator) if len(probs) else probs[:, 0].long()
                    for probs, generator in zip(steps, generators)
                ]
            )
        new = support_ids(chosen.to(tokens.device), pad_id)
        moved = (new != current).long().cpu()
        changed[config.steps - k] = torch.zeros(len(tokens), dtype=torch.long).index_add(
            0, row_of.cpu(), moved
        )
        tokens[free] = new
    return UniformSampleResult(tokens=tokens, nfe=config.steps, changed=changed)


def distilled_note(state: dict, steps: int) -> str | None:
    """One line when a distilled student (``dllm.uniform.distill``: its state records
    ``distilled``) is sampled at a step count it was not distilled for; None otherwise."""
    record = state.get("distilled")
    if not record or steps in record["trained_for_steps"]:
        return None
    return (
        f"note: this student was distilled for {record['trained_for_steps']} steps; "
        f"sampling with {steps} is allowed but was not trained for"
    )
