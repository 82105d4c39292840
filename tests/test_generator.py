"""DiffusionGenerator against the low-level chain it replaces (canvas + sampler + EOS policy +
decode), token for token, for masked (mdm) and block (bd) diffusion; the [MASK] id; and the one
sampling command line on an mdm and a bd checkpoint."""

import json

import pytest
import torch

from dllm import sample as sample_cli
from dllm.block.sampler import grid_blocks, sample_blocks
from dllm.canvas import apply_eos_policy, infill_canvas, mask_token_id, prompt_canvas
from dllm.generator import DiffusionGenerator
from dllm.masked.sampler import sample
from dllm.sampler import SamplerConfig, with_model_schedule
from dllm.strategies import Ancestral, FixedCount, Threshold
from shared.checkpoint import full_model_state, save_checkpoint
from shared.config import ModelConfig
from shared.model import Transformer
from shared.sampling import SamplingConfig
from shared.tokenizer import Tokenizer

VOCAB = 20  # token ids 0..19 for the tokenizer-free models; [MASK] = 20
BOS = 0  # = EOS, as <|endoftext|> in the project: frequent under a random model of 20 ids
PAD = 19
BLOCK = 4
MAX_LEN = 32
TOKENIZER = Tokenizer.byte()

CONFIGS = {
    "ancestral": SamplerConfig(Ancestral(12)),
    "fixed_random": SamplerConfig(FixedCount(12, "random")),
    "fixed_greedy": SamplerConfig(FixedCount(6), sampling=SamplingConfig(temperature=0)),
    "threshold": SamplerConfig(Threshold(0.2), sampling=SamplingConfig(temperature=0.8)),
}


def tiny_model(vocab_size: int, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=vocab_size,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        hidden_dim=48,
        max_seq_len=MAX_LEN,
    )
    return Transformer(config).eval()


def run_state(objective: str) -> dict:
    """What a checkpoint saves about the run; the cosine schedule shows that the generator
    applies the model's own schedule to an ancestral rule without one."""
    train = {"schedule": "cosine", "seq_len": MAX_LEN}
    if objective == "bd":
        train["block_size"] = BLOCK
    return {"objective": objective, "train_config": train}


def old_chain(model, objective, config, canvas, *, seed, eos, eos_id, pad_id, early_stop=True):
    """Canvas -> sampler -> EOS policy, wired up by hand as the evaluators did before the
    generator: (raw result, generated ids per row)."""
    config = with_model_schedule(config, run_state(objective))
    generator = torch.Generator().manual_seed(seed)
    if objective == "mdm":
        raw = sample(model, config, canvas, generator)
    else:
        stop = eos_id if eos == "stop" and early_stop else None
        raw = sample_blocks(model, config, canvas, BLOCK, generator, eos_id=stop)
    tokens, lengths = apply_eos_policy(raw.tokens, raw.region, eos, eos_id=eos_id, pad_id=pad_id)
    start = raw.region[0]
    return raw, [row[start : start + n].tolist() for row, n in zip(tokens, lengths.tolist())]


def assert_same_raw(result, raw):
    assert torch.equal(result.raw.tokens, raw.tokens)
    assert result.nfe == raw.nfe and result.raw.nfe_per_step == raw.nfe_per_step
    assert torch.equal(result.raw.revealed, raw.revealed)
    assert result.raw.block_of_step == raw.block_of_step and result.raw.cache == raw.cache


# ---- the generator against the low-level chain ---------------------------------------------------


