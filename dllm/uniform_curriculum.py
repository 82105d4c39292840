"""Duo's Gaussian relaxation of uniform-state diffusion: the math of the training curriculum.

Each scored token x gets a Gaussian latent over the support, w = a onehot(x) + s eps with
eps ~ N(0, I_N), a^2 = sigmoid(-gamma) and s^2 = sigmoid(gamma). Its argmax is a uniform-state
noised token: every wrong index wins with the same chance, so argmax(w) ~ Cat(alpha x +
(1 - alpha) / N) for the alpha that makes the clean index win with probability

    P(argmax w = x) = integral phi(z) Phi(z + r)^(N - 1) dz,   r = a / s = exp(-gamma / 2),

(the clean coordinate is a + s z; each of the N - 1 others must fall below it), i.e.
alpha = (N P - 1) / (N - 1). The curriculum trains on z_t = argmax(w) with this alpha in the
udm NELBO, while the network sees the soft token softmax(w / tau) @ E rather than the hard one:
at small tau the two agree except where the latent is nearly tied, which is where the soft input
carries the information that lowers the gradient's variance (Sahoo et al. 2025, "The Diffusion
Duality"). gamma moves linearly with t over [gamma_min, gamma_max], so d alpha / dt =
(gamma_max - gamma_min) d alpha / d gamma; both come from ``AlphaMap``, a table computed once per
support size by numerical integration in float64.
"""

from __future__ import annotations

import math

import torch

# Duo's released curriculum (configs/algo/duo.yaml): gamma over [-3.5, -1.75].
GAMMA_MIN = -3.5
GAMMA_MAX = -1.75
TAU = 1e-3

# The integration grid: the integrand is phi(z) times a CDF power, negligible beyond |z| = 12;
# on a smooth integrand decaying at both ends the trapezoid rule converges far faster than h^2.
_Z = torch.linspace(-12.0, 12.0, 4801, dtype=torch.float64)
_DZ = float(_Z[1] - _Z[0])
_LOG_PHI = -0.5 * _Z**2 - 0.5 * math.log(2 * math.pi)


def argmax_alpha(gamma: torch.Tensor, n_support: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(alpha, d alpha / d gamma) of the Gaussian latent at each ``gamma`` (float64), by
    integrating over the clean coordinate's standard-normal z. The derivative is integrated
    too (d/dr of Phi(z + r)^(N - 1) is (N - 1) Phi^(N - 2) phi(z + r)), not differenced."""
    gamma = torch.as_tensor(gamma, dtype=torch.float64)
    flat = gamma.reshape(-1)
    r = torch.exp(-flat / 2)[:, None]
    shifted = _Z[None, :] + r
    log_cdf = torch.special.log_ndtr(shifted)
    others = n_support - 1
    p = (torch.exp(_LOG_PHI + others * log_cdf).sum(-1)) * _DZ
    log_pdf = -0.5 * shifted**2 - 0.5 * math.log(2 * math.pi)
    dp_dr = others * torch.exp(_LOG_PHI + (others - 1) * log_cdf + log_pdf).sum(-1) * _DZ
    scale = n_support / (n_support - 1)
    alpha = scale * p - 1.0 / (n_support - 1)
    dalpha = scale * dp_dr * (-r[:, 0] / 2)  # dr / dgamma = -r / 2
    return alpha.reshape(gamma.shape), dalpha.reshape(gamma.shape)


class AlphaMap:
    """``argmax_alpha`` tabulated once over [gamma_min, gamma_max] (``points`` values, float64)
    and read by linear interpolation; gamma outside the range is an error, not a clip."""

    def __init__(self, n_support: int, gamma_min: float, gamma_max: float, points: int = 2049):
        if not gamma_min < gamma_max:
            raise ValueError(f"gamma range [{gamma_min}, {gamma_max}] must be increasing")
        self.n_support, self.gamma_min, self.gamma_max = n_support, gamma_min, gamma_max
        self.grid = torch.linspace(gamma_min, gamma_max, points, dtype=torch.float64)
        self.alpha, self.dalpha = argmax_alpha(self.grid, n_support)

    def __call__(self, gamma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gamma = gamma.to(torch.float64).cpu()
        span = self.gamma_max - self.gamma_min
        slack = 1e-9 * span
        if bool((gamma < self.gamma_min - slack).any() | (gamma > self.gamma_max + slack).any()):
            raise ValueError(f"gamma outside the tabulated [{self.gamma_min}, {self.gamma_max}]")
        position = (gamma - self.gamma_min) / span * (len(self.grid) - 1)
        low = position.floor().long().clamp(0, len(self.grid) - 2)
        frac = position - low
        pick = lambda table: table[low] * (1 - frac) + table[low + 1] * frac  # noqa: E731
        return pick(self.alpha), pick(self.dalpha)

    def gamma(self, t: torch.Tensor) -> torch.Tensor:
        """gamma at diffusion time t in [0, 1] (linear)."""
        return self.gamma_min + t.to(torch.float64) * (self.gamma_max - self.gamma_min)


def gaussian_latents(
    clean: torch.Tensor, gamma: torch.Tensor, n_support: int, eps: torch.Tensor
) -> torch.Tensor:
    """w = a onehot(clean) + s eps per position: ``clean`` [n] support indices, ``gamma`` [n],
    ``eps`` [n, N] standard normal draws (their dtype is the latent's)."""
    gamma = gamma.to(eps.dtype)[:, None]
    scale_clean, scale_noise = torch.sigmoid(-gamma).sqrt(), torch.sigmoid(gamma).sqrt()
    onehot = torch.nn.functional.one_hot(clean, n_support).to(eps.dtype)
    return scale_clean * onehot + scale_noise * eps
