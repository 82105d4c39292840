"""Synthetic languages with exact probabilities, and the exact metrics built on them."""

import math
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

from arlm.objective import AutoregressiveObjective
from eval.likelihood import ar_nll
from eval.synthetic.likelihood import (
    TrueConditionalModel,
    UniformModel,
    language_rows,
    likelihood_gap,
)
from eval.synthetic.probes import (
    ar_complete,
    ar_prefix_infills,
    completion_metrics,
    completion_prefixes,
    infill_tasks,
    oracle_infills,
    prefix_log_prob,
    score_infills,
)
from eval.synthetic.report import synthetic_report
from eval.synthetic.samples import (
    ar_sample,
    monte_carlo_kl,
    sample_metrics,
    sample_text,
    valid_sample_metrics,
)
from shared.checkpoint import full_model_state, save_checkpoint
from shared.config import ModelConfig
from shared.data.corpus import load_corpus
from shared.data.synthetic.hmm import HMMLanguage
from shared.data.synthetic.pcfg import PCFGLanguage
from shared.data.synthetic.specs import build_language, parse_spec
from shared.data.synthetic.teacher import TeacherLanguage
from shared.model import Transformer


def tiny_languages():
    return [
        HMMLanguage(states=3, vocab=2, max_len=4, seed=1),
        PCFGLanguage(types=2, max_depth=2, children=(0.5, 0.3, 0.2), seed=3),
        TeacherLanguage(vocab=3, length=3, dim=8, layers=1, seed=2),
    ]


@pytest.mark.parametrize("language", tiny_languages(), ids=lambda lang: lang.name.split("(")[0])
def test_probabilities_sum_to_one_and_match_sampling(language) -> None:
    probs = {s: math.exp(lp) for s, lp in language.enumerate()}
    # the support is finite (length caps), so the mass is exactly 1 with no tail
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-12)
    for s, p in list(probs.items())[:20]:  # chain rule == specialised log_prob
        assert language.log_prob(s) == pytest.approx(math.log(p), abs=1e-9)
        assert language.is_valid(s)
    n = 20_000
    counts = Counter(language.sample(n, seed=7))
    assert set(counts) <= set(probs)
    # chi-square over strings, merging rare ones so every expected count is >= 5
    keys = sorted(probs, key=probs.get, reverse=True)
    observed, expected, rest_o, rest_e = [], [], 0, 0.0
    for s in keys:
        if probs[s] * n >= 5:
            observed.append(counts[s])
            expected.append(probs[s] * n)
        else:
            rest_o += counts[s]
            rest_e += probs[s] * n
    if rest_e > 0:
        observed.append(rest_o)
        expected.append(rest_e)
    assert stats.chisquare(observed, expected).pvalue > 1e-3


@pytest.mark.parametrize("language", tiny_languages(), ids=lambda lang: lang.name.split("(")[0])
def test_entropy_is_exact_and_matches_monte_carlo(language) -> None:
    exact = language.entropy()
    assert exact.exact
    logps = np.array([lp for _, lp in language.enumerate()])
    assert exact.nats_per_string == pytest.approx(float(-(np.exp(logps) * logps).sum()), abs=1e-9)
    lengths = np.array([len(s) for s, _ in language.enumerate()])
    assert exact.expected_length == pytest.approx(float((np.exp(logps) * lengths).sum()))
    mc = language.mc_entropy(4000, seed=1)
    assert abs(mc.nats_per_string - exact.nats_per_string) < 4 * mc.stderr


def test_default_languages_entropy_methods() -> None:
    # the default HMM is still exact (a vectorised forward pass over ~1.4M strings), the PCFG is
    # exact at any size, and the default teacher is too large: a labelled Monte-Carlo estimate
    hmm = build_language("synthetic:hmm")
    assert hmm.entropy().exact
    mc = hmm.mc_entropy(4000, seed=0)
    assert abs(mc.nats_per_string - hmm.entropy().nats_per_string) < 4 * mc.stderr
    pcfg = build_language("synthetic:pcfg")
    mc = pcfg.mc_entropy(4000, seed=0)
    assert abs(mc.nats_per_string - pcfg.entropy().nats_per_string) < 4 * mc.stderr
    teacher = TeacherLanguage(length=8)
    value = teacher.entropy(mc_samples=500)
    assert not value.exact and "monte carlo" in value.method and value.stderr > 0


