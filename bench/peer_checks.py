"""The checks ``bench/peer_samplers.py`` makes before it times a peer: that the two
implementations do the same thing.

- Fast-dLLM: the same tokens (``first_difference``).
- Duo: tokens cannot be identical (Duo draws from the global RNG by Gumbel-max, we draw per row
  by inverse CDF), so the step itself: Duo's posterior and ours from the same x_theta, z_t,
  alpha_t and alpha_s at every step of one trajectory (``posterior_gap``).
- bd3lms: tokens cannot be identical either, so the distribution: draws from both samplers on a
  tiny model against the exact first-hitting distribution of one block, by enumeration
  (``first_hitting_check``, chi-square).
"""

from __future__ import annotations

from typing import Any

import numpy
import peer_adapters
import torch
from scipy.stats import chisquare

from dllm.block.objective import block_causal_mask
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount
from dllm.uniform.objective import alpha
from dllm.uniform.sampler import posterior
from shared.config import ModelConfig
from shared.model import Transformer
from shared.sampling import sample_categorical

BOS = peer_adapters.BOS


# ---------------------------------------------------------------- Fast-dLLM


def first_difference(ours: torch.Tensor, theirs: torch.Tensor) -> int | None:
    """Index of the first generated position where two [1, G] token rows differ (None: equal)."""
    if ours.shape != theirs.shape:
        raise ValueError(f"shapes differ: {tuple(ours.shape)} vs {tuple(theirs.shape)}")
    differ = (ours != theirs).flatten().nonzero()
    return int(differ[0]) if len(differ) else None


# ---------------------------------------------------------------- Duo

POSTERIOR_TOLERANCE = 1e-12  # float64 rounding of one formula written two ways


@torch.no_grad()
def posterior_gap(duo_sampler, network, length: int, batch: int, steps: int) -> float:
    """Largest |Duo's posterior - ours| over one trajectory of ``steps`` steps from Duo's prior:
    both from the same x_theta (our model's), z_t, alpha_t and alpha_s, at every step (the last
    one to s = 0); z_s is drawn from ours to go on. x_theta is renormalised in float64 first:
    Duo's formula divides by a normaliser that assumes x_theta sums to 1 (ours normalises
    explicitly), and exp(float32 log-softmax) sums to 1 only to float32 rounding, which would
    show as differences of about 1e-8 that are not the step's."""
    torch.manual_seed(0)
    z = duo_sampler.prior_sample(batch, length)
    draws = torch.Generator().manual_seed(0)
    gap = 0.0
    for k in range(steps, 0, -1):
        t, s = k / steps, (k - 1) / steps
        alpha_t, alpha_s = (
            alpha(torch.full((batch, 1), v, dtype=torch.float64, device=z.device)) for v in (t, s)
        )
        sigma = duo_sampler._sigma_from_alphat(alpha_t.float())
        x_theta = network(z, sigma).to(torch.float64).exp()
        x_theta = x_theta / x_theta.sum(-1, keepdim=True)
        theirs = duo_sampler._posterior_from_x0(x0=x_theta, xt=z, alpha_s=alpha_s, alpha_t=alpha_t)
        ours = posterior(x_theta.flatten(0, 1), z.flatten(), t, s)
        gap = max(gap, float((theirs.flatten(0, 1) - ours).abs().max()))
        z = sample_categorical(ours.cpu(), draws).view(batch, length).to(z.device)
    return gap


# ---------------------------------------------------------------- bd3lms

FIRST_HITTING_SAMPLES = 2000  # draws per sampler for the distribution check
CHECK_P_VALUE = 1e-3  # below this the sampler does not draw the first-hitting distribution


def block_probabilities(model: Transformer, tokens: torch.Tensor, block_size: int) -> torch.Tensor:
    """p(x0) [L, V] (float64, [MASK] excluded) of one canvas row under the block-causal mask."""
    mask = block_causal_mask(len(tokens), block_size, tokens.device)
    logits = model(tokens[None], attention=mask).view(len(tokens), -1)
    return torch.softmax(logits[:, :-1].double(), dim=-1)


