"""Exact sampler distributions on a tiny hidden Markov language: one token per step with the exact
denoiser is exact (KL 0), parallel steps are not and improve with more steps, and the exact q
matches the frequencies of the project's real samplers run with the same exact model; the
uniform-state sampler approaches the language with steps only with the denoiser its NELBO trains
(the own noisy token left out)."""

import math
import types
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

from arlm.generate import ARGenerator
from arlm.generation_types import GenerationConfig
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral, FixedCount, Threshold
from dllm.uniform.sampler import UniformSamplerConfig
from eval.experiments.exact_frontier_setup import symbol_tokenizer
from eval.synthetic.exact.chain import symbol_posteriors
from eval.synthetic.exact.denoisers import exact_denoiser
from eval.synthetic.exact.frontier import sampler_distribution, sampler_error
from eval.synthetic.exact.outcomes import outcome
from eval.synthetic.likelihood import symbol_ids
from eval.synthetic.samples import NOT_A_SYMBOL, sample_metrics
from shared.data.synthetic.hmm import HMMLanguage
from shared.data.synthetic.pcfg import PCFGLanguage
from shared.errors import ConfigError
from shared.sampling import SamplingConfig
from shared.tokenizer import Tokenizer

TOK = Tokenizer.byte()
G = 4  # generation length: the longest string (3) and its EOS
BD = {"objective": "bd", "train_config": {"block_size": 2, "schedule": "linear"}}


def error(family, language, config, gen_length=G, **kw):
    model = exact_denoiser(family, language, TOK, gen_length + 1)
    return sampler_error(family, model, language, TOK, config, gen_length, **kw)


def test_one_token_per_step_is_exact(language) -> None:
    cases = [
        ("ar", GenerationConfig(), G, {}),
        ("mdm", SamplerConfig(FixedCount(G, remasking="random")), G, {}),
        # the bd grid of a 6-position canvas: [BOS, x1], [x2, x3], [x4, x5]: one per step
        ("bd", SamplerConfig(FixedCount(6, remasking="random")), 5, {"state": BD}),
    ]
    for family, config, gen_length, kw in cases:
        result = error(family, language, config, gen_length, **kw)
        assert abs(result["kl_qp"]) < 1e-9 and abs(result["kl_pq"]) < 1e-9, family
        assert result["tv"] < 1e-9 and result["dropped"] < 1e-12


def test_parallel_steps_cost_and_more_steps_help(language) -> None:
    kl = {}
    for steps in (1, 2, 4):
        result = error("mdm", language, SamplerConfig(FixedCount(steps, remasking="random")))
        kl[steps] = result["kl_pq"]
    assert kl[1] > kl[2] > kl[4] and kl[4] < 1e-9 and kl[2] > 1e-3
    # with one token per step, the confident-first order is not the model's joint: biased
    low = error("mdm", language, SamplerConfig(FixedCount(G, remasking="low_confidence")))
    assert low["kl_pq"] > 1e-3
    ancestral = [error("mdm", language, SamplerConfig(Ancestral(s)))["tv"] for s in (2, 8, 32)]
    assert ancestral[0] > ancestral[1] > ancestral[2]


def test_uniform_state_approaches_the_language_with_steps(language) -> None:
    """Exact: the chain of the real sampler. Not exact at any finite step count: each step draws
    the positions independently (and z_1 is uniform where alpha_1 = 1e-3 keeps a little of the
    data), so KL(p||q) and the TV only shrink with steps, about as 1/steps."""
    tv = [error("udm", language, UniformSamplerConfig(steps=s))["tv"] for s in (1, 4, 16, 64)]
    assert tv[0] > tv[1] > tv[2] > tv[3] and tv[3] < 0.01 and tv[2] / tv[3] > 2.5


