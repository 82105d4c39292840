"""Eso-LM ("eso"): its NELBO at both limits against the masked and autoregressive objectives,
the two-stream attention against plain causal forwards, a sliding window kept over the
positions of a permuted row, the sampler's KV cache against its recomputing reference, training,
scoring and sampling from a run, and its refusals."""

import math

import pytest
import torch
from torch import nn

from dllm.canvas import Canvas
from dllm.eso.objective import (
    EsoObjective,
    permutation,
    permuted_attention,
    sequential_attention,
)
from dllm.eso.sampler import EsoSamplerConfig, chunk_sizes, sample_eso
from dllm.generator import DiffusionGenerator
from dllm.masked.objective import MaskedDiffusionObjective
from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount
from eval.likelihood import evaluate_checkpoint
from shared.errors import ConfigError
from shared.model import ModelConfig, Transformer
from shared.sampling import SamplingConfig
from shared.training import cli

VOCAB = 12  # tokenizer ids 0..11; [MASK] = 12
BOS, PAD = 0, 11


def tiny_model(seed: int = 0, max_seq_len: int = 16, window: int = 0) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=VOCAB + 1, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=48,
        max_seq_len=max_seq_len, sliding_window=window,
    )  # fmt: skip
    return Transformer(config).double().eval()


def rows(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, PAD, (batch, length), generator=generator)
    tokens[:, 0] = BOS
    return tokens


def objective(alpha_0: float, cls=EsoObjective):
    built = cls(pad_id=PAD, **({"alpha_0": alpha_0} if cls is EsoObjective else {}))
    built.model_vocab_size(VOCAB)
    return built