@pytest.mark.parametrize("eos", ["stop", "pad", "none"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("objective", ["mdm", "bd"])
def test_token_prompts_match_the_low_level_chain(objective, name, eos):
    model = tiny_model(VOCAB + 1, seed=1)
    generator = DiffusionGenerator(model, state=run_state(objective), eos_id=BOS, pad_id=PAD)
    prompts = [[3, 4], [5, 6], [7, 8]]
    result = generator.generate(prompts, 9, CONFIGS[name], seed=5, eos=eos)

    canvas = prompt_canvas(prompts, 9, bos_id=BOS, mask_id=VOCAB, max_seq_len=MAX_LEN)
    raw, ids = old_chain(
        model, objective, CONFIGS[name], canvas, seed=5, eos=eos, eos_id=BOS, pad_id=PAD
    )
    assert result.tokens == ids and result.texts is None
    assert_same_raw(result, raw)


def test_eos_policies_cut_where_eos_is_drawn():
    """The random 20-id model draws EOS often: "stop" cuts before it, "pad" keeps full rows."""
    model = tiny_model(VOCAB + 1, seed=1)
    generator = DiffusionGenerator(model, state=run_state("mdm"), eos_id=BOS, pad_id=PAD)
    config = CONFIGS["fixed_random"]
    drawn = generator.generate([[3, 4]] * 4, 13, config, seed=5, eos="none").tokens
    stopped = generator.generate([[3, 4]] * 4, 13, config, seed=5, eos="stop").tokens
    padded = generator.generate([[3, 4]] * 4, 13, config, seed=5, eos="pad").tokens
    assert any(BOS in row for row in drawn)
    for row, cut, pad in zip(drawn, stopped, padded):
        first = row.index(BOS) if BOS in row else len(row)
        assert cut == row[:first]
        assert pad == row[:first] + [BOS] * (len(row) - first)


def test_bd_early_stop_skips_blocks_but_not_tokens():
    model = tiny_model(VOCAB + 1, seed=1)
    generator = DiffusionGenerator(model, state=run_state("bd"), eos_id=BOS, pad_id=PAD)
    config = SamplerConfig(FixedCount(24, "random"))
    early = generator.generate([[3]], 22, config, seed=6)  # EOS at generated position 6
    full = generator.generate([[3]], 22, config, seed=6, early_stop=False)
    canvas = prompt_canvas([[3]], 22, bos_id=BOS, mask_id=VOCAB, max_seq_len=MAX_LEN)
    raw, ids = old_chain(
        model, "bd", config, canvas, seed=6, eos="stop", eos_id=BOS, pad_id=PAD, early_stop=False
    )
    assert full.tokens == early.tokens == ids and len(ids[0]) == 6
    assert_same_raw(full, raw)
    assert early.nfe < full.nfe
    uncached = generator.generate([[3]], 22, config, seed=6, early_stop=False, kv_cache=False)
    assert uncached.tokens == full.tokens and uncached.raw.cache == "none"


@pytest.mark.parametrize("objective", ["mdm", "bd"])
def test_text_and_id_prompts_match_the_low_level_chain(objective):
    model = tiny_model(TOKENIZER.vocab_size + 1, seed=2)
    generator = DiffusionGenerator(model, TOKENIZER, run_state(objective))
    texts = ["In the", "And he"]
    config = CONFIGS["ancestral"]
    result = generator.generate(texts, 12, config, seed=7)

    canvas = prompt_canvas(
        TOKENIZER.encode_batch(texts),
        12,
        bos_id=TOKENIZER.eos_id,
        mask_id=model.config.vocab_size - 1,
        max_seq_len=MAX_LEN,
    )
    raw, ids = old_chain(
        model,
        objective,
        config,
        canvas,
        seed=7,
        eos="stop",
        eos_id=TOKENIZER.eos_id,
        pad_id=TOKENIZER.pad_id,
    )
    assert result.tokens == ids
    assert result.texts == [TOKENIZER.decode(row) for row in ids]
    assert_same_raw(result, raw)
    by_ids = generator.generate([TOKENIZER.encode(t) for t in texts], 12, config, seed=7)
    assert by_ids.tokens == result.tokens and by_ids.texts == result.texts


@pytest.mark.parametrize("objective", ["mdm", "bd"])
def test_suffix_infilling_matches_the_low_level_chain(objective):
    model = tiny_model(TOKENIZER.vocab_size + 1, seed=3)
    generator = DiffusionGenerator(model, TOKENIZER, run_state(objective))
    config = SamplerConfig(FixedCount(8), sampling=SamplingConfig(temperature=0.7))
    result = generator.generate(["In the"], 5, config, seed=1, suffix=" end.")

    # As dllm.sample built it: the prompt and the suffix as fixed positions of an infill canvas.
    prompt, suffix = TOKENIZER.encode("In the"), TOKENIZER.encode(" end.")
    fixed = {1 + i: t for i, t in enumerate(prompt)}
    fixed |= {1 + len(prompt) + 5 + j: t for j, t in enumerate(suffix)}
    length = 1 + len(prompt) + 5 + len(suffix)
    canvas = infill_canvas(
        length, fixed, bos_id=TOKENIZER.eos_id, mask_id=TOKENIZER.vocab_size, max_seq_len=MAX_LEN
    )
    assert torch.equal(generator.prompt_canvas(["In the"], 5, suffix=" end.").tokens, canvas.tokens)
    raw, ids = old_chain(
        model,
        objective,
        config,
        canvas,
        seed=1,
        eos="stop",
        eos_id=TOKENIZER.eos_id,
        pad_id=TOKENIZER.pad_id,
    )
    assert result.tokens == ids and result.texts == [TOKENIZER.decode(ids[0])]
    assert_same_raw(result, raw)
    assert result.raw.tokens[0, -len(suffix) :].tolist() == suffix  # the suffix is kept
    by_ids = generator.generate([prompt], 5, config, seed=1, suffix=suffix)
    assert by_ids.tokens == result.tokens


def test_fixed_positions_and_per_row_generators():
    model = tiny_model(VOCAB + 1, seed=4)
    generator = DiffusionGenerator(model, eos_id=BOS, pad_id=PAD)  # no state: an mdm model
    fixed = [{1: 3, 5: 4}, {2: 6, 9: 7}]
    canvas = generator.infill_canvas(10, fixed)
    expected = infill_canvas(10, fixed, bos_id=BOS, mask_id=VOCAB, max_seq_len=MAX_LEN)
    assert torch.equal(canvas.tokens, expected.tokens)
    config = CONFIGS["fixed_random"]
    rows = [torch.Generator().manual_seed(s) for s in (8, 9)]
    result = generator.fill(canvas, config, generator=rows, eos="none")
    again = [torch.Generator().manual_seed(s) for s in (8, 9)]
    assert torch.equal(result.raw.tokens, sample(model, config, expected, again).tokens)


def test_schedule_defaults_to_linear_without_a_state():
    model = tiny_model(VOCAB + 1, seed=4)
    generator = DiffusionGenerator(model, eos_id=BOS, pad_id=PAD)
    config = SamplerConfig(Ancestral(8))
    result = generator.generate([[3]], 8, config, seed=0)
    canvas = prompt_canvas([[3]], 8, bos_id=BOS, mask_id=VOCAB, max_seq_len=MAX_LEN)
    raw = sample(model, config, canvas, torch.Generator().manual_seed(0))  # linear fallback
    assert torch.equal(result.raw.tokens, raw.tokens)


def test_steps_per_position():
    model = tiny_model(VOCAB + 1)
    mdm = DiffusionGenerator(model, state=run_state("mdm"), eos_id=BOS)
    bd = DiffusionGenerator(model, state=run_state("bd"), eos_id=BOS)
    canvas = mdm.prompt_canvas([[3, 4]], 9)  # generates positions 3..11
    assert mdm.steps_per_position(canvas) == 9
    assert bd.steps_per_position(canvas) == len(grid_blocks((3, 12), BLOCK, 12)) * BLOCK == 12


# ---- the [MASK] id, and refusals -----------------------------------------------------------------


def test_mask_token_id_is_the_row_after_the_tokenizer():
    model = tiny_model(TOKENIZER.vocab_size + 1)
    assert mask_token_id(model) == mask_token_id(model, TOKENIZER) == TOKENIZER.vocab_size
    assert DiffusionGenerator(model, TOKENIZER).mask_id == TOKENIZER.vocab_size


def test_refusals_are_clear():
    ar_sized = tiny_model(TOKENIZER.vocab_size)  # no [MASK] row
    with pytest.raises(ValueError, match=r"258 rows, but a diffusion model needs the tokenizer"):
        mask_token_id(ar_sized, TOKENIZER)
    with pytest.raises(ValueError, match=r"objective 'ar': diffusion generation needs"):
        DiffusionGenerator(ar_sized, TOKENIZER, {"objective": "ar"})
    model = tiny_model(VOCAB + 1)
    generator = DiffusionGenerator(model, eos_id=BOS)
    config = CONFIGS["fixed_random"]
    with pytest.raises(ValueError, match="not one string"):
        generator.generate("In the", 4, config)
    with pytest.raises(ValueError, match="text prompts need a tokenizer"):
        generator.generate(["In the"], 4, config)
    with pytest.raises(ValueError, match="eos='stop' needs a padding id"):
        generator.generate([[3]], 4, config, eos="stop")
    with pytest.raises(ValueError, match="eos policy 'halt' is unknown"):
        generator.generate([[3]], 4, config, eos="halt")
    with pytest.raises(ValueError, match="kv_cache=False applies to block diffusion"):
        generator.generate([[3]], 4, config, eos="none", kv_cache=False)


# ---- the command line on saved checkpoints -------------------------------------------------------


def save_run(root, objective: str):
    model = tiny_model(TOKENIZER.vocab_size + (objective != "ar"), seed=5)
    state = {**run_state(objective), "model_config": model.config.to_dict()}
    return save_checkpoint(
        root, 0, weights=full_model_state(model), tokenizer=TOKENIZER, state=state
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("generator")
    return {objective: save_run(root / objective, objective) for objective in ("mdm", "bd", "ar")}


def run_cli(capsys, *argv):
    code = sample_cli.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("objective", ["mdm", "bd"])
def test_command_line_samples_either_objective(checkpoints, capsys, objective):
    path = checkpoints[objective]
    argv = [path, "--prompt", "In the", "--gen-length", "9", "--seed", "3", "--json"]
    code, out, err = run_cli(capsys, *argv, "--sampler", "ancestral", "--num-samples", "2")
    assert code == 0, err
    report = json.loads(out)
    assert report["objective"] == objective and report["sampler"] == "ancestral"

    # The same request through the low-level chain: one step per decoded position by default.
    model = DiffusionGenerator.from_checkpoint(path).model
    canvas = prompt_canvas(
        [TOKENIZER.encode("In the")] * 2,
        9,
        bos_id=TOKENIZER.eos_id,
        mask_id=TOKENIZER.vocab_size,
        max_seq_len=MAX_LEN,
    )
    steps = 9 if objective == "mdm" else len(grid_blocks(canvas.region, BLOCK, 16)) * BLOCK
    config = SamplerConfig(Ancestral(steps))
    raw, ids = old_chain(
        model,
        objective,
        config,
        canvas,
        seed=3,
        eos="stop",
        eos_id=TOKENIZER.eos_id,
        pad_id=TOKENIZER.pad_id,
    )
    assert report["texts"] == [TOKENIZER.decode(row) for row in ids]
    assert report["nfe"] == raw.nfe and report["steps"] == raw.steps
    assert report["revealed_per_step"] == raw.revealed.sum(-1).tolist()
    assert report["cache"] == ("none" if objective == "mdm" else "bd_kv")
    assert report["approximate"] is False

    code, out, _ = run_cli(capsys, *argv[:-1], "--sampler", "ancestral", "--num-samples", "2")
    assert code == 0 and out.splitlines() == report["texts"]


def test_command_line_refuses_options_of_the_other_objective(checkpoints, capsys):
    mdm, bd, ar = checkpoints["mdm"], checkpoints["bd"], checkpoints["ar"]
    cases = [
        ((mdm, "--no-kv-cache"), "--no-kv-cache only applies to bd checkpoints, and "),
        ((bd, "--cache", "approx_dual"), "--cache only applies to mdm checkpoints, and "),
        ((bd, "--cfg-scale", "1.0"), "--cfg-scale only applies to mdm checkpoints, and "),
        ((bd, "--block-length", "2"), "block_length=2 must be None or the model's block_size=4"),
        ((ar,), f"{ar} was trained with objective 'ar': diffusion generation needs an 'mdm'"),
    ]
    for argv, message in cases:
        code, _, err = run_cli(capsys, *argv, "--gen-length", "8")
        assert code == 2
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), lines