def test_validity_checks() -> None:
    pcfg = PCFGLanguage(types=2, max_depth=2, children=(0.5, 0.3, 0.2))
    assert pcfg.is_valid("([])") and pcfg.is_valid("()[]")
    assert not pcfg.is_valid("(]") and not pcfg.is_valid("(()") and not pcfg.is_valid("")
    assert not pcfg.is_valid("((()))")  # deeper than max_depth
    assert pcfg.is_balanced("((()))") and not pcfg.is_balanced("([)]")
    assert not pcfg.is_valid("()()()")  # more children than the cap
    hmm = HMMLanguage(vocab=2, max_len=4)
    assert not hmm.is_valid("abz") and not hmm.is_valid("aaaaa") and not hmm.is_valid("")
    teacher = TeacherLanguage(vocab=3, length=3, dim=8, layers=1)
    assert teacher.is_valid("abc") and not teacher.is_valid("ab") and not teacher.is_valid("abd")


def test_true_model_has_zero_gap_and_uniform_the_expected_gap(byte_tok) -> None:
    language = HMMLanguage(states=3, vocab=3, max_len=6, seed=4)
    strings = language.sample(300, seed=11)
    rows = language_rows(strings, byte_tok, language.max_len + 2, language)
    objective = AutoregressiveObjective(pad_id=byte_tok.pad_id)
    entropy = language.entropy().as_dict()

    true = ar_nll(
        TrueConditionalModel(language, byte_tok),
        objective,
        rows,
        byte_tok.token_bytes(),
        batch_size=64,
    )
    gap = likelihood_gap(true, language, strings, entropy)
    assert gap["tokens"] == sum(len(s) + 1 for s in strings)  # EOS counted
    assert gap["gap_to_true_nll"] == pytest.approx(0.0, abs=1e-5)
    assert abs(gap["gap_to_entropy"]) < 4 * gap["true_nll_stderr"]

    uniform = ar_nll(
        UniformModel(language, byte_tok), objective, rows, byte_tok.token_bytes(), batch_size=64
    )
    gap = likelihood_gap(uniform, language, strings, entropy)
    log_v = math.log(len(language.alphabet) + 1)  # symbols plus EOS
    assert gap["model_nats_per_token"] == pytest.approx(log_v, abs=1e-5)
    assert gap["gap_to_entropy"] == pytest.approx(log_v - entropy["nats_per_token"], abs=1e-5)


def test_sample_metrics(byte_tok) -> None:
    language = HMMLanguage(states=2, vocab=2, max_len=3, seed=5)
    samples = language.sample(20_000, seed=3)
    out = sample_metrics(language, samples, sample_log_q=language.log_probs(samples))
    assert out["valid_fraction"] == 1.0
    assert out["kl_mc"] == pytest.approx(0.0, abs=1e-12)  # q == p exactly
    assert out["kl_plugin"] == pytest.approx(0.0, abs=5e-3)  # 14 strings, 20k samples
    entropy = language.entropy()
    assert abs(out["true_nll_nats_per_string"] - entropy.nats_per_string) < 0.05
    bad = sample_metrics(language, ["ab", "zz", "abab"], sample_log_q=[-1.0, -1.0, -1.0])
    assert bad["valid_fraction"] == pytest.approx(1 / 3) and bad["kl_mc"] == math.inf


def test_sample_judgements_match_hand_computation() -> None:
    # "a" twice and "b" once are valid (p = 1/2 and 1/4); "zz" is not: the per-token NLL counts
    # EOS, so each valid string is two tokens; q_hat = (2/3, 1/3) gives KL = log(4/3) exactly.
    log_p = np.array([math.log(0.5), math.log(0.5), math.log(0.25), -math.inf])
    out = valid_sample_metrics(["a", "a", "b", "zz"], log_p)
    assert out["true_nll_nats_per_string"] == pytest.approx(4 * math.log(2) / 3, rel=1e-12)
    assert out["true_nll_nats_per_token"] == pytest.approx(4 * math.log(2) / 6, rel=1e-12)
    assert out["distinct_valid"] == 2
    assert out["kl_plugin"] == pytest.approx(math.log(4 / 3), rel=1e-12)
    # log q - log p = (log 2, 0): mean log(2)/2, standard error (log(2)/sqrt(2))/sqrt(2)
    kl = monte_carlo_kl(np.log([0.5, 0.25]), np.log([0.25, 0.25]))
    assert kl["kl_mc"] == pytest.approx(math.log(2) / 2, rel=1e-12)
    assert kl["kl_mc_stderr"] == pytest.approx(math.log(2) / 2, rel=1e-12)
    invalid = monte_carlo_kl([-1.0, -1.0], np.array([math.log(0.5), -math.inf]))
    assert invalid["kl_mc"] == math.inf and math.isnan(invalid["kl_mc_stderr"])
    assert math.isnan(monte_carlo_kl([-1.0], np.log([0.5]))["kl_mc_stderr"])  # one sample
    with pytest.raises(ValueError, match="expected \\(2,\\)"):
        monte_carlo_kl([-1.0], np.log([0.5, 0.5]))