def test_uniform_state_with_the_own_token_counted_twice_stalls(language, tmp_path) -> None:
    """The control of the uniform denoiser's definition, on a tokenizer of the symbols, EOS and
    PAD only (where every noisy token looks like data): the exact denoiser approaches the
    language as steps grow; fed p(x0_i | z_t) (own noisy token in) instead, the same sampler
    stalls far from it."""
    symbols = Tokenizer.from_hf(symbol_tokenizer(tmp_path, language.alphabet))

    def tv(model, steps):
        config = UniformSamplerConfig(steps=steps)
        return sampler_error("udm", model, language, symbols, config, G)["tv"]

    exact = exact_denoiser("udm", language, symbols, G + 1)
    twice = exact_denoiser("udm", language, symbols, G + 1)
    twice.row_logits = types.MethodType(posterior_with_own_token, twice)
    right, wrong = [tv(exact, s) for s in (16, 64)], [tv(twice, s) for s in (16, 64)]
    assert right[0] > right[1] and right[1] < 0.01
    assert wrong[1] > 0.9 * wrong[0] and wrong[1] > 10 * right[1]


def posterior_with_own_token(self, row, time):
    probs = symbol_posteriors(self.chain, self.channel_likelihood(row, time))
    return torch.cat([self.to_logits(None, 1), self.to_logits(probs, len(row) - 1)])


def empirical(samples, q, n):
    keys = sorted(q, key=str)
    counts = Counter(samples)
    assert set(counts) <= set(keys)  # no sample the exact q calls impossible
    observed = [counts[k] for k in keys]
    expected = [q[k] * n for k in keys]
    return stats.chisquare(observed, expected).pvalue


def diffusion_samples(family, language, config, gen_length, state, n):
    model = exact_denoiser(family, language, TOK, gen_length + 1)
    engine = DiffusionGenerator(model, TOK, state)
    kv = {"kv_cache": False} if family == "bd" else {}
    result = engine.generate([[]] * n, gen_length, config, seed=7, **kv)
    symbols = dict(zip(symbol_ids(language, TOK), language.alphabet))
    q = sampler_distribution(family, model, language, TOK, config, gen_length, state=state).q
    return [outcome(row + [TOK.eos_id], symbols, TOK.eos_id) for row in result.tokens], q


@pytest.mark.parametrize(
    "family,config,gen_length,state",
    [
        ("mdm", SamplerConfig(FixedCount(2, remasking="low_confidence")), G, None),
        ("mdm", SamplerConfig(FixedCount(2, remasking="random")), G, None),
        ("mdm", SamplerConfig(Threshold(0.5)), G, None),
        ("mdm", SamplerConfig(Ancestral(3)), G, None),
        ("bd", SamplerConfig(FixedCount(3)), 5, BD),
        ("udm", UniformSamplerConfig(steps=2), G, {"objective": "udm"}),
    ],
)
def test_exact_q_matches_the_real_sampler(language, family, config, gen_length, state) -> None:
    n = 3000
    samples, q = diffusion_samples(family, language, config, gen_length, state, n)
    assert empirical(samples, q, n) > 1e-4


def test_exact_q_matches_ar_decoding_with_truncation(language) -> None:
    n = 3000
    model = exact_denoiser("ar", language, TOK, G + 1)
    sampling = SamplingConfig(temperature=0.7, top_k=2)
    config = GenerationConfig(max_new_tokens=G, sampling=sampling, use_cache=False)
    result = ARGenerator(model, TOK).generate([[TOK.eos_id]] * n, config, seed=3)
    symbols = dict(zip(symbol_ids(language, TOK), language.alphabet))
    samples = [outcome(row, symbols, TOK.eos_id) for row in result.tokens]
    q = sampler_distribution("ar", model, language, TOK, config, G).q
    assert empirical(samples, q, n) > 1e-4
    assert error("ar", language, config)["kl_qp"] > 1e-3  # a tempered sampler is not p


