"""The exact denoisers of the hidden Markov language against brute force: every conditional
equals a ratio of enumerated row probabilities, for the AR, masked, block and uniform-state
families, on rows with EOS and padding; the uniform-state one is the posterior without the
position's own noisy token, which is the uniform NELBO's minimiser."""

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from dllm.block.objective import block_causal_mask
from dllm.uniform.objective import alpha, nelbo_at
from eval.synthetic.exact.denoisers import exact_denoiser
from eval.synthetic.likelihood import symbol_ids
from shared.data.synthetic.hmm import HMMLanguage
from shared.tokenizer import Tokenizer

TOK = Tokenizer.byte()
EOS, PAD = TOK.eos_id, TOK.pad_id


@pytest.fixture(scope="module")
def ternary_language() -> HMMLanguage:
    return HMMLanguage(states=2, vocab=3, max_len=3, stop_min=0.2, stop_max=0.6, seed=4)


def strings(ternary_language):
    return {s: math.exp(lp) for s, lp in ternary_language.enumerate()}


def padded_rows(ternary_language, gen_length):
    """P(row) over the generation region of ``[BOS] + s + EOS + PAD...``."""
    ids = dict(zip(ternary_language.alphabet, symbol_ids(ternary_language, TOK)))
    rows = {}
    for s, p in strings(ternary_language).items():
        body = [ids[c] for c in s] + [EOS]
        rows[tuple(body + [PAD] * (gen_length - len(body)))] = p
    return rows


def stream_rows(ternary_language, gen_length):
    """P(row) of i.i.d. documents, each followed by EOS, cut at ``gen_length`` tokens."""
    ids = dict(zip(ternary_language.alphabet, symbol_ids(ternary_language, TOK)))
    docs = [([ids[c] for c in s] + [EOS], p) for s, p in strings(ternary_language).items()]
    rows = defaultdict(float)
    frontier = [((), 1.0)]
    while frontier:
        prefix, mass = frontier.pop()
        for body, p in docs:
            row = prefix + tuple(body)
            if len(row) >= gen_length:
                rows[row[:gen_length]] += mass * p
            else:
                frontier.append((row, mass * p))
    return dict(rows)


def logits_of(model, rows, **kw):
    batch = torch.tensor([[EOS, *row] for row in rows])
    return model(batch, attention="bidirectional", **kw)


def probs_at(logits, ids):
    return torch.softmax(logits.double(), -1)[..., ids].numpy()