def test_span_posterior_matches_enumeration() -> None:
    language = HMMLanguage(states=3, vocab=3, max_len=5, seed=6)
    probs = {s: math.exp(lp) for s, lp in language.enumerate()}
    string, start, stop = "abcab", 1, 3
    post = language.span_posteriors(string, start, stop)
    same_outside = {
        s: p for s, p in probs.items() if len(s) == 5 and s[:start] + s[stop:] == "a" + "ab"
    }
    total = sum(same_outside.values())
    for j in range(stop - start):
        for v, symbol in enumerate(language.alphabet):
            mass = sum(p for s, p in same_outside.items() if s[start + j] == symbol)
            assert post[j, v] == pytest.approx(mass / total, abs=1e-10)
    tasks = infill_tasks(language, language.sample(200, seed=1), span=2)
    oracle = score_infills(tasks, oracle_infills(tasks), language)
    assert oracle["mode_agreement"] == 1.0 and 0 < oracle["expected_accuracy"] <= 1


def test_load_corpus_hook_offline_and_deterministic() -> None:
    spec = "synthetic:hmm?seed=1&n=300&n_val=50"
    first, again = load_corpus(spec), load_corpus(spec)
    assert first.fingerprint == again.fingerprint and first.train == again.train
    assert len(first.train) == 300 and len(first.validation) == 50
    language = build_language(spec)
    assert all(language.is_valid(s) for s in first.train + first.validation)
    other = load_corpus("synthetic:hmm?seed=2&n=300&n_val=50")
    assert other.fingerprint != first.fingerprint
    pcfg = load_corpus("synthetic:pcfg?n=50&n_val=10&max_depth=3")
    assert all(build_language("synthetic:pcfg?max_depth=3").is_valid(s) for s in pcfg.train)
    assert parse_spec("synthetic:pcfg?children=0.5,0.5")[1] == {"children": [0.5, 0.5]}
    with pytest.raises(ValueError, match="unknown key 'bogus'"):
        load_corpus("synthetic:hmm?bogus=1")
    with pytest.raises(ValueError, match="valid: \\['hmm', 'pcfg', 'teacher'\\]"):
        load_corpus("synthetic:nope")
    with pytest.raises(ValueError, match="states"):
        load_corpus("synthetic:hmm?states=abc")


def test_ar_sampler_of_the_true_model_is_exact(byte_tok) -> None:
    language = HMMLanguage(states=2, vocab=2, max_len=3, seed=8)
    model = TrueConditionalModel(language, byte_tok)
    texts, log_q = ar_sample(model, byte_tok, 3000, language.max_len + 1, seed=0, batch_size=1000)
    out = sample_metrics(language, texts, sample_log_q=log_q)
    assert out["valid_fraction"] == 1.0 and out["kl_mc"] == pytest.approx(0.0, abs=1e-9)
    probs = {s: math.exp(lp) for s, lp in language.enumerate()}
    counts = Counter(texts)
    keys = sorted(probs)
    expected = [probs[k] * len(texts) for k in keys]
    assert stats.chisquare([counts[k] for k in keys], expected).pvalue > 1e-3
    # the true model fills a span with its prefix-only greedy guess; the oracle with the mode
    tasks = infill_tasks(language, language.sample(100, seed=2), span=1)
    prefix_only = score_infills(
        tasks, ar_prefix_infills(model, byte_tok, language, tasks), language
    )
    oracle = score_infills(tasks, oracle_infills(tasks), language)
    assert prefix_only["expected_accuracy"] <= oracle["expected_accuracy"] + 1e-12


