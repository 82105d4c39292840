"""Checkpoints written before the restructure still load, score and sample exactly as they did
(and resume once their pickled training state is converted), and the typed training API runs
the same training as the command line."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dllm import strategies
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral
from eval.likelihood import evaluate_checkpoint
from shared.training import cli, convert, new_run, resume_run, train

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tiny_mdm_run"


def recording_draw_margins(monkeypatch) -> list[float]:
    """Record, for every categorical draw of the diffusion sampler, how far its uniform lands
    from the nearest boundary of the cumulative distribution (as a share of the total mass): a
    change of the probabilities smaller than that cannot change the token drawn."""
    margins: list[float] = []
    draw = strategies.sample_categorical

    def recorded(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        twin = torch.Generator()
        twin.set_state(generator.get_state())  # the uniforms the real draw is about to take
        tokens = draw(probs, generator)
        cdf = probs.double().cumsum(-1)
        uniforms = torch.rand(cdf.shape[:-1] + (1,), generator=twin, dtype=torch.float64)
        distance = (cdf - uniforms * cdf[..., -1:]).abs() / cdf[..., -1:]
        margins.append(float(distance.min()))
        return tokens

    monkeypatch.setattr(strategies, "sample_categorical", recorded)
    return margins


def test_a_checkpoint_written_by_the_earlier_layout_scores_and_samples_as_before(monkeypatch):
    # Numbers recorded with the code that wrote the fixture (tiny MDM, step 12), on another
    # machine. Another CPU (other SIMD kernels, other summation orders) moves the likelihood in
    # its last bits (3e-9 relative seen between an Intel AMX and an AMD AVX-512 machine); a
    # layout or loading mistake moves it in the first digits. So: 1e-6 relative.
    results = evaluate_checkpoint(str(FIXTURE), samples=2, max_rows=16, batch_size=8)
    nelbo = results["estimates"]["nelbo"]
    assert nelbo["tokens"] == 496
    assert nelbo["nats_per_token"] == pytest.approx(4.490383885241076, rel=1e-6, abs=0)
    # The same tokens on any CPU, because no draw is near a tie: every uniform lands at least
    # 1e-5 of the mass away from a boundary of its distribution (3.7e-4 at this seed), while
    # kernels that differ in summation order move these probabilities by about 1e-7.
    margins = recording_draw_margins(monkeypatch)
    generated = DiffusionGenerator.from_checkpoint(FIXTURE).generate(
        ["In the"], 16, SamplerConfig(Ancestral(8)), seed=3
    )
    assert len(margins) == 7 and min(margins) > 1e-5
    result = generated.raw
    assert result.nfe == 7
    assert result.tokens.tolist() == [
        [256, 73, 110, 32, 116, 104, 101, 108, 32, 147, 50, 195, 130, 246, 39, 116, 147, 128]
        + [99, 104, 72, 158, 96]
    ]


def test_a_checkpoint_written_by_the_earlier_layout_resumes(tmp_path):
    # Its training state is pickled, which a resume refuses: converted first, as a user would.
    old = Path(shutil.copytree(FIXTURE, tmp_path / "old"))
    assert convert.convert(old, log=lambda _: None) == 1
    spec = resume_run(old, tmp_path / "resumed", max_steps=14, cache_dir=str(tmp_path))
    assert spec.resume_from.name == "step_000012" and spec.train.objective == "mdm"
    summary = train(spec)
    assert summary["step"] == 14 and summary["finished"]


def test_typed_api_and_command_line_train_the_same_model(tmp_path):
    common = {"objective": "mdm", "max_steps": 3, "eval_every": 100, "cache_dir": str(tmp_path)}
    typed = train(new_run("tiny", tmp_path / "typed", **common))
    flags = ["--objective", "mdm", "--max-steps", "3", "--eval-every", "100"]
    argv = ["--preset", "tiny", "--out", str(tmp_path / "cli"), "--cache-dir", str(tmp_path)]
    from_cli = cli.train_from_argv([*argv, *flags])
    assert typed["val_nats_per_token"] == from_cli["val_nats_per_token"]
    for name in ("typed", "cli"):
        saved = json.loads((tmp_path / name / "config.json").read_text())
        assert saved["preset"] == "tiny" and saved["train_config"]["max_steps"] == 3
    weights = [
        load_file(str(tmp_path / name / "checkpoints/step_000003/model.safetensors"))
        for name in ("typed", "cli")
    ]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
