"""ReMDM: the masked sampler that may remask what it revealed (Wang et al. 2025, arXiv 2503.00307).

From x_t to x_s (s < t) every position the sampler generates moves under the remasking
posterior with a remasking probability sigma_t:

- a revealed token is remasked with probability sigma_t and kept otherwise;
- a masked position is revealed with probability (alpha_s - (1 - sigma_t) alpha_t) / (1 - alpha_t),
  with a token drawn from p_theta(x0 | x_t), and stays masked otherwise.

Whatever sigma_t in [0, sigma_max], sigma_max = min(1, (1 - alpha_s) / alpha_t), a position that
is clean with probability alpha_t is clean with probability alpha_s afterwards: the forward
marginals are those of the masked model's training, so an MDLM checkpoint samples unchanged.
sigma = 0 is MDLM's ancestral sampler (``dllm.strategies.Ancestral``) draw for draw.

How sigma_t is chosen (``mode``):

- "constant": sigma_t = ``sigma`` at every step that allows it (the last step, to s = 0, allows
  none: it reveals what is left); refused above the smallest sigma_max of the other steps;
- "cap": sigma_t = min(``eta``, sigma_max);
- "rescale": sigma_t = ``eta`` * sigma_max;
- "conf": a revealed token's sigma is softmax(-psi) * sigma_max over the block's revealed
  tokens, psi its probability when it was revealed (the least confident tokens are remasked
  most); masked positions take sigma 0;
- "loop": alpha no longer follows the noise schedule; it rises linearly from 0 (t = 1) to
  ``alpha_on`` at ``t_on``, stays at ``alpha_on`` until ``t_off`` with sigma = ``eta`` (the
  steps there remask and re-reveal: a corrector chain at fixed noise), then rises linearly to
  1 at t = 0. Extra steps then keep repairing tokens instead of having nothing left to reveal.

The first three take ``t_on`` and ``t_off`` too: sigma is used only for steps starting at t in
[t_off, t_on] (t_off = 0 is ReMDM's "switch" at t_on). Within a block of the block family (or a
semi-autoregressive block) the same steps run with the block's own time grid; prompt and fixed
tokens are never remasked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from dllm.schedules import get_schedule
from dllm.strategies import StepContext, _check_steps, _steps_per_block, step_times

REMDM_MODES = ("constant", "cap", "rescale", "conf", "loop")
# ReMDM's released loop (its OWT scripts): alpha rises to alpha_on by t_on, is held there until
# t_off remasking with sigma = min(eta, sigma_max), then rises to 1. The one place the sampling
# command's defaults, the main job and the exact frontier take these numbers from.
RELEASED_LOOP_TIMES = {"t_on": 0.55, "t_off": 0.05, "alpha_on": 0.9}
RELEASED_ETA = 0.02


def sigma_max(alpha_t: float, alpha_s: float) -> float:
    """The largest remasking probability of a step: min(1, (1 - alpha_s) / alpha_t)."""
    if alpha_t <= 0.0:
        return 1.0
    return min(1.0, (1.0 - alpha_s) / alpha_t)


def reveal_probability(alpha_t: float, alpha_s: float, sigma: torch.Tensor | float):
    """Probability that a masked position is revealed: (alpha_s - (1 - sigma) alpha_t) /
    (1 - alpha_t); 1 at s = 0."""
    if alpha_s >= 1.0:
        return 1.0 if isinstance(sigma, float) else torch.ones_like(sigma)
    return (alpha_s - (1.0 - sigma) * alpha_t) / (1.0 - alpha_t)


def loop_alpha(t: float, t_on: float, t_off: float, alpha_on: float) -> float:
    """The loop's alpha at time t: linear 0 -> alpha_on on [1, t_on], alpha_on on [t_on, t_off],
    linear alpha_on -> 1 on [t_off, 0]."""
    if t > t_on:  # (at t_on exactly alpha_on, not a rounding of it: the held steps compare)
        return alpha_on * (1.0 - t) / (1.0 - t_on)
    if t >= t_off:
        return alpha_on
    return alpha_on + (1.0 - alpha_on) * (t_off - t) / t_off


@dataclass(frozen=True)
class Remdm:
    """ReMDM with ``steps`` steps (see the module docstring for the modes and knobs).
    ``schedule``: the noise schedule of the non-loop modes (None: the model's)."""

    steps: int
    mode: str = "cap"
    sigma: float = 0.0
    eta: float = 0.0
    t_on: float = 1.0
    t_off: float = 0.0
    alpha_on: float = 0.9
    schedule: str | None = None
    name: ClassVar[str] = "remdm"

    def validate(self) -> Remdm:
        _check_steps(self.steps)
        if self.mode not in REMDM_MODES:
            raise ValueError(f"remdm mode {self.mode!r} is unknown; valid: {list(REMDM_MODES)}")
        if self.schedule is not None:
            get_schedule(self.schedule)
        check_remdm_knobs(self)
        return self

    @property
    def remasks(self) -> bool:
        """Whether any step can remask (the loop then runs every step, even with nothing
        masked)."""
        return (self.mode == "constant" and self.sigma > 0) or self.mode == "conf" or self.eta > 0

    def steps_per_block(self, n_blocks: int) -> int | None:
        return _steps_per_block(self.steps, n_blocks)

    def alphas(self, index: int, steps: int) -> tuple[float, float, float, float]:
        """(t, s, alpha_t, alpha_s) of step ``index``; alpha_0 = 1 exactly."""
        t, s = step_times(index, steps)
        if self.mode == "loop":
            # 1 - 9/10 is 0.0999...98: rounded so that grid times land on t_on and t_off
            t, s = round(t, 12), round(s, 12)
            a_t, a_s = (loop_alpha(v, self.t_on, self.t_off, self.alpha_on) for v in (t, s))
        else:
            alpha = get_schedule(self.schedule or "linear").alpha
            a_t, a_s = (float(alpha(torch.tensor(v, dtype=torch.float64))) for v in (t, s))
        return t, s, a_t, 1.0 if s == 0.0 else a_s

    def step_sigma(self, index: int, steps: int) -> float:
        """The step's sigma_t (for "conf": the sigma_max its per-token weights scale)."""
        t, s, a_t, a_s = self.alphas(index, steps)
        bound = sigma_max(a_t, a_s)
        if self.mode == "loop":
            on = self.t_off <= s and t <= self.t_on and a_t == a_s
            return self.eta if on and s > 0.0 else 0.0
        if not self.t_off <= t <= self.t_on:
            return 0.0
        return {
            "constant": min(self.sigma, bound),
            "cap": min(self.eta, bound),
            "rescale": self.eta * bound,
            "conf": bound,
        }[self.mode]

    def step(self, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(reveal, tokens, remask) [B, Lb] of one step; draws as ``Ancestral`` does, plus one
        uniform per position for the remasking when this step can remask."""
        _, _, a_t, a_s = self.alphas(ctx.index, ctx.steps)
        sigma = self.step_sigma(ctx.index, ctx.steps)
        revealed = ctx.generated & ~ctx.masked
        per_token = self.token_sigmas(ctx, revealed, sigma)
        masked_sigma = 0.0 if self.mode == "conf" else sigma
        reveal = ctx.masked & (ctx.uniforms() < reveal_probability(a_t, a_s, masked_sigma))
        tokens = ctx.draw_tokens(reveal)
        remask = torch.zeros_like(reveal)
        if sigma > 0.0 and revealed.any():
            remask = revealed & (remask_uniforms(ctx, revealed) < per_token)
        if self.mode == "conf":
            remember_confidence(ctx, reveal, tokens)
        return reveal, tokens, remask

    def token_sigmas(self, ctx: StepContext, revealed: torch.Tensor, sigma: float):
        """[B, Lb] remasking probability of each revealed token."""
        if self.mode != "conf" or sigma == 0.0:
            return torch.full(revealed.shape, sigma, dtype=torch.float64, device=revealed.device)
        psi = ctx.memory.get("psi")
        if psi is None:
            psi = torch.zeros(revealed.shape, dtype=torch.float64, device=revealed.device)
        weights = torch.softmax((-psi).masked_fill(~revealed, -math.inf), dim=-1)
        return torch.nan_to_num(weights, nan=0.0) * sigma


def remask_uniforms(ctx: StepContext, revealed: torch.Tensor) -> torch.Tensor:
    """[B, Lb] float64 uniforms for the remasking decisions; a row with no revealed token
    draws none (its uniforms are 1, which remasks nothing)."""
    length = revealed.shape[1]
    rows = [
        torch.rand(length, generator=g, dtype=torch.float64)
        if active
        else torch.ones(length, dtype=torch.float64)
        for g, active in zip(ctx.generators, revealed.any(-1).tolist())
    ]
    return torch.stack(rows).to(revealed.device)


def remember_confidence(ctx: StepContext, reveal: torch.Tensor, tokens: torch.Tensor) -> None:
    """Keep psi, the model's probability of each token when it was revealed, for "conf"."""
    psi = ctx.memory.get("psi")
    if psi is None:
        psi = torch.zeros(reveal.shape, dtype=torch.float64, device=reveal.device)
    chosen = ctx.probs.gather(-1, tokens[..., None]).squeeze(-1).to(torch.float64)
    ctx.memory["psi"] = torch.where(reveal, chosen, psi)


def constant_sigma_bound(rule: Remdm) -> float:
    """The largest constant sigma every step but the last allows (min of sigma_max)."""
    steps = rule.steps
    bounds = [sigma_max(*rule.alphas(k, steps)[2:]) for k in range(steps - 1)]
    return min(bounds, default=1.0)


def check_remdm_knobs(rule: Remdm) -> None:
    """One line per knob out of range, naming the knob, the value and the valid range."""

    def number(value: object) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and value == value

    for knob in ("sigma", "eta", "t_on", "t_off", "alpha_on"):
        if not number(getattr(rule, knob)):
            raise ValueError(f"{knob}={getattr(rule, knob)!r} must be a number")
    if rule.eta < 0:
        raise ValueError(f"eta={rule.eta} is out of range: valid eta >= 0")
    if rule.sigma < 0:
        raise ValueError(f"sigma={rule.sigma} is out of range: valid sigma >= 0")
    if not 0.0 <= rule.t_off < rule.t_on <= 1.0:
        raise ValueError(
            f"t_on={rule.t_on}, t_off={rule.t_off} are out of range: valid 0 <= t_off < t_on <= 1"
        )
    if not 0.0 < rule.alpha_on < 1.0:
        raise ValueError(f"alpha_on={rule.alpha_on} is out of range: valid (0, 1)")
    bound = {
        "cap": 1.0,
        "rescale": 1.0,
        "loop": min(1.0, (1.0 - rule.alpha_on) / rule.alpha_on),
    }.get(rule.mode)
    if bound is not None and rule.eta > bound + 1e-12:  # (1 - 0.8) / 0.8 is 0.2499...94
        raise ValueError(
            f"eta={rule.eta} is above its bound for mode {rule.mode}: valid [0, {bound:.4g}]"
        )
    if rule.mode == "constant" and rule.sigma > (top := constant_sigma_bound(rule)):
        raise ValueError(
            f"sigma={rule.sigma} is above its bound sigma_max over {rule.steps} steps: "
            f"valid [0, {top:.4g}]"
        )