def _tiny_checkpoint(root, objective: str, byte_tok, seq_len: int):
    cfg = ModelConfig(
        vocab_size=byte_tok.vocab_size + (objective == "mdm"),
        dim=16,
        n_layers=1,
        n_heads=2,
        n_kv_heads=2,
        hidden_dim=32,
        max_seq_len=seq_len,
    )
    torch.manual_seed(0)
    state = {
        "objective": objective,
        "model_config": cfg.to_dict(),
        "train_config": {
            "seq_len": seq_len,
            "protocol": "padded",
            "schedule": "linear",
            "t_eps": 1e-3,
            "estimator": "time",
        },
    }
    return save_checkpoint(
        root, 0, weights=full_model_state(Transformer(cfg)), tokenizer=byte_tok, state=state
    )


def test_synthetic_report_runs_on_both_objectives(byte_tok, tmp_path) -> None:
    spec = "synthetic:hmm?states=2&vocab=3&max_len=6&seed=1"
    ar = _tiny_checkpoint(tmp_path / "ar", "ar", byte_tok, 8)
    mdm = _tiny_checkpoint(tmp_path / "mdm", "mdm", byte_tok, 8)
    report = synthetic_report(ar, mdm, spec, 16, n_heldout=40, nelbo_samples=2, infill_span=1)
    assert report["language"]["entropy"]["exact"]
    for label in ("ar", "mdm"):
        section = report[label]
        gap = section["likelihood"]
        # an untrained model is far from the truth; the accounting counts EOS once per string
        assert gap["gap_to_true_nll"] > 0 and math.isfinite(gap["gap_to_entropy"])
        assert 0.0 <= section["samples"]["valid_fraction"] <= 1.0
    assert report["ar"]["infill_prefix_only"]["n_tasks"] == report["mdm"]["infill"]["n_tasks"] > 0
    assert report["infill_oracle"]["mode_agreement"] == 1.0
    with pytest.raises(ValueError, match="expected 'ar'"):
        synthetic_report(mdm, None, spec, 4, n_heldout=10, nelbo_samples=2)


def test_pcfg_completion_probe_with_the_true_model(byte_tok, tmp_path) -> None:
    language = PCFGLanguage(types=2, max_depth=2, children=(0.5, 0.3, 0.2), seed=1)
    prefixes = completion_prefixes(language.sample(400, seed=4), 60)
    model = TrueConditionalModel(language, byte_tok)
    completions = ar_complete(model, byte_tok, prefixes, language.max_len + 2, seed=0)
    out = completion_metrics(language, prefixes, completions)
    assert out["valid_fraction"] == 1.0 and out["balanced_fraction"] == 1.0
    bad = completion_metrics(language, ["(("], ["]]"])
    assert bad["valid_fraction"] == 0.0 and "true_log_prob_given_prefix" not in bad
    # exact conditional: log P("()" | "(") = log P("()") - log P(prefix "(")
    assert prefix_log_prob(language, "(") == pytest.approx(
        float(language.next_log_probs("")[0]), abs=1e-12
    )
    spec = "synthetic:pcfg?types=2&max_depth=2&children=0.5,0.3,0.2"
    ar = _tiny_checkpoint(tmp_path / "ar", "ar", byte_tok, 16)
    mdm = _tiny_checkpoint(tmp_path / "mdm", "mdm", byte_tok, 16)
    report = synthetic_report(ar, mdm, spec, 8, n_heldout=40, nelbo_samples=2)
    assert report["ar"]["completion"]["n"] == report["mdm"]["completion"]["n"] > 0


def test_a_sample_holding_a_non_symbol_token_is_no_string_of_the_language(byte_tok) -> None:
    language = HMMLanguage(states=2, vocab=2, max_len=3, seed=5)
    a, b = byte_tok.encode("a"), byte_tok.encode("b")
    assert language.is_valid(sample_text(a + b, byte_tok))
    # PAD between two symbols is not the string "ab": it scores p = 0, counted invalid
    padded = sample_text(a + [byte_tok.pad_id] + b, byte_tok)
    assert not language.is_valid(padded) and padded.startswith("ab")
    assert sample_metrics(language, [padded, "ab"])["valid_fraction"] == 0.5