def test_refusals(language) -> None:
    mdm = exact_denoiser("mdm", language, TOK, G + 1)
    with pytest.raises(ConfigError, match="no exact denoiser.*only the hmm"):
        sampler_error("mdm", mdm, PCFGLanguage(), TOK, SamplerConfig(FixedCount(4)), G)
    big = HMMLanguage(vocab=4, max_len=10)
    with pytest.raises(ConfigError, match="too large to enumerate.*limit.*sample-based"):
        sampler_error("mdm", mdm, big, TOK, SamplerConfig(FixedCount(4)), 11)
    with pytest.raises(ConfigError, match="takes a UniformSamplerConfig"):
        sampler_error("udm", mdm, language, TOK, SamplerConfig(FixedCount(4)), G)
    with pytest.raises(ConfigError, match="approximate cache"):
        sampler_error(
            "mdm", mdm, language, TOK, SamplerConfig(FixedCount(4), cache="approx_dual"), G
        )
    with pytest.raises(ConfigError, match="multiple of the number of blocks"):
        sampler_error("bd", mdm, language, TOK, SamplerConfig(FixedCount(4)), G, state=BD)
    with pytest.raises(ConfigError, match="gen_length=2 cannot hold"):
        sampler_error("mdm", mdm, language, TOK, SamplerConfig(FixedCount(2)), 2)
    assert torch.is_tensor(mdm.anchor)


@pytest.mark.parametrize("n", [40, 2000])
def test_the_sample_based_estimates_against_the_exact_values(language, n) -> None:
    """For languages too large to enumerate, distances come from samples; their bias, checked
    here against the exact q of a two-tokens-per-step MDM: the plug-in TV lies between the
    exact TV and TV plus its stated bound on average, and the plug-in KL(q_hat||p) is biased
    upward by about (distinct strings - 1) / (2 n)."""
    model = exact_denoiser("mdm", language, TOK, G + 1)
    config = SamplerConfig(FixedCount(2, remasking="random"))
    dist = sampler_distribution("mdm", model, language, TOK, config, G)
    exact = sampler_error("mdm", model, language, TOK, config, G)
    # an invalid sample (None in q) as a string no language holds
    strings = [NOT_A_SYMBOL if s is None else s for s in dist.q]
    probs = np.array(list(dist.q.values()))
    assert dist.q.get(None, 0.0) > 0.01  # parallel steps make some invalid rows: counted too
    rng = np.random.default_rng(0)
    draws = 200
    tv, kl, bound = [], [], []
    for _ in range(draws):
        samples = [strings[i] for i in rng.choice(len(strings), size=n, p=probs / probs.sum())]
        metrics = sample_metrics(language, samples)
        tv.append(metrics["tv_plugin"])
        kl.append(metrics["kl_plugin"])
        bound.append(metrics["tv_plugin_bias_bound"])
    spread = np.std(tv) / np.sqrt(draws)
    assert exact["tv"] - 3 * spread <= np.mean(tv) <= exact["tv"] + np.mean(bound) + 3 * spread
    assert np.mean(tv) - exact["tv"] > 3 * spread  # the bias is there, upward
    # the plug-in KL is over the valid samples only (KL(q||p) itself is infinite here): against
    # the exact KL of q given a valid sample, biased upward by about (distinct - 1) / (2 n_valid)
    valid = {s: v for s, v in dist.q.items() if dist.p.get(s, 0.0) > 0}
    total = sum(valid.values())
    kl_valid = sum(v / total * math.log(v / total / dist.p[s]) for s, v in valid.items())
    expected_bias = (len(valid) - 1) / (2 * n * total)
    if n >= 1000:  # the (distinct - 1) / (2 n) term is the first order of a large-n expansion
        assert np.mean(kl) - kl_valid == pytest.approx(expected_bias, rel=0.3)


def test_the_plugin_tv_is_the_distance_over_every_string(language) -> None:
    """tv_plugin by brute force: half the sum of |q_hat - p| over every string of the language
    and every sampled string (the never-sampled strings' p included, an invalid sample whole)."""
    samples = ["ab", "ab", "b", NOT_A_SYMBOL, "ba", "ab"]
    p = {s: math.exp(lp) for s, lp in language.enumerate()}
    q_hat = {s: samples.count(s) / len(samples) for s in set(samples)}
    brute = sum(abs(q_hat.get(s, 0.0) - p.get(s, 0.0)) for s in set(p) | set(q_hat)) / 2
    assert sample_metrics(language, samples)["tv_plugin"] == pytest.approx(brute, abs=1e-12)
