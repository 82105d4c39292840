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


class GammaOfAlpha:
    """The inverse map: the gamma at which the Gaussian latent's argmax has a given alpha, read
    from a float64 table over a range wide enough for any alpha in [1e-4, 1 - 1e-4] at any
    realistic support size (linear interpolation in alpha). Distillation uses it to put the
    Gaussian pair on the udm schedule's own times."""

    def __init__(self, n_support: int, low: float = -24.0, high: float = 24.0, points: int = 8193):
        grid = torch.linspace(low, high, points, dtype=torch.float64)
        alphas = argmax_alpha(grid, n_support)[0]
        # drop saturated repeats, and alpha outside (0, 1), which the quadrature's last digit
        # can reach where the map is flat
        keep = torch.cat([torch.tensor([True]), alphas.diff() < 0]) & (alphas > 0) & (alphas < 1)
        # ascending alpha for interpolation
        self.alpha, self.grid = alphas[keep].flip(0), grid[keep].flip(0)

    def __call__(self, alpha: torch.Tensor) -> torch.Tensor:
        alpha = alpha.to(torch.float64).cpu()
        if bool((alpha <= self.alpha[0]).any() | (alpha >= self.alpha[-1]).any()):
            raise ValueError("alpha outside the invertible range of the Gaussian map")
        right = torch.searchsorted(self.alpha, alpha).clamp(1, len(self.alpha) - 1)
        left = right - 1
        frac = (alpha - self.alpha[left]) / (self.alpha[right] - self.alpha[left])
        return self.grid[left] + frac * (self.grid[right] - self.grid[left])


def row_normals(
    seeds: torch.Tensor, positions: torch.Tensor, n_support: int, device: torch.device | str
) -> torch.Tensor:
    """Standard-normal draws [n, N] for the True ``positions`` [B, L] (row-major), each row's
    from its own seed on ``device``: the same for any split of the batch into micro-batches or
    processes, and no [B, L, N] tensor on the host."""
    draws = []
    for row, seed in enumerate(seeds.tolist()):
        generator = torch.Generator(device=device).manual_seed(int(seed))
        full = torch.randn((positions.shape[1], n_support), generator=generator, device=device)
        draws.append(full[positions[row].to(device)])
    return torch.cat(draws)


def coupled_states(
    clean: torch.Tensor, gamma_t: torch.Tensor, gamma_s: torch.Tensor, eps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(z_t, z_s) support indices from one Gaussian noise ``eps`` [n, N] at two noise levels
    (Duo's distillation pairs): each is a uniform-state sample at its own alpha, and the pair is
    coupled through eps, so z_s = z_t when gamma_s = gamma_t and they rarely differ when close."""
    n_support = eps.shape[-1]
    z_t = gaussian_latents(clean, gamma_t, n_support, eps).argmax(-1)
    z_s = gaussian_latents(clean, gamma_s, n_support, eps).argmax(-1)
    return z_t, z_s
