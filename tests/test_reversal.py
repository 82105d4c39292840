"""The facts language and the reversal probe: facts learned in one direction, queried in both."""

import math
from collections import Counter

import pytest
import torch
from scipy import stats
from torch import nn

from eval.synthetic.likelihood import MASKED_LOGIT, TrueConditionalModel, symbol_ids
from eval.synthetic.probes import reversal_probe
from shared.data.synthetic.facts import FactsLanguage
from shared.data.synthetic.specs import build_language, parse_spec
from shared.tokenizer import Tokenizer

N = 12


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

    def __init__(self, language: FactsLanguage, byte_tok: Tokenizer, exact: bool) -> None:
        super().__init__()
        self.config = type("Config", (), {"vocab_size": byte_tok.vocab_size + 1})()
        self.ids = dict(zip(language.alphabet, symbol_ids(language, byte_tok)))
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
            # the fact's other symbol, whichever order the row shows it in
            other = self.language.forward_map | self.language.reverse_map
            if row[2] == mask_id and first is not None:
                out[r, 2, self.ids[other[first]]] = 10.0
            if row[1] == mask_id and second is not None:
                out[r, 1, self.ids[other[second]]] = 10.0
        return out if output_mask is None else out[output_mask]


@pytest.mark.parametrize("both", [0, 5])
def test_reversal_probe_oracles_and_uniform(byte_tok, both) -> None:
    facts = FactsLanguage(pairs=N, both=both, seed=3)
    held = N - both
    mdm = reversal_probe(StubMDM(facts, byte_tok, exact=True), byte_tok, facts, "mdm", 4)
    assert mdm["forward_accuracy"] == mdm["reverse_held_out_accuracy"] == 1.0
    assert mdm["infill_reverse_accuracy"] == 1.0
    assert mdm["reverse_paired_accuracy"] == (1.0 if both else None)
    assert mdm["chance"] == pytest.approx(1 / held) and mdm["n_held_out"] == held
    uniform = reversal_probe(StubMDM(facts, byte_tok, exact=False), byte_tok, facts, "mdm", 4)
    # ties go to the first candidate, which is the right answer for exactly one fact
    assert uniform["forward_accuracy"] == pytest.approx(1 / N)
    assert uniform["reverse_held_out_accuracy"] == pytest.approx(1 / held)
    # the exact conditionals of the training strings: perfect forward, perfect reversed
    # paired facts and likelihood-scored reverse, but the reversed held-out query (a prefix no
    # training string starts with) is at chance: the reversal curse
    ar = reversal_probe(ForwardOnlyAR(facts, byte_tok), byte_tok, facts, "ar", 4)
    assert ar["forward_accuracy"] == ar["reverse_scored_accuracy"] == 1.0
    assert ar["reverse_paired_accuracy"] == (1.0 if both else None)
    assert ar["reverse_held_out_accuracy"] == pytest.approx(1 / held)
    assert "infill_reverse_accuracy" not in ar
    with pytest.raises(ValueError, match="objective"):
        reversal_probe(ForwardOnlyAR(facts, byte_tok), byte_tok, facts, "gpt", 4)


def test_paired_facts_add_their_reversed_strings(byte_tok) -> None:
    facts = FactsLanguage(pairs=N, both=4, seed=3)
    assert facts.paired == facts.facts[:4] and facts.held_out == facts.facts[4:]
    probs = dict(facts.enumerate())
    assert len(probs) == N + 4 and set(probs.values()) == {-math.log(N + 4)}
    assert {b + a for a, b in facts.paired} <= set(probs)
    assert not {b + a for a, b in facts.held_out} & set(probs)
    # the generic chain rule over next_log_probs agrees with the closed form
    assert dict(super(FactsLanguage, facts).enumerate()) == pytest.approx(probs)
    counts = Counter(facts.sample(16_000, seed=1))
    keys = sorted(probs)
    assert stats.chisquare([counts[k] for k in keys], [16_000 / (N + 4)] * len(keys)).pvalue > 1e-3
    assert facts.entropy().nats_per_string == pytest.approx(math.log(N + 4))
    with pytest.raises(ValueError, match="both"):
        FactsLanguage(pairs=N, both=N)
    assert build_language("synthetic:facts?pairs=12&both=4&seed=3").strings == facts.strings
