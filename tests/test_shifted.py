"""Shifted-logit masked diffusion (``shift_logits``: position i - 1's output predicts token i, as
Dream and DiffuLLaMA have it): the backbone's shift, the NELBO on the enumeration oracle, the
samplers' caches, and adapting an AR model with its head kept aligned."""

import json
from pathlib import Path

import pytest
import torch
from exact_mdm import TableDenoiser, exact_nelbo

from dllm.canvas import mask_token_id, prompt_canvas
from dllm.masked.objective import MaskedDiffusionObjective
from dllm.masked.sampler import sample
from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount
from shared.checkpoint import load_model_from_checkpoint
from shared.config import ModelConfig
from shared.errors import ConfigError
from shared.model import Transformer, shift_predictions
from shared.sampling import SamplingConfig
from shared.training import cli, new_run
from shared.training.warm_start import check_start, load_source_weights

PAD = 9


def test_a_shifted_model_reads_each_prediction_one_position_earlier():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=20, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_seq_len=16)
    plain = Transformer(cfg).eval()
    shifted = Transformer(ModelConfig(**{**cfg.to_dict(), "shift_logits": True})).eval()
    shifted.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 20, (3, 10))
    with torch.no_grad():
        own, moved = plain(tokens, "bidirectional"), shifted(tokens, "bidirectional")
        assert torch.equal(moved[:, 1:], own[:, :-1])
        assert torch.equal(moved[:, 0], own[:, 0])
        selected = torch.zeros_like(tokens, dtype=torch.bool)
        selected[:, [2, 7]] = True
        assert torch.equal(shifted(tokens, "bidirectional", output_mask=selected), moved[selected])
    assert "shift_logits" not in cfg.to_dict()  # off: configs read as before it existed


class ShiftedTable(TableDenoiser):
    """The oracle's table denoiser with the backbone's shift applied to its outputs."""

    def forward(self, tokens, attention, output_mask=None):
        logits = shift_predictions(self.table[self.index(tokens)])
        return logits if output_mask is None else logits[output_mask]


@pytest.mark.numerics
@pytest.mark.parametrize("estimator", ["time", "count"])
def test_the_shifted_nelbo_estimator_is_unbiased_on_the_enumeration_oracle(estimator):
    vocab, row = 3, [0, 2, 1, 0]
    model = ShiftedTable(vocab, len(row), seed=3)
    # The same denoiser written out: position i's logits are the table's at i - 1.
    written = TableDenoiser(vocab, len(row), table=shift_predictions(model.table))
    objective = MaskedDiffusionObjective(pad_id=PAD, estimator=estimator)
    objective.model_vocab_size(vocab)
    t_low = 1e-3 if estimator == "time" else 0.0
    exact = exact_nelbo(written, row, vocab, objective.schedule, t_low) / (len(row) - 1)
    unshifted = exact_nelbo(TableDenoiser(vocab, len(row), seed=3), row, vocab,
                            objective.schedule, t_low) / (len(row) - 1)  # fmt: skip
    assert abs(exact - unshifted) > 0.1  # the shift changes which prediction is scored
    tokens = torch.tensor([row] * 2000)
    generator = torch.Generator().manual_seed(0)
    means = []
    for _ in range(30):
        out = objective.loss(
            model, tokens, objective.sample_noise(len(tokens), len(row), generator)
        )
        means.append(float(out.nats) / int(out.n_tokens))
    mean = sum(means) / len(means)
    stderr = (sum((m - mean) ** 2 for m in means) / (len(means) - 1) / len(means)) ** 0.5
    assert abs(mean - exact) < 4 * stderr + 1e-9, (mean, exact, stderr)
    assert stderr < 0.02 * exact


