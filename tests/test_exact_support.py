"""Where the exact denoiser is defined: the full-support language reaches no impossible canvas
and its completions agree (one exact answer), the variable-length one reaches some and its
completions disagree (the report gives both); the prefix completion conditions on the possible
run from the start; the packed-row oracle starts where packed rows start; a headline language
with impossible canvases is refused in one line."""

import numpy as np
import pytest
import torch

from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount
from eval.experiments.exact_frontier import main
from eval.experiments.exact_frontier_setup import (
    GEN_LENGTH,
    SEQ_LEN,
    boundary_share,
    check_headline_language,
    has_full_support,
    language,
    oracles,
    symbol_tokenizer,
)
from eval.synthetic.exact.chain import packed_start, row_chain
from eval.synthetic.exact.denoisers import exact_denoiser
from eval.synthetic.exact.frontier import sampler_distribution
from eval.synthetic.exact.outcomes import divergences
from shared.data.rows import pack_rows
from shared.errors import ConfigError
from shared.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_hf(symbol_tokenizer(tmp_path_factory.mktemp("tok"), "abc"))


def three_step_outputs(name: str, tokenizer: Tokenizer) -> dict:
    """The 3-step random-order MDM's exact q under each completion."""
    lang, config = language(name), SamplerConfig(FixedCount(3, remasking="random"))
    outputs = {}
    for completion in ("uniform", "prefix"):
        model = exact_denoiser("mdm", lang, tokenizer, GEN_LENGTH + 1, completion=completion)
        outputs[completion] = sampler_distribution(
            "mdm", model, lang, tokenizer, config, GEN_LENGTH
        )
    return outputs


def test_full_support_language_has_one_exact_answer(tokenizer) -> None:
    fixed = three_step_outputs("fixed", tokenizer)
    assert all(d.impossible == 0 for d in fixed.values())
    tv = divergences(fixed["uniform"].q, fixed["prefix"].q)["tv"]
    assert tv < 1e-12 and divergences(fixed["uniform"].q, fixed["uniform"].p)["tv"] > 1e-3


def test_variable_language_reaches_impossible_canvases_where_completions_differ(
    tokenizer,
) -> None:
    variable = three_step_outputs("variable", tokenizer)
    # the same paths reach an impossible canvas under both: the completions differ only there
    uniform, prefix = (variable[c].impossible for c in ("uniform", "prefix"))
    assert 0.1 < uniform < 0.5 and prefix == pytest.approx(uniform, abs=1e-12)
    to_p = {c: divergences(d.q, d.p)["tv"] for c, d in variable.items()}
    assert abs(to_p["uniform"] - to_p["prefix"]) > 0.01


def test_prefix_completion_conditions_on_the_possible_run_from_the_start(tokenizer) -> None:
    lang = language("variable")
    prefix = exact_denoiser("mdm", lang, tokenizer, 7, completion="prefix")
    uniform = exact_denoiser("mdm", lang, tokenizer, 7, completion="uniform")
    a, b = tokenizer.encode("a")[0], tokenizer.encode("b")[0]
    eos, mask = tokenizer.eos_id, prefix.config.vocab_size - 1
    impossible = (eos, a, eos, b, mask, mask)  # a symbol after the EOS
    seen = (eos, a, eos, mask, mask, mask)  # the run before the conflict
    assert not prefix.possible(impossible) and prefix.possible(seen)
    got = prefix(torch.tensor([impossible]))[0, 4:]
    assert torch.equal(got, prefix(torch.tensor([seen]))[0, 4:])
    assert not torch.equal(got, uniform(torch.tensor([impossible]))[0, 4:])
    # where the evidence is possible the completions are the same conditional
    possible = (eos, a, mask, b, mask, mask)
    assert torch.equal(prefix(torch.tensor([possible])), uniform(torch.tensor([possible])))


def test_packed_oracle_starts_where_packed_rows_start() -> None:
    lang = language("variable")
    chain = packed_start(row_chain(lang, "stream"))
    assert np.allclose(chain.start @ chain.trans, chain.start)
    docs = [
        np.array([lang.symbol_index(c) for c in s], dtype=np.int32)
        for s in lang.sample(40_000, seed=1)
    ]
    eos = len(lang.alphabet)
    rows = pack_rows(docs, seq_len=SEQ_LEN, eos_id=eos, pad_id=eos + 1, keep_partial=False)
    seen = np.bincount(rows[:, 1], minlength=eos + 1) / len(rows)
    assert np.abs(seen - chain.start @ chain.emit).max() < 0.01
    boundary = row_chain(lang, "stream")
    assert np.abs(seen - boundary.start @ boundary.emit).max() > 0.05
    tokenizer = Tokenizer.byte()
    oracle = exact_denoiser("udm", lang, tokenizer, 7, row_start="packed")
    assert np.array_equal(oracle.chain.start, chain.start)
    default = exact_denoiser("udm", lang, tokenizer, 7)
    assert np.array_equal(default.chain.start, boundary.start)


def test_languages_and_their_oracles() -> None:
    fixed, variable = language("fixed"), language("variable")
    assert has_full_support(fixed) and not has_full_support(variable)
    assert boundary_share(fixed, 2000) == 1.0 and boundary_share(variable, 2000) < 0.5
    assert all(oracles(fixed, f) == {"exact": {}} for f in ("ar", "mdm", "bd", "udm"))
    assert list(oracles(variable, "udm")) == ["packed", "boundary"]
    assert list(oracles(variable, "mdm")) == ["uniform", "prefix"]
    assert check_headline_language("fixed") == "fixed"
    with pytest.raises(ConfigError, match="full-support"):
        check_headline_language("variable")


def test_a_headline_language_with_impossible_canvases_is_one_line(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    out = tmp_path / "out"
    argv = ["--out", str(out), "--scale", "smoke", "--headline-language", "variable"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--headline-language='variable' is refused" in err and "'fixed'" in err
    assert not out.exists()  # nothing written on refusal