@torch.no_grad()
def first_hitting_distribution(model: Transformer, row: list[int], block_size: int) -> dict:
    """The exact distribution of one block's completions under first-hitting sampling (one
    uniformly chosen masked position per step, its token drawn from p(x0) given the canvas so
    far), by enumerating every order and every token: {completed row (tuple): probability}.
    Only for tiny vocabularies and blocks."""
    mask_id = model.config.vocab_size - 1
    memo: dict[tuple[int, ...], dict] = {}

    def complete(canvas: tuple[int, ...]) -> dict:
        if canvas in memo:
            return memo[canvas]
        masked = [i for i, token in enumerate(canvas) if token == mask_id]
        if not masked:
            return {canvas: 1.0}
        probs = block_probabilities(model, torch.tensor(canvas), block_size)
        result: dict = {}
        for i in masked:
            for token, p in enumerate(probs[i].tolist()):
                filled = canvas[:i] + (token,) + canvas[i + 1 :]
                for final, q in complete(filled).items():
                    result[final] = result.get(final, 0.0) + q * p / len(masked)
        memo[canvas] = result
        return result

    return complete(tuple(row))


def chi_square_p(counts: dict, exact: dict) -> float:
    """p-value of observed ``counts`` against ``exact`` probabilities (cells with fewer than 5
    expected draws pooled into one)."""
    total = sum(counts.values())
    observed, expected, pooled = [], [], [0.0, 0.0]
    for cell, p in exact.items():
        if p * total >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(p * total)
        else:
            pooled[0] += counts.get(cell, 0)
            pooled[1] += p * total
    if pooled[1] > 0:
        observed.append(pooled[0])
        expected.append(pooled[1])
    if set(counts) - set(exact):
        return 0.0  # a completion the exact distribution gives no mass
    return float(chisquare(observed, expected).pvalue)


def peaked_model(vocab_size: int, max_seq_len: int, tie_embeddings: bool = False) -> Transformer:
    """A small random model with large weights (N(0, 0.5) matrices), seeded: its predictions are
    peaked, unlike a default-initialised model's, so sampling orders and thresholds matter."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=vocab_size, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                         hidden_dim=64, max_seq_len=max_seq_len,
                         tie_embeddings=tie_embeddings)  # fmt: skip
    model = Transformer(config).eval()
    with torch.no_grad():
        for weight in model.parameters():
            if weight.ndim == 2:
                weight.normal_(0.0, 0.5)
    return model


def tiny_bd_model() -> Transformer:
    """Four tokens + [MASK], peaked predictions: the order matters."""
    return peaked_model(5, 16)


@torch.no_grad()
def first_hitting_check(bd3lms, samples: int | None = None) -> dict[str, Any]:
    """Both samplers against the exact first-hitting distribution of one block [BOS, M, M, M]
    of a tiny model: ``samples`` draws from each (default ``FIRST_HITTING_SAMPLES``),
    chi-square p-values."""
    samples = samples or FIRST_HITTING_SAMPLES
    model, block = tiny_bd_model(), 4
    mask_id = model.config.vocab_size - 1
    exact = first_hitting_distribution(model, [BOS] + [mask_id] * (block - 1), block)
    theirs_sampler = peer_adapters.bd3lms_sampler(bd3lms, model, block)
    torch.manual_seed(0)
    np_seed(0)
    theirs: dict = {}
    for _ in range(samples):
        tokens, _ = theirs_sampler._semi_ar_sampler(1, block, 1, block)
        cell = tuple(tokens[0].tolist())
        theirs[cell] = theirs.get(cell, 0) + 1
    state = {"objective": "bd", "train_config": {"block_size": block}}
    ours_generator = DiffusionGenerator(model, state=state, eos_id=BOS)
    canvas = ours_generator.prompt_canvas([[]] * samples, block - 1)
    config = SamplerConfig(FixedCount(block, remasking="random"))
    rows = ours_generator.fill(canvas, config, seed=0, eos="none").raw.tokens.tolist()
    ours: dict = {}
    for row in rows:
        ours[tuple(row)] = ours.get(tuple(row), 0) + 1
    return {"p_theirs": chi_square_p(theirs, exact), "p_ours": chi_square_p(ours, exact)}


def np_seed(seed: int) -> None:
    """bd3lms's first-hitting times come from numpy's global generator."""
    numpy.random.seed(seed)
