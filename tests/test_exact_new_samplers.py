"""The exact programs (eval/synthetic/exact/) on the new samplers: the entropy-bounded sampler's
exact q (gamma = 0 is exact with the exact denoiser, the positive control, and the real sampler's
frequencies follow the exact q at a larger gamma), the Psi-samplers' exact q (kappa = 1 is the
ancestral q; the loop's q matches the real sampler), ReMDM's exact q (sigma = 0 is the ancestral
q, the real sampler follows it; "conf" refused in one line) and the expected model calls."""

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
from eval.synthetic.exact.outcomes import language_distribution, outcome
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
    options = {"kv_cache": False} if family == "bd" else {}  # the exact denoiser has no cache
    result = DiffusionGenerator(model, TOK, state).generate([[]] * n, G, config, seed=11, **options)
    symbols = dict(zip(symbol_ids(language, TOK), language.alphabet))
    counts = Counter(outcome(row + [TOK.eos_id], symbols, TOK.eos_id) for row in result.tokens)
    q = sampler_distribution(family, model, language, TOK, config, G, state=state).q
    assert set(counts) <= set(q)  # no sample the exact q calls impossible
    # outcomes expected fewer than 5 times share one bin (the chi-square needs counts)
    big = sorted((k for k in q if q[k] * n >= 5), key=str)
    observed = [counts[k] for k in big] + [n - sum(counts[k] for k in big)]
    expected = [q[k] * n for k in big] + [n * (1.0 - sum(q[k] for k in big))]
    if expected[-1] < 1e-9:  # nothing left over
        observed, expected = observed[:-1], expected[:-1]
    return stats.chisquare(observed, expected, sum_check=False).pvalue


def test_eb_at_gamma_zero_is_exact_with_the_exact_denoiser(language):
    """One token per step in an order read from the predictions: the positive control."""
    eb = exact_q("mdm", language, SamplerConfig(EntropyBounded(0.0)))
    assert same(eb, language_distribution(language))
    wide = exact_q("mdm", language, SamplerConfig(EntropyBounded(5.0)))
    assert not same(wide, eb)
    # ranked by the drawn token's probability instead, one per step is not exact
    drawn = exact_q("mdm", language, SamplerConfig(FixedCount(G, "low_confidence")))
    assert not same(drawn, eb)


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


def test_remdm_exact_q(language):
    """sigma = 0 is the ancestral sampler's q; remasking changes it, and the real sampler's
    frequencies follow the exact q of the cap and loop modes, in the block family too."""
    from dllm.strategies import Ancestral

    plain = exact_q("mdm", language, SamplerConfig(Ancestral(4, schedule="linear")))
    zero = exact_q("mdm", language, SamplerConfig(Remdm(4, mode="cap", eta=0.0, schedule="linear")))
    assert same(plain, zero)
    cap = SamplerConfig(Remdm(6, mode="cap", eta=0.3, schedule="linear"))
    assert not same(
        exact_q("mdm", language, cap),
        exact_q(
            "mdm", language, dataclasses.replace(cap, strategy=Ancestral(6, schedule="linear"))
        ),
    )
    assert real_frequencies_match("mdm", language, cap, None) > 1e-4
    loop = SamplerConfig(Remdm(8, mode="loop", eta=0.1, t_on=0.6, t_off=0.2, alpha_on=0.8))
    assert real_frequencies_match("mdm", language, loop, None) > 1e-4
    bd = {"objective": "bd", "train_config": {"block_size": 2}}
    assert real_frequencies_match("bd", language, cap, bd) > 1e-4


def test_remdm_with_many_steps_corrects_the_exact_sampler(language):
    """With the exact denoiser, 3 ancestral steps are wrong (several tokens per step); the
    loop's 12 steps (corrector steps at fixed noise among them) are closer to p, and a
    corrector calls the model at every step."""
    from dllm.strategies import Ancestral

    p = language_distribution(language)
    tv = lambda q: 0.5 * sum(abs(q.get(k, 0) - p.get(k, 0)) for k in set(q) | set(p))  # noqa: E731
    plain = tv(exact_q("mdm", language, SamplerConfig(Ancestral(3, schedule="linear"))))
    model = exact_denoiser("mdm", language, TOK, G + 1)
    config = SamplerConfig(Remdm(12, mode="loop", eta=0.25, t_on=0.9, t_off=0.1, alpha_on=0.8))
    dist = sampler_distribution("mdm", model, language, TOK, config, G)
    assert dist.calls == pytest.approx(12.0)  # a corrector runs every step
    assert tv(dist.q) < plain


def test_remdm_conf_is_refused_by_the_exact_program(language):
    with pytest.raises(ConfigError, match="remdm mode 'conf' is refused by the exact program"):
        exact_q("mdm", language, SamplerConfig(Remdm(4, mode="conf")))


def test_expected_calls_of_the_open_ended_samplers(language):
    """One call per step while anything is masked: a fixed count takes its steps, EB at
    gamma = 0 one per position, a wide budget fewer."""
    model = exact_denoiser("mdm", language, TOK, G + 1)

    def calls(config):
        return sampler_distribution("mdm", model, language, TOK, config, G).calls

    assert calls(SamplerConfig(FixedCount(3))) == pytest.approx(3.0)
    assert calls(SamplerConfig(EntropyBounded(0.0))) <= G + 1e-9
    assert calls(SamplerConfig(EntropyBounded(5.0))) < calls(SamplerConfig(EntropyBounded(0.0)))
