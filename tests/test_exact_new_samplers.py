"""The exact programs (eval/synthetic/exact/) on the new samplers: the entropy-bounded sampler's
exact q (gamma = 0 is the one-token-per-step low-confidence sampler's q, and the real sampler's
frequencies follow the exact q at a larger gamma), the Psi-samplers' exact q (kappa = 1 is the
ancestral q; the loop's q matches the real sampler), and ReMDM refused in one line."""

import dataclasses
from collections import Counter

import pytest
from scipy import stats

from dllm.generator import DiffusionGenerator
from dllm.remdm import Remdm
from dllm.sampler import SamplerConfig
from dllm.strategies import EntropyBounded, FixedCount
from dllm.uniform.sampler import UniformSamplerConfig
from eval.synthetic.exact.denoisers import exact_denoiser
from eval.synthetic.exact.frontier import sampler_distribution
from eval.synthetic.exact.outcomes import outcome
from eval.synthetic.likelihood import symbol_ids
from shared.errors import ConfigError
from shared.tokenizer import Tokenizer

TOK = Tokenizer.byte()
G = 4


def exact_q(family, language, config, state=None) -> dict:
    model = exact_denoiser(family, language, TOK, G + 1)
    return sampler_distribution(family, model, language, TOK, config, G, state=state).q


def same(q1: dict, q2: dict) -> bool:
    return all(abs(q1.get(k, 0.0) - q2.get(k, 0.0)) < 1e-12 for k in set(q1) | set(q2))


def real_frequencies_match(family, language, config, state, n=3000) -> float:
    model = exact_denoiser(family, language, TOK, G + 1)
    result = DiffusionGenerator(model, TOK, state).generate([[]] * n, G, config, seed=11)
    symbols = dict(zip(symbol_ids(language, TOK), language.alphabet))
    counts = Counter(outcome(row + [TOK.eos_id], symbols, TOK.eos_id) for row in result.tokens)
    q = sampler_distribution(family, model, language, TOK, config, G, state=state).q
    keys = sorted(q, key=str)
    assert set(counts) <= set(keys)  # no sample the exact q calls impossible
    expected = [q[k] * n for k in keys]
    return stats.chisquare([counts[k] for k in keys], expected).pvalue


def test_eb_at_gamma_zero_is_the_one_token_per_step_confidence_sampler(language):
    eb = exact_q("mdm", language, SamplerConfig(EntropyBounded(0.0)))
    fixed = exact_q("mdm", language, SamplerConfig(FixedCount(G, "low_confidence")))
    assert same(eb, fixed)
    wide = exact_q("mdm", language, SamplerConfig(EntropyBounded(5.0)))
    assert not same(wide, fixed)


def test_eb_exact_q_matches_the_real_sampler(language):
    assert real_frequencies_match("mdm", language, SamplerConfig(EntropyBounded(0.6)), None) > 1e-4


def test_psi_exact_q(language):
    udm = {"objective": "udm"}
    plain = exact_q("udm", language, UniformSamplerConfig(steps=4), udm)
    cap_zero = exact_q("udm", language, UniformSamplerConfig(steps=4, psi="cap", eta=0.0), udm)
    assert same(plain, cap_zero)
    loop = UniformSamplerConfig(steps=8, psi="loop", eta=0.05, t_on=0.7, t_off=0.2)
    held = exact_q("udm", language, dataclasses.replace(loop, eta=0.0), udm)
    corrected = exact_q("udm", language, loop, udm)
    assert not same(plain, held) and not same(held, corrected)  # the times, then kappa
    assert real_frequencies_match("udm", language, loop, udm) > 1e-4


def test_remdm_is_refused_by_the_exact_program(language):
    with pytest.raises(ConfigError, match="the exact program does not run ReMDM"):
        exact_q("mdm", language, SamplerConfig(Remdm(4, mode="cap", eta=0.1)))