class OwnTokenModel(nn.Module):
    """Logits that depend only on the token in their own slot: every attention pattern and
    order gives the same predictions, so two objectives that mask and weight alike agree."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.table = nn.Parameter(torch.randn(VOCAB + 1, VOCAB + 1, dtype=torch.float64))
        self.config = tiny_model().config  # no sliding window

    def forward(self, tokens, attention, output_mask=None, **ignored):
        return self.table[tokens][output_mask]


def test_alpha_0_of_one_is_the_masked_objectives_nelbo():
    tokens = rows(6, 10)
    eso, mdm = objective(1.0), objective(1.0, MaskedDiffusionObjective)
    noise = eso.sample_noise(6, 10, torch.Generator().manual_seed(0))
    model = OwnTokenModel()
    ours = eso.loss(model, tokens, noise)
    theirs = mdm.loss(model, tokens, {"t": noise["t"], "uniforms": noise["uniforms"]})
    torch.testing.assert_close(ours.row_nats, theirs.row_nats.double(), rtol=1e-12, atol=0)
    assert int(ours.n_tokens) == int(theirs.n_tokens) and float(ours.nats) > 0


def chain_rule_nats(model: Transformer, row: torch.Tensor) -> float:
    """-log p(row) with each token predicted by a plain causal forward of the tokens before it
    and a [MASK] query at its own position: what the AR phase computes, one position at a time."""
    total = 0.0
    for position in range(1, len(row)):
        inputs = torch.cat([row[:position], torch.tensor([VOCAB])])[None]
        logits = model(inputs, attention="causal")[0, -1, :VOCAB]
        total -= float(torch.log_softmax(logits, -1)[row[position]])
    return total


@pytest.mark.parametrize("window", [0, 3])
def test_alpha_0_of_zero_is_an_autoregressive_nll_by_plain_causal_forwards(window):
    # with a sliding window the two-stream mask carries it: the AR NLL of the windowed model
    model, tokens = tiny_model(window=window), rows(3, 8)
    eso = objective(0.0)
    out = eso.loss(model, tokens, eso.sample_noise(3, 8, torch.Generator().manual_seed(1)))
    expected = torch.tensor([chain_rule_nats(model, row) for row in tokens], dtype=torch.float64)
    # the loss takes its cross-entropy in float32, as every objective does
    torch.testing.assert_close(out.row_nats, expected, rtol=1e-6, atol=1e-6)
    # the noise draws the order of the clean tokens only: at alpha_0 = 0 none is clean
    again = eso.loss(model, tokens, eso.sample_noise(3, 8, torch.Generator().manual_seed(9)))
    torch.testing.assert_close(again.row_nats, out.row_nats, rtol=1e-9, atol=1e-9)


def test_the_sequential_term_sees_the_clean_tokens_and_the_masked_ones_before_it():
    # one row, clean positions {0, 3, 5}: the query of masked position 4 sees 0, 3, 5 and the
    # clean key of position 1 and 2 (masked, but before it), as a plain forward of them would
    model, row = tiny_model(), rows(1, 7)[0]
    clean = torch.tensor([[True, False, False, True, False, True, False]])
    order = permutation(clean, torch.rand(1, 7, dtype=torch.float64), masks_ascending=True)
    assert order[0, 0] == 0 and set(order[0, 1:3].tolist()) == {3, 5}
    assert order[0, 3:].tolist() == [1, 2, 4, 6]
    length = 7
    mask = sequential_attention(length)
    inputs = torch.cat([row[order[0]], torch.full((length,), VOCAB)])[None]
    logits = model(inputs, attention=mask, positions=torch.cat([order[0], order[0]]))[0]
    slot = order[0].tolist().index(4)
    seen = order[0, :slot]  # positions 0, {3, 5}, 1, 2 in that slot order
    direct = torch.cat([row[seen], torch.tensor([VOCAB])])[None]
    reference = model(direct, attention="causal", positions=torch.cat([seen, torch.tensor([4])]))
    torch.testing.assert_close(logits[length + slot], reference[0, -1], rtol=1e-9, atol=1e-9)


def test_each_term_is_weighted_twice_when_both_count():
    eso = objective(0.5)
    sequential, weight = eso.sequential_rows(torch.tensor([0.1, 0.7], dtype=torch.float64))
    assert sequential.tolist() == [True, False] and weight == 2.0
    assert eso.streams == 1.5 and objective(1.0).streams == 1.0 and objective(0.0).streams == 2.0


def canvas(batch: int, prompt: int, length: int) -> Canvas:
    tokens = torch.full((batch, length), VOCAB)
    tokens[:, :prompt] = rows(batch, prompt, seed=5)
    return Canvas(tokens, VOCAB)


@pytest.mark.parametrize(("alpha_0", "window"), [(0.0, 0), (0.5, 0), (1.0, 0), (0.5, 3)])
def test_the_kv_cache_gives_the_tokens_of_the_recomputing_reference(alpha_0, window):
    model, config = tiny_model(window=window), EsoSamplerConfig(steps=3)

    def run(kv_cache: bool):
        generators = [torch.Generator().manual_seed(s) for s in (1, 2)]
        return sample_eso(model, config, canvas(2, 3, 12), alpha_0, generators, kv_cache)

    cached, reference = run(True), run(False)
    assert torch.equal(cached.tokens, reference.tokens)
    assert not (cached.tokens == VOCAB).any()
    diffused = round(alpha_0 * 9)
    assert cached.nfe == reference.nfe == min(3, diffused) + (9 - diffused)


def test_at_alpha_0_of_zero_greedy_sampling_follows_the_chain_rule():
    model = tiny_model()
    greedy = EsoSamplerConfig(steps=1, sampling=SamplingConfig(temperature=0.0))
    result = sample_eso(model, greedy, canvas(1, 2, 7), 0.0, [torch.Generator()])
    row = result.tokens[0]
    for position in range(2, 7):
        inputs = torch.cat([row[:position], torch.tensor([VOCAB])])[None]
        logits = model(inputs, attention="causal")[0, -1, :VOCAB]
        assert int(logits.argmax()) == int(row[position])


def test_chunks_split_the_diffusion_phase_evenly():
    assert chunk_sizes(7, 3) == [3, 2, 2]
    assert chunk_sizes(2, 5) == [1, 1] and chunk_sizes(0, 4) == []


def test_an_eso_run_trains_scores_and_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run = tmp_path / "eso"
    summary = cli.train_from_argv(
        ["--preset", "tiny", "--objective", "eso", "--alpha-0", "0.25", "--out", str(run)]
        + ["--max-steps", "3", "--eval-every", "100", "--cache-dir", str(tmp_path / "cache")]
    )
    assert summary["finished"] and summary["metric"] == "nelbo"
    assert math.isfinite(summary["val_nats_per_token"])
    result = evaluate_checkpoint(
        str(run), samples=2, max_rows=4, batch_size=8, cache_dir=str(tmp_path / "cache")
    )
    assert math.isfinite(result["estimates"]["nelbo"]["nats_per_token"])
    generator = DiffusionGenerator.from_checkpoint(run)
    output = generator.generate(["In the", "In the"], 8, EsoSamplerConfig(steps=2), eos="none")
    # 8 positions at alpha_0 = 0.25: 2 in the diffusion phase (2 chunks), 6 one by one
    assert output.nfe == 8 and [len(ids) for ids in output.tokens] == [8, 8]
    with pytest.raises(ValueError, match="cannot sample with SamplerConfig"):
        generator.generate(["In the"], 8, SamplerConfig(FixedCount(steps=8)))


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan"])
def test_alpha_0_outside_zero_one_is_refused_in_one_line(value, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    argv = ["--preset", "tiny", "--objective", "eso", "--alpha-0", value, "--out", str(out)]
    with pytest.raises((ConfigError, SystemExit)) as refused:
        cli.train_from_argv(argv + ["--max-steps", "1"])
    said = str(refused.value)
    assert f"alpha_0={value}" in said or f"alpha_0 (--alpha-0)={value}" in said, said
    assert "[0, 1]" in said or "finite" in said, said
    assert not out.exists()
    with pytest.raises(ConfigError, match=r"alpha_0 \(--alpha-0\)=1.5 must be in \[0, 1\]"):
        EsoSamplerConfig(steps=2, alpha_0=1.5).validate()


def test_the_sampling_command_samples_an_eso_run_and_refuses_other_samplers_options(
    tmp_path, monkeypatch, capsys
):
    from eval import cli as duolm

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run = tmp_path / "eso"
    cli.train_from_argv(
        ["--preset", "tiny", "--objective", "eso", "--alpha-0", "0.5", "--out", str(run)]
        + ["--max-steps", "2", "--eval-every", "100", "--cache-dir", str(tmp_path / "cache")]
    )
    capsys.readouterr()
    argv = ["sample", str(run), "--gen-length", "6", "--steps", "2", "--alpha-0", "0", "--json"]
    assert duolm.main(argv) == 0
    printed = capsys.readouterr().out
    assert '"objective": "eso"' in printed and '"sampler": "eso"' in printed
    assert '"nfe": 6' in printed  # alpha_0 = 0 from the command line: all six left to right
    assert duolm.main(["sample", str(run), "--threshold", "0.8"]) == 2
    assert "an eso (Eso-LM) model" in capsys.readouterr().err
    assert duolm.main(["sample", str(run), "--alpha-0", "2"]) == 2
    assert "alpha_0 (--alpha-0)=2.0 must be in [0, 1]" in capsys.readouterr().err


def test_the_main_job_takes_eso_as_a_family_with_its_own_sampler():
    from eval.experiments.compare_samples import diffusion_sampler_configs, sampling_flops_per_token
    from eval.experiments.compare_settings import COMPARE_PRESETS, objectives_asked

    assert objectives_asked("ar,mdm,eso") == ("ar", "mdm", "eso")
    configs = diffusion_sampler_configs(COMPARE_PRESETS["smoke"], "eso")
    assert [name for name, *_ in configs] == [
        "eso ancestral 4 steps",
        "eso ancestral 24 steps",
        "eso ancestral 24 steps T=0.8",
    ]
    assert all(isinstance(config, EsoSamplerConfig) for _, config, *_ in configs)
    # the KV cache: each position is processed twice (a query, then a clean key), BOS once,
    # whatever the number of evaluations; the masked sampler processes the canvas every time
    assert sampling_flops_per_token("eso", 30, 24, 1.0) == 49 / 24
    assert sampling_flops_per_token("mdm", 30, 24, 1.0) == 30 * 25 / 24


def test_a_windowed_permuted_row_sees_the_neighbours_of_its_positions():
    # window 3 over positions: the query at slot k sees the slots up to it whose positions lie
    # within 2 of its own (a key in its window may itself have seen others: depth widens it)
    model, length, window = tiny_model(window=3), 9, 3
    row = rows(1, length)[0]
    order = torch.tensor([[0, 5, 2, 7, 4, 1, 8, 3, 6]])
    attention = permuted_attention(window, order)
    assert attention.shape == (1, 1, length, length)
    for query in range(length):
        for key in range(length):
            near = abs(int(order[0, query]) - int(order[0, key])) < window
            assert bool(attention[0, 0, query, key]) == (key <= query and near)
    windowed = model(row[order], attention=attention, positions=order)
    unwindowed = model(row[order], attention="causal", positions=order)
    assert not torch.allclose(windowed, unwindowed)  # the window cuts what a query sees
    # in natural order the positional window is the model's own window over slots
    identity = torch.arange(length)[None]
    natural = model(row[None], attention=permuted_attention(window, identity), positions=identity)
    torch.testing.assert_close(natural, model(row[None], attention="causal"), rtol=1e-9, atol=0)
    # and without a window it is plain causal attention, which keeps the fast kernels
    assert permuted_attention(0, order) == "causal"


def test_a_windowed_eso_model_trains_and_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run = tmp_path / "eso"
    summary = cli.train_from_argv(
        ["--preset", "tiny", "--objective", "eso", "--sliding-window", "4", "--out", str(run)]
        + ["--max-steps", "2", "--eval-every", "100", "--cache-dir", str(tmp_path / "cache")]
    )
    assert summary["finished"] and math.isfinite(summary["val_nats_per_token"])
    generator = DiffusionGenerator.from_checkpoint(run)
    assert generator.model.config.sliding_window == 4
    output = generator.generate(["In the"], 8, EsoSamplerConfig(steps=2), eos="none")
    assert [len(ids) for ids in output.tokens] == [8]
