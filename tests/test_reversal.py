"""The facts language and the reversal probe: facts learned in one direction, queried in both."""

import math
from collections import Counter

import pytest
import torch
from scipy import stats
from torch import nn

from eval.synthetic_likelihood import MASKED_LOGIT, TrueConditionalModel, symbol_ids
from eval.synthetic_probes import reversal_probe
from shared.data.synthetic.facts import FactsLanguage
from shared.data.synthetic.specs import build_language, parse_spec
from shared.tokenizer import Tokenizer

N = 12


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.byte()


@pytest.fixture(scope="module")
def facts() -> FactsLanguage:
    return FactsLanguage(pairs=N, seed=3)


def test_facts_language_is_exact_and_sampling_matches(facts) -> None:
    assert set(facts.firsts).isdisjoint(facts.seconds) and len(set(facts.seconds)) == N
    probs = {s: math.exp(lp) for s, lp in facts.enumerate()}
    assert len(probs) == N and sum(probs.values()) == pytest.approx(1.0, abs=1e-12)
    for (a, b), (s, lp) in zip(facts.facts, facts.enumerate()):
        assert s == a + b and lp == pytest.approx(-math.log(N))
        assert facts.log_prob(s) == pytest.approx(-math.log(N))
        # the chain rule of the next-symbol conditionals gives the same value
        assert super(FactsLanguage, facts).log_prob(s) == pytest.approx(-math.log(N))
        assert facts.is_valid(s) and not facts.is_valid(b + a) and not facts.is_valid(a)
    # a generic depth-first enumeration over next_log_probs finds exactly the facts
    generic = dict(super(FactsLanguage, facts).enumerate())
    assert generic.keys() == probs.keys()
    wrong = facts.firsts[0] + facts.seconds[1]
    assert facts.log_prob(wrong) == -math.inf and not facts.is_valid("")
    with pytest.raises(ValueError, match="probability zero"):
        facts.next_log_probs(facts.seconds[0])
    entropy = facts.entropy()
    assert entropy.exact and entropy.nats_per_string == pytest.approx(math.log(N))
    assert entropy.expected_length == 2.0
    n = 12_000
    samples = facts.sample(n, seed=5)
    assert samples == facts.sample(n, seed=5)
    counts = Counter(samples)
    assert set(counts) == set(probs)
    keys = sorted(probs)
    observed = [counts[k] for k in keys]
    assert stats.chisquare(observed, [probs[k] * n for k in keys]).pvalue > 1e-3


def test_facts_spec() -> None:
    spec = "synthetic:facts?pairs=16&seed=2&n=100"
    kind, kwargs, corpus = parse_spec(spec)
    assert kind == "facts" and kwargs == {"pairs": 16, "seed": 2} and corpus["n"] == 100
    language = build_language(spec)
    assert isinstance(language, FactsLanguage) and language.pairs == 16
    assert language.facts == build_language("synthetic:facts?pairs=16&seed=2").facts
    assert language.facts != build_language("synthetic:facts?pairs=16&seed=3").facts
    with pytest.raises(ValueError, match="pairs"):
        build_language("synthetic:facts?pairs=27")


class ForwardOnlyAR(TrueConditionalModel):
    """The exact AR conditionals of the facts language; uniform after a prefix of probability
    zero (``[BOS, b_i]``), which no training row ever contains."""

    def logits_after(self, prefix: str) -> torch.Tensor:
        try:
            return super().logits_after(prefix)
        except ValueError:
            logits = torch.full((self.vocab_size,), MASKED_LOGIT, dtype=torch.float64)
            logits[self.ids] = 0.0
            return logits


class StubMDM(nn.Module):
    """An MDM whose masked-position logits are the exact posterior of the facts language (given
    the other symbol), or uniform over the symbols with ``exact=False``."""

    def __init__(self, language: FactsLanguage, tok: Tokenizer, exact: bool) -> None:
        super().__init__()
        self.config = type("Config", (), {"vocab_size": tok.vocab_size + 1})()
        self.ids = dict(zip(language.alphabet, symbol_ids(language, tok)))
        self.symbol_of = {i: s for s, i in self.ids.items()}
        self.language, self.exact = language, exact

    def forward(self, tokens: torch.Tensor, attention: str = "bidirectional", output_mask=None):
        assert attention == "bidirectional"
        mask_id = self.config.vocab_size - 1
        out = torch.full((*tokens.shape, self.config.vocab_size), MASKED_LOGIT)
        out[..., list(self.ids.values())] = 0.0
        for r, row in enumerate(tokens.tolist()):
            first, second = (self.symbol_of.get(t) for t in row[1:3])
            if not self.exact:
                continue
            if row[2] == mask_id and first is not None:
                out[r, 2, self.ids[self.language.forward_map[first]]] = 10.0
            if row[1] == mask_id and second is not None:
                out[r, 1, self.ids[self.language.reverse_map[second]]] = 10.0
        return out if output_mask is None else out[output_mask]


def test_reversal_probe_oracles_and_uniform(facts, tok) -> None:
    mdm = reversal_probe(StubMDM(facts, tok, exact=True), tok, facts, "mdm", 4)
    assert mdm["forward_accuracy"] == mdm["reverse_accuracy"] == 1.0
    assert mdm["chance"] == pytest.approx(1 / N) and mdm["n_pairs"] == N
    uniform = reversal_probe(StubMDM(facts, tok, exact=False), tok, facts, "mdm", 4)
    # ties go to the first candidate, which is the right answer for exactly one pair
    assert uniform["forward_accuracy"] == uniform["reverse_accuracy"] == pytest.approx(1 / N)
    # the exact forward conditionals: perfect forward and perfect likelihood-scored reverse,
    # but the prompted reverse query (b_i as a first symbol) is at chance: the reversal curse
    ar = reversal_probe(ForwardOnlyAR(facts, tok), tok, facts, "ar", 4)
    assert ar["forward_accuracy"] == ar["reverse_scored_accuracy"] == 1.0
    assert ar["reverse_prompted_accuracy"] == pytest.approx(1 / N)
    assert "reverse_accuracy" not in ar
    with pytest.raises(ValueError, match="objective"):
        reversal_probe(ForwardOnlyAR(facts, tok), tok, facts, "gpt", 4)
