"""``--init-from``: a run starts from another run's weights (AR -> MDM adds the [MASK] row, MDM ->
AR drops it, same objective copies exactly, uniform diffusion takes no [MASK] row), refuses a
source of another shape or tokenizer, records the source and its compute; and
``--attention-anneal-steps`` eases a bidirectional objective from causal to full attention over
its first steps."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dllm.masked.objective import MaskedDiffusionObjective
from shared import checkpoint as ckpt
from shared.config import ModelConfig
from shared.errors import CheckpointError, ConfigError
from shared.model import Transformer, flops_per_token
from shared.objective import annealed_attention, annealing_noise
from shared.training import cli, new_run
from shared.training.warm_start import check_start, load_source_weights

TOKENIZER_VOCAB = 258  # the tiny preset's byte tokenizer


def tiny(out: Path, cache: Path, *extra: str) -> list[str]:
    return [
        "--preset",
        "tiny",
        "--out",
        str(out),
        "--cache-dir",
        str(cache),
        "--eval-every",
        "1000",
        "--log-every",
        "1",
        *extra,
    ]


@pytest.fixture(scope="module")
def ar_source(tmp_path_factory, cache_dir) -> Path:
    """A tiny AR run trained well below the uniform loss (no final validation, to stay fast)."""
    out = tmp_path_factory.mktemp("runs") / "ar"
    summary = cli.train_from_argv(
        tiny(out, cache_dir, "--max-steps", "150", "--stop-after-steps", "120", "--lr", "1e-2")
    )
    assert summary["step"] == 120
    return out


def first_loss(out: Path) -> float:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(r["loss"] for r in records if r["kind"] == "train")


def one_mdm_step(out: Path, cache: Path, *extra: str) -> dict:
    """One MDM training step (of 4, so no final validation), logged."""
    args = tiny(out, cache, "--objective", "mdm", "--max-steps", "4", "--stop-after-steps", "1")
    return cli.train_from_argv([*args, *extra])


def started_model(source: Path, **overrides) -> tuple[Transformer, str]:
    """The model a new run initialised from ``source`` starts with (before any step)."""
    spec = new_run("tiny", source.parent / "unused", init_from=str(source), **overrides)
    found = check_start(spec.model, spec.train, spec.out, resuming=False)
    extra = 1 if spec.train.objective in ("mdm", "bd") else 0
    model = Transformer(spec.model.with_vocab(TOKENIZER_VOCAB + extra))
    return model, load_source_weights(found, model, TOKENIZER_VOCAB)


def source_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt.resolve_checkpoint(run) / "model.safetensors"))


def test_ar_to_mdm_copies_every_weight_and_adds_a_mean_mask_row(ar_source):
    model, said = started_model(ar_source, objective="mdm")
    assert "added a [MASK] row" in said
    source, own = source_weights(ar_source), model.state_dict()
    assert source.keys() == own.keys()
    for name, tensor in source.items():
        if name in ("tok_embeddings.weight", "output.weight"):
            assert own[name].shape[0] == TOKENIZER_VOCAB + 1
            assert torch.equal(own[name][:TOKENIZER_VOCAB], tensor), name
        else:
            assert torch.equal(own[name], tensor), name
    assert torch.allclose(own["tok_embeddings.weight"][-1], source["tok_embeddings.weight"].mean(0))
    assert torch.equal(own["output.weight"][-1], torch.zeros(32))  # never predicted (SUBS)


def test_tied_embeddings_share_the_mean_mask_row(tmp_path, cache_dir):
    tied = tmp_path / "tied"
    cli.train_from_argv(tiny(tied, cache_dir, "--max-steps", "3", "--tie-embeddings", "true"))
    model, _ = started_model(tied, objective="mdm", tie_embeddings=True)
    source = source_weights(tied)["output.weight"]  # the tied pair is stored once
    assert model.output.weight is model.tok_embeddings.weight
    assert torch.equal(model.output.weight[:TOKENIZER_VOCAB], source)
    assert torch.allclose(model.output.weight[-1], source.mean(0))


def test_a_run_takes_its_sources_shape_unless_a_flag_says_otherwise(tmp_path, cache_dir):
    source = tmp_path / "wide"
    cli.train_from_argv(
        tiny(source, cache_dir, "--max-steps", "2", "--tie-embeddings", "true", "--dim", "48",
             "--hidden-dim", "96", "--rope-theta", "500.0")
    )  # fmt: skip
    spec = new_run("tiny", tmp_path / "x", objective="mdm", init_from=str(source))
    assert (spec.model.dim, spec.model.hidden_dim, spec.model.tie_embeddings) == (48, 96, True)
    assert spec.model.rope_theta == 500.0 and spec.train.tokenizer == "byte"
    typed = new_run("tiny", tmp_path / "y", objective="mdm", init_from=str(source), dim=64)
    assert typed.model.dim == 64  # then refused by check_start, naming the field (tested below)
    missing = new_run("tiny", tmp_path / "z", init_from=str(tmp_path / "nowhere"))
    assert missing.model.dim == 32  # the preset's: the missing source is reported by check_start


def test_an_adapted_mdm_starts_far_below_a_fresh_one(ar_source, tmp_path, cache_dir):
    fresh = one_mdm_step(tmp_path / "fresh", cache_dir)
    adapted = one_mdm_step(tmp_path / "adapted", cache_dir, "--init-from", str(ar_source))
    # The same first batch and noise (same seed): the fresh model is near uniform (ln 259 = 5.56
    # nats, times the noise of the 1/t weights); the AR weights already know the text.
    assert first_loss(tmp_path / "fresh") > 5.0
    assert first_loss(tmp_path / "adapted") < first_loss(tmp_path / "fresh") - 1.0
    assert fresh["init_from"] is None
    record = adapted["init_from"]
    checkpoint = ckpt.resolve_checkpoint(ar_source)
    manifest = json.loads((checkpoint / ckpt.MANIFEST).read_text())
    assert record["path"] == str(ar_source) and record["checkpoint"] == str(checkpoint.resolve())
    assert record["step"] == 120 and record["objective"] == "ar"
    assert record["weights_sha256"] == manifest["model.safetensors"]
    assert record["tokens_seen"] == 120 * 8 * 32 == record["total_tokens_seen"]
    source_shape = ModelConfig.from_dict(ckpt.read_state(checkpoint)["model_config"])
    assert record["flops"] == record["tokens_seen"] * flops_per_token(source_shape, 32)
    config = json.loads((tmp_path / "adapted" / "config.json").read_text())
    assert config["init_from"] == record and config["train_config"]["init_from"] == str(ar_source)
    state = ckpt.read_state(ckpt.resolve_checkpoint(tmp_path / "adapted"))
    assert state["init_from"] == record

    # Resuming continues from the run's own checkpoint, keeps the record, and refuses to change
    # the source (an identity field) unless allowed.
    resume = ["--resume", str(tmp_path / "adapted"), "--cache-dir", str(cache_dir)]
    with pytest.raises(ConfigError, match="init_from: checkpoint"):
        cli.train_from_argv([*resume, "--init-from", str(tmp_path / "fresh")])
    resumed = cli.train_from_argv([*resume, "--init-from", str(ar_source), "--max-steps", "2"])
    assert resumed["step"] == 2 and resumed["init_from"] == record

    # A source that was itself initialised from another run adds its compute to the totals; MDM
    # -> MDM copies every tensor, the [MASK] row included.
    model, said = started_model(tmp_path / "adapted", objective="mdm")
    assert "copied exactly" in said
    source = source_weights(tmp_path / "adapted")
    assert all(torch.equal(model.state_dict()[name], t) for name, t in source.items())
    spec = new_run("tiny", tmp_path / "x", objective="mdm", init_from=str(tmp_path / "adapted"))
    chained = check_start(spec.model, spec.train, spec.out, resuming=False).record
    assert chained["total_tokens_seen"] == record["tokens_seen"] + 2 * 8 * 32
    assert chained["total_flops"] == pytest.approx(chained["flops"] + record["flops"])

    # MDM -> AR drops the [MASK] row.
    model, said = started_model(tmp_path / "adapted", objective="ar")
    assert "dropped the [MASK] row" in said
    own = model.state_dict()
    assert torch.equal(own["tok_embeddings.weight"], source["tok_embeddings.weight"][:-1])
    assert torch.equal(own["output.weight"], source["output.weight"][:-1])


def test_uniform_diffusion_starts_from_ar_or_mdm_weights_without_a_mask_row(
    ar_source, tmp_path, cache_dir
):
    # udm's support is the tokenizer's ids: AR -> udm copies every tensor, MDM -> udm drops the
    # [MASK] row (the rows of real tokens are kept as they are)
    model, said = started_model(ar_source, objective="udm")
    assert "copied exactly" in said
    source, own = source_weights(ar_source), model.state_dict()
    assert source.keys() == own.keys()
    assert all(torch.equal(own[name], tensor) for name, tensor in source.items())

    one_mdm_step(tmp_path / "mdm", cache_dir)
    model, said = started_model(tmp_path / "mdm", objective="udm")
    assert "dropped the [MASK] row" in said
    source, own = source_weights(tmp_path / "mdm"), model.state_dict()
    assert torch.equal(own["tok_embeddings.weight"], source["tok_embeddings.weight"][:-1])
    assert own["output.weight"].shape[0] == TOKENIZER_VOCAB


def test_a_source_of_another_shape_or_tokenizer_is_refused_naming_each_field(ar_source, tmp_path):
    spec = new_run("tiny", tmp_path / "x", objective="mdm", init_from=str(ar_source), dim=64)
    with pytest.raises(ConfigError) as refused:
        check_start(spec.model, spec.train, spec.out, resuming=False)
    assert str(refused.value) == f"--init-from {ar_source}: dim=32 in the source, 64 in this run"
    argv = tiny(tmp_path / "y", tmp_path / "cache", "--init-from", str(ar_source))
    with pytest.raises(ConfigError) as refused:
        cli.train_from_argv([*argv, "--n-layers", "3", "--tokenizer", "gpt2"])
    message = str(refused.value)
    assert "n_layers=2 in the source, 3 in this run" in message
    assert "tokenizer='byte' in the source, 'gpt2' in this run" in message
    assert not (tmp_path / "y").exists()  # refused before the run touched its folder


def test_a_missing_or_empty_source_is_one_clear_line(tmp_path, capsys):
    argv = tiny(tmp_path / "run", tmp_path / "cache", "--objective", "mdm")
    with pytest.raises(CheckpointError, match=r"--init-from .*nowhere: .* does not exist"):
        cli.train_from_argv([*argv, "--init-from", str(tmp_path / "nowhere")])
    (tmp_path / "empty").mkdir()
    assert cli.main([*argv, "--init-from", str(tmp_path / "empty")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: --init-from") and "no checkpoints found" in error
    assert len(error.splitlines()) == 1


def test_a_source_inside_the_run_folder_is_refused(ar_source):
    spec = new_run("tiny", ar_source, objective="mdm", init_from=str(ar_source))
    with pytest.raises(ConfigError, match="inside this run's own folder"):
        check_start(spec.model, spec.train, spec.out, resuming=False)


# ---- attention annealing ------------------------------------------------------------------------


def step_noise(
    step: int, anneal_steps: int, rows: int = 3, length: int = 12, window: int = 0
) -> dict:
    generator = torch.Generator().manual_seed(7)
    objective = MaskedDiffusionObjective(pad_id=0, mask_id=TOKENIZER_VOCAB)
    noise = objective.sample_noise(rows, length, generator)
    return noise | annealing_noise(anneal_steps, step, rows, generator, window)


def test_annealing_is_causal_at_step_zero_rising_and_full_from_step_k():
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    assert torch.equal(annealed_attention(step_noise(0, 10), "bidirectional", 12, "cpu"), causal)
    middle = annealed_attention(step_noise(5, 10), "bidirectional", 12, "cpu")
    assert torch.equal(middle & causal, causal)
    seen = middle[~causal].float().mean()
    assert 0.3 < seen < 0.7  # half the future positions, drawn at random
    for step, k in ((10, 10), (11, 10), (0, 0)):
        full = annealed_attention(step_noise(step, k), "bidirectional", 12, "cpu")
        assert full == "bidirectional"
    # A pure function of the step's generator, and it leaves the objective's own noise as is.
    assert torch.equal(step_noise(5, 10)["anneal_seed"], step_noise(5, 10)["anneal_seed"])
    assert torch.equal(step_noise(5, 10)["uniforms"], step_noise(5, 0)["uniforms"])


def test_the_mdm_loss_honours_the_annealed_mask():
    torch.manual_seed(0)
    model = Transformer(new_run("tiny").model.with_vocab(TOKENIZER_VOCAB + 1)).eval()
    tokens = torch.randint(1, TOKENIZER_VOCAB, (3, 12))
    objective = MaskedDiffusionObjective(pad_id=0, mask_id=TOKENIZER_VOCAB)
    annealed = objective.loss(model, tokens, step_noise(0, 10)).nats
    full = objective.loss(model, tokens, step_noise(10, 10)).nats
    objective.attention = "causal"  # what step 0 must have used
    causal = objective.loss(model, tokens, step_noise(10, 10)).nats
    assert torch.allclose(annealed, causal, atol=1e-5) and not torch.allclose(annealed, full)


def test_annealing_is_refused_where_it_cannot_apply(tmp_path):
    with pytest.raises(ConfigError, match="trains with 'causal' attention"):
        new_run("tiny", tmp_path, attention_anneal_steps=10)


def test_annealing_keeps_the_sliding_window():
    """A mask tensor replaces the model's own window, so the annealed mask must carry it: at
    step 0 the loss equals the windowed causal model's, and no step sees past the window."""
    distance = torch.arange(12)[:, None] - torch.arange(12)[None, :]
    band = distance.abs() < 4
    for step in (0, 5, 9):
        mask = annealed_attention(step_noise(step, 10, window=4), "bidirectional", 12, "cpu")
        assert not (mask & ~band).any()
    torch.manual_seed(0)
    config = new_run("tiny", sliding_window=4).model.with_vocab(TOKENIZER_VOCAB + 1)
    model = Transformer(config).eval()
    tokens = torch.randint(1, TOKENIZER_VOCAB, (3, 12))
    objective = MaskedDiffusionObjective(pad_id=0, mask_id=TOKENIZER_VOCAB)
    annealed = objective.loss(model, tokens, step_noise(0, 10, window=4)).nats
    objective.attention = "causal"  # the model applies its own window to the named attention
    causal = objective.loss(model, tokens, step_noise(10, 10)).nats
    assert torch.allclose(annealed, causal, atol=1e-5)


def test_an_annealed_adaptation_trains(ar_source, tmp_path, cache_dir):
    out = tmp_path / "annealed"
    anneal = ("--attention-anneal-steps", "2", "--stop-after-steps", "3")
    summary = one_mdm_step(out, cache_dir, "--init-from", str(ar_source), *anneal)
    assert summary["step"] == 3 and summary["init_from"]["step"] == 120
    config = json.loads((out / "config.json").read_text())["train_config"]
    assert config["attention_anneal_steps"] == 2