def test_brute_force_rows_sum_to_one(ternary_language) -> None:
    assert sum(padded_rows(ternary_language, 5).values()) == pytest.approx(1.0, abs=1e-12)
    assert sum(stream_rows(ternary_language, 5).values()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("gen_length", [4, 6])
def test_ar_next_token_is_the_enumerated_ratio(ternary_language, gen_length) -> None:
    rows = padded_rows(ternary_language, gen_length)
    model = exact_denoiser("ar", ternary_language, TOK, gen_length + 1)
    ids = list(model.tokens.ids)
    checked = 0
    for row in rows:
        logits = model(torch.tensor([[EOS, *row]]), attention="causal")[0]
        for i in range(gen_length):
            prefix = row[:i]
            mass = {
                t: sum(p for r, p in rows.items() if r[:i] == prefix and r[i] == t) for t in ids
            }
            total = sum(mass.values())
            expected = [mass[t] / total for t in ids]
            np.testing.assert_allclose(probs_at(logits[i], ids), expected, atol=1e-12)
            checked += 1
    assert checked >= 40
    # the exact model puts no mass outside the row symbols (EOS and PAD included)
    assert torch.softmax(logits[0].double(), -1)[ids].sum() == pytest.approx(1.0, abs=1e-12)


def partial_observations(rows, gen_length, mask, rng, count):
    """``count`` random rows with random positions replaced by ``mask``."""
    keys = list(rows)
    out = []
    for _ in range(count):
        row = list(keys[rng.integers(len(keys))])
        hidden = rng.random(gen_length) < rng.uniform(0.2, 0.9)
        out.append(tuple(mask if h else t for t, h in zip(row, hidden)))
    return out


@pytest.mark.parametrize("gen_length", [4, 5])
def test_absorbing_conditionals_are_the_enumerated_ratios(ternary_language, gen_length) -> None:
    rows = padded_rows(ternary_language, gen_length)
    model = exact_denoiser("mdm", ternary_language, TOK, gen_length + 1)
    mask, ids = model.config.vocab_size - 1, list(model.tokens.ids)
    observations = partial_observations(rows, gen_length, mask, np.random.default_rng(1), 30)
    observations.append((mask,) * gen_length)
    observations.append((mask, mask, EOS, PAD, PAD)[:gen_length])
    for seen in observations:
        logits = logits_of(model, [seen])[0, 1:]
        consistent = {r: p for r, p in rows.items() if all(s in (mask, t) for s, t in zip(seen, r))}
        total = sum(consistent.values())
        for i in [i for i, s in enumerate(seen) if s == mask]:
            expected = [sum(p for r, p in consistent.items() if r[i] == t) / total for t in ids]
            np.testing.assert_allclose(probs_at(logits[i], ids), expected, atol=1e-12)


def test_block_input_gets_the_conditional_given_prefix_and_block(ternary_language) -> None:
    """Block diffusion's reference predictor feeds [0, end) only: the exact model sums the
    positions past the block out, which is the conditional given the clean prefix and the
    block's unmasked tokens."""
    gen_length = 5
    rows = padded_rows(ternary_language, gen_length)
    model = exact_denoiser("bd", ternary_language, TOK, gen_length + 1)
    mask, ids = model.config.vocab_size - 1, list(model.tokens.ids)
    a = symbol_ids(ternary_language, TOK)[0]
    for seen in [(a, mask), (a, a, mask, mask), (mask, mask), (a, EOS, mask)]:
        batch = torch.tensor([[EOS, *seen]])
        logits = model(batch, attention=block_causal_mask(len(seen) + 1, 2, "cpu"))[0, 1:]
        consistent = {r: p for r, p in rows.items() if all(s in (mask, t) for s, t in zip(seen, r))}
        total = sum(consistent.values())
        for i in [i for i, s in enumerate(seen) if s == mask]:
            expected = [sum(p for r, p in consistent.items() if r[i] == t) / total for t in ids]
            np.testing.assert_allclose(probs_at(logits[i], ids), expected, atol=1e-12)


@pytest.mark.parametrize("t", [0.1, 0.5, 0.97])
def test_uniform_posteriors_are_the_enumerated_ratios(ternary_language, t) -> None:
    gen_length = 4
    rows = stream_rows(ternary_language, gen_length)
    model = exact_denoiser("udm", ternary_language, TOK, gen_length + 1)
    n_support = TOK.vocab_size - 1
    time = torch.tensor([t])  # float32, as the sampler passes it
    keep = float(alpha(time.double())[0])
    ids = list(model.tokens.ids)
    assert PAD not in ids  # padding is not in the uniform family's support
    outsider = ord("z")  # a support id no row holds
    rng = np.random.default_rng(2)
    choices = [*ids, outsider]
    noisy = [
        tuple(choices[i] for i in rng.integers(len(choices), size=gen_length)) for _ in range(12)
    ]
    noisy.append((EOS, EOS, ids[0], outsider))
    for z in noisy:
        logits = logits_of(model, [z], time=time)[0, 1:]
        for i in range(gen_length):
            # every position's channel but i's own: what the NELBO trains (test below)
            weight = {
                r: p
                * math.prod(
                    keep * (zj == rj) + (1 - keep) / n_support
                    for j, (zj, rj) in enumerate(zip(z, r))
                    if j != i
                )
                for r, p in rows.items()
            }
            total = sum(weight.values())
            expected = [sum(w for r, w in weight.items() if r[i] == tok) / total for tok in ids]
            np.testing.assert_allclose(probs_at(logits[i], ids), expected, atol=1e-12)


@pytest.mark.parametrize("kept, noised", [(0.6, 0), (0.2, 2), (0.9, 1)])
def test_the_uniform_nelbo_is_least_at_the_posterior_without_the_own_token(kept, noised) -> None:
    """Why the exact uniform denoiser leaves a position's own noisy token out: over x0 drawn
    from p(x0 | z_t) (own token in), the expected NELBO of one position is least at x_theta =
    p(x0 | the other positions), not at p(x0 | z_t) itself."""
    torch.set_default_dtype(torch.float64)
    try:
        n = 3
        others = torch.tensor([0.2, 0.5, 0.3])  # p(x0 | the other positions)
        channel = torch.full((n,), (1 - kept) / n)
        channel[noised] += kept  # q(z_i = noised | x0 = k)
        posterior = others * channel / (others * channel).sum()  # p(x0 | z_t)
        logits = torch.zeros(n, requires_grad=True)
        optimizer = torch.optim.LBFGS([logits], max_iter=500, tolerance_grad=1e-14)

        def expected_nelbo():
            optimizer.zero_grad()
            log_x = torch.log_softmax(logits, -1)[None].expand(n, n)
            args = (torch.full((n,), noised), torch.full((n,), kept), torch.full((n,), -1.0))
            loss = (posterior * nelbo_at(log_x, torch.arange(n), *args)).sum()
            loss.backward()
            return loss

        for _ in range(10):
            optimizer.step(expected_nelbo)
        best = torch.softmax(logits, -1).detach()
        torch.testing.assert_close(best, others, atol=1e-4, rtol=0)
        assert (best - posterior).abs().max() > 0.05
    finally:
        torch.set_default_dtype(torch.float32)


def test_impossible_evidence_gives_uniform_row_symbols(ternary_language) -> None:
    model = exact_denoiser("mdm", ternary_language, TOK, 6)
    mask, ids = model.config.vocab_size - 1, list(model.tokens.ids)
    logits = logits_of(model, [(PAD, mask, mask, mask, mask)])[0, 2]
    np.testing.assert_allclose(probs_at(logits, ids), [1 / len(ids)] * len(ids), atol=1e-12)
    for family in ("ar", "mdm", "bd", "udm"):
        model = exact_denoiser(family, ternary_language, TOK, 6)
        shape = (2, 6, model.config.vocab_size)
        time = torch.tensor([0.5, 0.5]) if family == "udm" else None
        out = model(torch.full((2, 6), EOS), attention="causal", time=time)
        assert out.shape == shape and out.dtype == torch.float64
        assert all(p.numel() == 1 for p in model.parameters())  # the device anchor only


def test_output_mask_selects_positions(ternary_language) -> None:
    model = exact_denoiser("mdm", ternary_language, TOK, 6)
    mask = model.config.vocab_size - 1
    batch = torch.tensor([[EOS] + [mask] * 5, [EOS, mask, EOS, PAD, PAD, PAD]])
    selected = torch.zeros_like(batch, dtype=torch.bool)
    selected[:, 1] = True
    full = model(batch, attention="bidirectional")
    assert torch.equal(model(batch, "bidirectional", output_mask=selected), full[:, 1])
    assert list(itertools.islice(model._memo, 1))  # rows are memoised
