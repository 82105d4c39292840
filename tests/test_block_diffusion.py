"""Block diffusion: masks by brute force, the one-pass trick against per-block forwards, the two
limits (block size L = MDM, block size 1 = prediction from the clean prefix), the exact KV cache
of the sampler, parameter parity, and train.py end to end."""

import json
import math

import pytest
import torch

from dllm import sample as sample_cli
from dllm.block.objective import (
    BlockDiffusionObjective,
    block_causal_mask,
    stratified_block_times,
    two_stream_block_mask,
    two_stream_mask,
)
from dllm.block.sampler import grid_blocks, sample_blocks
from dllm.canvas import prompt_canvas
from dllm.masked.objective import MaskedDiffusionObjective
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral, FixedCount, Threshold
from eval.likelihood import evaluate_checkpoint
from shared.checkpoint import list_checkpoints
from shared.config import ModelConfig
from shared.errors import ConfigError
from shared.model import Transformer
from shared.objective import build_objective
from shared.sampling import SamplingConfig
from shared.training import cli

VOCAB = 20  # tokenizer ids 0..19; [MASK] = 20
BOS = 0
PAD = 19


def tiny_model(max_seq_len: int = 16, seed: int = 0, dtype=torch.float32) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=VOCAB + 1,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        hidden_dim=48,
        max_seq_len=max_seq_len,
    )
    return Transformer(cfg).to(dtype).eval()


def rows(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, PAD, (batch, length), generator=g)
    tokens[:, 0] = BOS
    return tokens


def objective(block_size: int, **options) -> BlockDiffusionObjective:
    obj = build_objective("bd", pad_id=PAD, block_size=block_size, **options)
    obj.model_vocab_size(VOCAB)
    return obj


# ---- masks -------------------------------------------------------------------------------------

SHAPES = [(4, 1), (6, 2), (6, 3), (8, 8), (9, 3), (8, 4)]


@pytest.mark.parametrize("length,block_size", SHAPES)
def test_two_stream_mask_matches_brute_force(length, block_size):
    expected = torch.zeros(2 * length, 2 * length, dtype=torch.bool)
    for q in range(2 * length):
        for k in range(2 * length):
            q_noisy, k_noisy = q < length, k < length
            bq, bk = (q % length) // block_size, (k % length) // block_size
            if q_noisy and k_noisy:
                expected[q, k] = bq == bk
            elif q_noisy:
                expected[q, k] = bk < bq
            elif not k_noisy:
                expected[q, k] = bk <= bq
    assert torch.equal(two_stream_mask(length, block_size), expected)


