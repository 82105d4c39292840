"""Diffusion families: a family added from outside the package trains, is scored and samples
through the same entries as the built-in ones, and the old module paths still work."""

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import dllm.families
import shared.objective
from dllm.canvas import mask_token_id
from dllm.families import Family, SampleRequest, family_names, register_family
from dllm.generator import DiffusionGenerator
from dllm.masked.objective import MaskedDiffusionObjective
from dllm.predictors import CountingModel, FullForward
from dllm.sampler import SamplerConfig, SampleResult
from dllm.strategies import FixedCount
from eval.likelihood import evaluate_checkpoint
from shared.objective import register_objective
from shared.training import cli

ROOT = Path(__file__).resolve().parent.parent

# ---- the toy family: everything a family defines, in a few lines ------------------------------


class ToyObjective(MaskedDiffusionObjective):
    """The toy family's objective: the masked diffusion loss under a name of its own."""

    name = "toy"


@dataclass(frozen=True)
class OneShotConfig:
    """The toy sampler's settings: there are none; it fills every masked position at once."""


@torch.no_grad()
def one_shot(request: SampleRequest) -> SampleResult:
    """Fill every [MASK] of the canvas with the most likely token, in one full forward."""
    canvas = request.canvas
    counter = CountingModel(request.model)
    tokens = canvas.tokens.clone()
    start, end = 0, canvas.length
    logits = FullForward(counter, canvas.mask_id)(tokens, (start, end))
    masked = tokens == canvas.mask_id
    tokens = torch.where(masked, logits.argmax(-1), tokens)
    return SampleResult(
        tokens=tokens,
        region=canvas.region,
        nfe=counter.calls,
        revealed=masked.sum(-1)[None],
        nfe_per_step=[counter.calls],
        block_of_step=[0],
        cache="none",
        approximate=False,
    )


TOY_FAMILY = Family(
    name=ToyObjective.name, config_type=OneShotConfig, sample=one_shot, generation_id=mask_token_id
)


@pytest.fixture
def toy_family(monkeypatch, tmp_path):
    """Register the toy family for one test; both registries are restored afterwards."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    shared.objective.objective_names()  # load the installed objectives into the real registry
    monkeypatch.setattr(shared.objective, "_REGISTRY", dict(shared.objective._REGISTRY))
    monkeypatch.setattr(dllm.families, "_FAMILIES", dict(dllm.families._FAMILIES))
    register_objective(ToyObjective)
    register_family(TOY_FAMILY)
    return TOY_FAMILY


def test_importing_dllm_registers_the_three_families():
    assert family_names()[:3] == ["mdm", "bd", "udm"]
    assert {"mdm", "bd", "udm"} <= set(shared.objective.objective_names())


def test_a_family_registered_from_outside_trains_scores_and_samples(toy_family, tmp_path):
    run = tmp_path / "toy"
    summary = cli.train_from_argv(
        ["--preset", "tiny", "--objective", "toy", "--out", str(run), "--max-steps", "3"]
        + ["--eval-every", "100", "--cache-dir", str(tmp_path / "cache")]
    )
    assert summary["finished"] and summary["objective"] == "toy"
    assert summary["metric"] == "nelbo" and math.isfinite(summary["val_nats_per_token"])

    result = evaluate_checkpoint(
        str(run), samples=2, max_rows=4, batch_size=8, cache_dir=str(tmp_path / "cache")
    )
    assert result["objective"] == "toy"
    assert math.isfinite(result["estimates"]["nelbo"]["nats_per_token"])

    generator = DiffusionGenerator.from_checkpoint(run)
    assert generator.family is toy_family and generator.block_size is None
    output = generator.generate(["In the", "In the"], 8, OneShotConfig(), eos="none")
    assert output.nfe == 1 and [len(ids) for ids in output.tokens] == [8, 8]
    assert generator.mask_id not in output.raw.tokens
    assert all(isinstance(text, str) for text in output.texts)
    with pytest.raises(ValueError, match="a 'toy' model cannot sample with SamplerConfig"):
        generator.generate(["In the"], 8, SamplerConfig(FixedCount(steps=8)))


def test_a_family_name_is_registered_once(toy_family):
    register_family(toy_family)  # the same family again is no change
    with pytest.raises(ValueError, match="'toy' is registered twice"):
        register_family(Family("toy", SamplerConfig, one_shot, mask_token_id))