@pytest.mark.numerics
def test_approximate_caches_of_a_shifted_model_are_exact_where_nothing_is_stale():
    """A one-layer network's keys and values depend on each position's own token only, so the
    caches are exact; for a shifted model only if the forward inside a block also covers the slot
    before it, whose output is the block's first prediction."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=12, dim=32, n_layers=1, n_heads=4, n_kv_heads=2,
                      hidden_dim=64, max_seq_len=64, shift_logits=True)  # fmt: skip
    model = Transformer(cfg).eval()
    canvas = prompt_canvas([[1, 2, 3], [4, 5, 6]], 16, bos_id=0, mask_id=mask_token_id(model),
                           max_seq_len=64)  # fmt: skip
    sampling = SamplingConfig(temperature=1.0)
    plain = SamplerConfig(FixedCount(16), block_length=4, sampling=sampling)
    want = sample(model, plain, canvas, torch.Generator().manual_seed(4)).tokens
    for cache in ("approx_prefix", "approx_dual"):
        config = SamplerConfig(FixedCount(16), block_length=4, sampling=sampling, cache=cache)
        got = sample(model, config, canvas, torch.Generator().manual_seed(4)).tokens
        assert torch.equal(got, want), cache


# ---------------------------------------------------------------- training


def tiny(out: Path, cache: Path, *extra: str) -> list[str]:
    return ["--preset", "tiny", "--out", str(out), "--cache-dir", str(cache),
            "--eval-every", "1000", "--log-every", "1", *extra]  # fmt: skip


def test_only_masked_diffusion_takes_shifted_logits(tmp_path):
    for objective in ("ar", "bd"):
        with pytest.raises(ConfigError, match="shift_logits is a masked-diffusion layout"):
            cli.train_from_argv(
                tiny(tmp_path / objective, tmp_path / "cache", "--objective", objective,
                     "--shift-logits", "true", "--max-steps", "2", "--block-size", "8")
            )  # fmt: skip


def test_a_shifted_mdm_from_ar_weights_starts_as_the_ar_model(tmp_path):
    """The DiffuLLaMA / Dream recipe: an MDM started from AR weights with shifted logits and
    causal attention (where annealing starts) predicts a masked token exactly as the AR model
    predicts it from the clean prefix; without the shift its head is one position off."""
    cache = tmp_path / "cache"
    source = tmp_path / "ar"
    cli.train_from_argv(tiny(source, cache, "--max-steps", "3"))
    ar_model, tokenizer, _ = load_model_from_checkpoint(source)
    rows = torch.randint(0, 256, (4, 12), generator=torch.Generator().manual_seed(0))
    rows[:, 0] = tokenizer.eos_id
    with torch.no_grad():
        ar_logits = ar_model(rows, "causal")
    for shift in ("true", "false"):
        out = tmp_path / f"mdm-{shift}"
        summary = cli.train_from_argv(
            tiny(out, cache, "--objective", "mdm", "--init-from", str(source),
                 "--shift-logits", shift, "--attention-anneal-steps", "4", "--max-steps", "4",
                 "--stop-after-steps", "1", "--lr", "1e-12")
        )  # fmt: skip
        assert summary["init_from"]["objective"] == "ar"
        config = json.loads((out / "config.json").read_text())
        assert config["model_config"].get("shift_logits", False) == (shift == "true")
        mdm = Transformer(ModelConfig.from_dict(config["model_config"]))
        mdm.load_state_dict(started_weights(source, mdm))
        noised = rows.clone()
        noised[:, 7] = mask_token_id(mdm)
        with torch.no_grad():
            predicted = mdm(noised, "causal")[:, 7, : tokenizer.vocab_size]
        same = torch.allclose(predicted, ar_logits[:, 6], atol=1e-5)
        assert same == (shift == "true")


def started_weights(source: Path, model: Transformer) -> dict[str, torch.Tensor]:
    """The weights an MDM run initialised from ``source`` starts with."""
    spec = new_run("tiny", source.parent / "unused", objective="mdm", init_from=str(source),
                   shift_logits=model.config.shift_logits)  # fmt: skip
    found = check_start(spec.model, spec.train, spec.out, resuming=False)
    load_source_weights(found, model, model.config.vocab_size - 1)
    return model.state_dict()
