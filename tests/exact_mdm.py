"""Exact reference computations for masked diffusion on tiny vocabularies, shared by tests."""

import itertools
import math

import torch
from scipy import integrate
from torch import nn


class TableDenoiser(nn.Module):
    """A fixed arbitrary denoiser: logits looked up from the whole noised row."""

    def __init__(self, vocab: int, length: int, seed: int = 0, table: torch.Tensor | None = None):
        super().__init__()
        self.base = vocab + 1  # token ids plus [MASK]
        self.length = length
        g = torch.Generator().manual_seed(seed)
        self.table = (
            table
            if table is not None
            else 2 * torch.randn(self.base**length, length, vocab + 1, generator=g)
        )

    def index(self, tokens: torch.Tensor) -> torch.Tensor:
        powers = self.base ** torch.arange(self.length)
        return (tokens * powers).sum(-1)

    def forward(self, tokens, attention, output_mask=None):
        logits = self.table[self.index(tokens)]
        return logits if output_mask is None else logits[output_mask]


def exact_nelbo(model: TableDenoiser, row: list[int], vocab: int, schedule, t_low: float) -> float:
    """E over t ~ U[t_low, 1] and the masking of w(t) * sum_masked -log p(x_i | x_t), by
    enumerating every mask pattern of the content positions and integrating t numerically."""
    content = list(range(1, len(row)))
    terms = []  # (number masked, summed cross-entropy)
    for pattern in itertools.product([False, True], repeat=len(content)):
        masked = [pos for pos, m in zip(content, pattern) if m]
        if not masked:
            continue
        noised = torch.tensor([vocab if i in masked else tok for i, tok in enumerate(row)])
        log_probs = torch.log_softmax(model.table[model.index(noised)][:, :vocab].double(), -1)
        terms.append((len(masked), -sum(float(log_probs[i, row[i]]) for i in masked)))

    def integrand(t: float) -> float:
        tt = torch.tensor([t], dtype=torch.float64)
        p_mask = 1 - float(schedule.alpha(tt))
        weight = float(schedule.loss_weight(tt))
        n = len(content)
        return weight * sum(p_mask**k * (1 - p_mask) ** (n - k) * ce for k, ce in terms)

    value, _ = integrate.quad(integrand, t_low, 1.0, limit=200)
    return value / (1.0 - t_low)


def true_posterior_denoiser(probs: dict[tuple[int, ...], float], vocab: int) -> TableDenoiser:
    """The optimal denoiser of a data distribution over rows [BOS, x1, ..., xn]: at each masked
    position, log of the posterior marginal of the clean token given the visible tokens."""
    length = len(next(iter(probs))) + 1
    model = TableDenoiser(vocab, length)
    table = torch.full_like(model.table, -1e9)
    for noised in itertools.product(range(vocab + 1), repeat=length - 1):
        row = (0, *noised)
        consistent = {
            x: p for x, p in probs.items() if all(v == vocab or v == xv for v, xv in zip(noised, x))
        }
        total = sum(consistent.values())
        if total == 0:
            continue
        index = int(model.index(torch.tensor(row)))
        for position, v in enumerate(noised, start=1):
            if v != vocab:
                continue
            for token in range(vocab):
                mass = sum(p for x, p in consistent.items() if x[position - 1] == token)
                table[index, position, token] = math.log(mass / total) if mass > 0 else -1e9
    model.table = table
    return model