@pytest.mark.parametrize("length,block_size", SHAPES)
def test_block_causal_mask_matches_brute_force(length, block_size):
    expected = torch.tensor(
        [[k // block_size <= q // block_size for k in range(length)] for q in range(length)]
    )
    assert torch.equal(block_causal_mask(length, block_size), expected)


# ---- the objective -----------------------------------------------------------------------------


def test_model_accepts_a_longer_input_with_positions_below_max_seq_len():
    model = tiny_model(max_seq_len=8)
    tokens = rows(2, 16)
    positions = torch.arange(8).repeat(2)
    assert model(tokens, attention="bidirectional", positions=positions).shape == (2, 16, 21)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model(tokens, attention="bidirectional")
    with pytest.raises(ValueError, match="positions must lie in 0..7"):
        model(tokens, attention="bidirectional", positions=torch.arange(16))


@pytest.mark.parametrize("block_size", [1, 2, 4, 8])
def test_one_pass_logits_equal_separate_forwards_per_block(block_size):
    model = tiny_model()
    length = 8
    obj = objective(block_size)
    clean = rows(3, length)
    noise = obj.sample_noise(3, length, torch.Generator().manual_seed(1))
    noised, masked, _ = obj.noise_rows(clean, noise, clean != PAD)
    with torch.no_grad():
        one_pass = obj.noisy_logits(model, noised, clean)
        for start in range(0, length, block_size):
            end = start + block_size
            inputs = torch.cat([clean[:, :start], noised[:, start:end]], dim=1)
            mask = block_causal_mask(end, block_size)
            separate = model(inputs, attention=mask)[:, start:end]
            torch.testing.assert_close(one_pass[:, start:end], separate, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pad_is_data", [False, True])
@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_block_size_equal_to_the_row_is_the_mdm_loss(schedule, pad_is_data):
    model = tiny_model()
    length = 10
    tokens = rows(4, length)
    # padding is never counted; it is noised and predicted only when it is data (padded rows)
    tokens[1, 7:] = PAD
    bd = objective(length, schedule=schedule)
    bd.pad_is_data = pad_is_data
    mdm = MaskedDiffusionObjective(pad_id=PAD, schedule=schedule, pad_is_data=pad_is_data)
    mdm.model_vocab_size(VOCAB)
    noise = bd.sample_noise(4, length, torch.Generator().manual_seed(3))
    assert noise["t"].shape == (4, 1)
    mdm_noise = {"t": noise["t"][:, 0], "uniforms": noise["uniforms"]}
    with torch.no_grad():
        got, want = bd.loss(model, tokens, noise), mdm.loss(model, tokens, mdm_noise)
    assert int(got.n_tokens) == int(want.n_tokens) == 4 * 9 - 3
    assert got.nats.item() == pytest.approx(want.nats.item(), rel=1e-5)
    torch.testing.assert_close(got.row_nats, want.row_nats, rtol=1e-5, atol=1e-6)


def test_block_size_one_at_t_one_predicts_each_token_from_its_clean_prefix():
    # Every token masked (t = 1, linear weight 1): token i is predicted by a [MASK] query at
    # position i that sees only the clean tokens before it, i.e. causal attention.
    model = tiny_model()
    length = 7
    obj = objective(1)
    tokens = rows(2, length)
    noise = {
        "t": torch.ones(2, length, dtype=torch.float64),
        "uniforms": torch.rand(2, length, dtype=torch.float64),
    }
    with torch.no_grad():
        out = obj.loss(model, tokens, noise)
        manual = torch.zeros(2, dtype=torch.float64)
        for i in range(1, length):
            inputs = tokens[:, : i + 1].clone()
            inputs[:, i] = obj.mask_id
            logits = model(inputs, attention="causal")[:, i, :VOCAB]
            manual -= torch.log_softmax(logits.double(), -1).gather(1, tokens[:, i : i + 1])[:, 0]
    assert int(out.n_tokens) == 2 * (length - 1)
    torch.testing.assert_close(out.row_nats, manual, rtol=1e-5, atol=1e-5)


def test_bos_is_never_masked_and_blocks_use_their_own_time():
    obj = objective(4)
    tokens = rows(1, 8)
    noise = {
        "t": torch.tensor([[1.0, 1e-9]], dtype=torch.float64),
        "uniforms": torch.full((1, 8), 0.5, dtype=torch.float64),
    }
    _, masked, weight = obj.noise_rows(tokens, noise, tokens != PAD)
    # Block 0 at t = 1: every position but BOS masked; block 1 at t ~ 0: nothing masked.
    assert masked[0].tolist() == [False, True, True, True, False, False, False, False]
    assert weight[0, :4].tolist() == [1.0] * 4


def test_stratified_block_times_cover_the_clipped_range():
    g = torch.Generator().manual_seed(0)
    t = stratified_block_times(4, 3, g, 0.3, 0.8)
    assert t.shape == (4, 3)
    assert bool(((t >= 0.3) & (t <= 0.8)).all())
    # One value per stratum of width 0.5 / 12.
    strata = torch.floor((t.flatten() - 0.3) / (0.5 / 12)).long().sort().values
    assert strata.tolist() == list(range(12))
    obj = objective(2, t_eps=0.3, t_max=0.8)
    noise = obj.sample_noise(5, 8, g)
    assert noise["t"].shape == (5, 4) and noise["uniforms"].shape == (5, 8)
    assert float(noise["t"].min()) >= 0.3 and float(noise["t"].max()) <= 0.8


def test_bad_options_name_the_field():
    with pytest.raises(ValueError, match="block_size=0"):
        build_objective("bd", pad_id=PAD, block_size=0)
    with pytest.raises(ValueError, match="t_max=0.5"):
        build_objective("bd", pad_id=PAD, block_size=2, t_eps=0.5, t_max=0.5)
    with pytest.raises(ValueError, match="block_size=3 must divide the row length 8"):
        objective(3).sample_noise(2, 8, torch.Generator())


def test_parameter_parity_with_ar_and_mdm():
    counts = {}
    for name in ("ar", "mdm", "bd"):
        options = {"block_size": 4} if name == "bd" else {}
        obj = build_objective(name, pad_id=PAD, **options)
        cfg = ModelConfig(
            vocab_size=obj.model_vocab_size(VOCAB), dim=32, n_layers=2, n_heads=4, n_kv_heads=2
        )
        counts[name] = Transformer(cfg).num_parameters()
    assert counts["bd"] == counts["mdm"]
    assert counts["bd"] - counts["ar"] == 2 * 32  # the [MASK] row of the embedding and the head


# ---- sampling ----------------------------------------------------------------------------------


def test_grid_blocks_follow_the_training_grid():
    assert grid_blocks((3, 13), 4, 13) == [(0, 4), (4, 8), (8, 12), (12, 13)]
    assert grid_blocks((4, 8), 4, 8) == [(4, 8)]


STRATEGIES = [
    Ancestral(steps=8),
    FixedCount(steps=8, remasking="low_confidence"),
    FixedCount(steps=12, remasking="random"),
    Threshold(threshold=0.2),
]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: type(s).__name__)
def test_kv_cache_sampling_is_exact(strategy):
    model = tiny_model(seed=2, dtype=torch.float64)
    canvas = prompt_canvas([[3, 4], [5, 6]], 10, bos_id=BOS, mask_id=VOCAB, max_seq_len=16)
    config = SamplerConfig(strategy, sampling=SamplingConfig(temperature=1.0))
    cached = sample_blocks(model, config, canvas, 4, torch.Generator().manual_seed(7))
    plain = sample_blocks(
        model, config, canvas, 4, torch.Generator().manual_seed(7), kv_cache=False
    )
    assert torch.equal(cached.tokens, plain.tokens)
    assert torch.equal(cached.tokens[:, :3], canvas.tokens[:, :3])  # BOS and prompt kept
    assert not (cached.tokens == VOCAB).any()
    assert cached.nfe == plain.nfe and cached.nfe_per_step == plain.nfe_per_step
    assert cached.block_of_step == plain.block_of_step
    assert torch.equal(cached.revealed, plain.revealed)
    assert cached.revealed.sum(0).tolist() == [10, 10]


def test_kv_cache_feeds_only_the_uncached_tokens():
    model = tiny_model(seed=2)
    fed: list[int] = []
    model.register_forward_hook(lambda module, args, output: fed.append(args[0].shape[1]))
    canvas = prompt_canvas([[3, 4]], 9, bos_id=BOS, mask_id=VOCAB, max_seq_len=16)
    config = SamplerConfig(FixedCount(steps=6), reuse_predictions=False)
    sample_blocks(model, config, canvas, 4, torch.Generator().manual_seed(0))
    # Blocks (0,4) (one masked slot: one step), (4,8) and (8,12) (two steps each). The first
    # call of a block also commits the finished block before it; later calls feed the block alone.
    assert fed == [4, 8, 4, 8, 4]
    fed.clear()
    sample_blocks(model, config, canvas, 4, torch.Generator().manual_seed(0), kv_cache=False)
    assert fed == [4, 8, 8, 12, 12]


def test_sampling_stops_after_the_block_with_eos():
    model = tiny_model(seed=4)
    canvas = prompt_canvas([[3]], 14, bos_id=BOS, mask_id=VOCAB, max_seq_len=16)
    config = SamplerConfig(FixedCount(steps=16), sampling=SamplingConfig(temperature=0.0))
    full = sample_blocks(model, config, canvas, 4, torch.Generator().manual_seed(0))
    # Declare the token greedy decoding puts at position 5 (block 1) to be EOS.
    eos = int(full.tokens[0, 5])
    first_eos = int((full.tokens[0, 2:] == eos).nonzero()[0]) + 2
    stop_block = first_eos // 4
    stopped = sample_blocks(model, config, canvas, 4, torch.Generator().manual_seed(0), eos_id=eos)
    done = (stop_block + 1) * 4
    assert max(stopped.block_of_step) == stop_block
    assert torch.equal(stopped.tokens[:, :done], full.tokens[:, :done])
    assert bool((stopped.tokens[:, done:] == eos).all())
    assert stopped.nfe < full.nfe


def test_sampler_rejects_unsupported_settings():
    model = tiny_model()
    canvas = prompt_canvas([[3]], 6, bos_id=BOS, mask_id=VOCAB, max_seq_len=16)
    with pytest.raises(ValueError, match="block_length=2"):
        sample_blocks(model, SamplerConfig(FixedCount(steps=2), block_length=2), canvas, 4)
    with pytest.raises(ValueError, match="cache='approx_dual'"):
        sample_blocks(model, SamplerConfig(FixedCount(steps=2), cache="approx_dual"), canvas, 4)


# ---- train.py ----------------------------------------------------------------------------------


def test_train_smoke_sample_and_bad_block_size(tmp_path, capsys):
    args = ["--objective", "bd", "--preset", "tiny", "--cache-dir", str(tmp_path / "cache")]
    run = tmp_path / "run"
    # A clipped training range: validation still estimates the NELBO over [t_eps, 1].
    summary = cli.train_from_argv(
        [*args, "--block-size", "4", "--t-max", "0.8", "--max-steps", "20", "--out", str(run)]
    )
    assert summary["finished"] and summary["objective"] == "bd"
    assert summary["metric"] == "nelbo" and math.isfinite(summary["val_nats_per_token"])
    checkpoint = list_checkpoints(run / "checkpoints")[-1]
    result = evaluate_checkpoint(
        str(checkpoint), samples=2, max_rows=4, batch_size=8, cache_dir=str(tmp_path / "cache")
    )
    assert math.isfinite(result["estimates"]["nelbo"]["nats_per_token"])
    capsys.readouterr()  # drop the training log
    outputs = []
    for extra in ([], ["--no-kv-cache"]):
        argv = [str(run), "--prompt", "In the", "--gen-length", "9", "--seed", "3", "--json"]
        assert sample_cli.main([*argv, *extra]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == {**outputs[1], "cache": "bd_kv"}
    assert outputs[0]["sampler"] == "fixed" and outputs[0]["nfe"] >= 1
    with pytest.raises(ConfigError, match="block_size=5 must divide seq_len=32"):
        cli.train_from_argv(
            [*args, "--block-size", "5", "--max-steps", "2", "--out", str(tmp_path / "x")]
        )
    with pytest.raises(ConfigError, match="block_size=0"):
        cli.train_from_argv([*args, "--max-steps", "2", "--out", str(tmp_path / "y")])


# ---- flex attention ----------------------------------------------------------------------------


def test_the_flex_block_mask_is_the_two_stream_mask():
    for length, block in ((8, 2), (12, 4), (16, 16)):
        block_mask = two_stream_block_mask(length, block, torch.device("cpu"))
        query = torch.arange(2 * length)[:, None]
        key = torch.arange(2 * length)[None, :]
        zero = torch.zeros((), dtype=torch.long)
        elementwise = block_mask.mask_mod(zero, zero, query, key)
        assert torch.equal(elementwise, two_stream_mask(length, block))


def test_flex_and_sdpa_give_the_same_block_diffusion_logits():
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=40, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=64, max_seq_len=32
    )
    model = Transformer(config).eval()
    objective = BlockDiffusionObjective(pad_id=0, block_size=4, mask_id=39)
    tokens = torch.randint(1, 39, (3, 16))
    noise = objective.sample_noise(3, 16, torch.Generator().manual_seed(1))
    noised, _, _ = objective.noise_rows(tokens, noise, tokens != 0)
    with torch.no_grad():
        objective.flex = False
        sdpa = objective.noisy_logits(model, noised, tokens)
        objective.flex = True
        flex = objective.noisy_logits(model, noised, tokens)
        loss_flex = objective.loss(model, tokens, noise).nats
        objective.flex = False
        loss_sdpa = objective.loss(model, tokens, noise).nats
    assert torch.allclose(flex, sdpa, atol=1e-5, rtol=1e-5)
    assert torch.allclose(loss_flex, loss_sdpa, atol=1e-5, rtol=1e-5)
