"""Every user error of the sampling and evaluation command lines is one line and exit status 2,
with the flag named; random flag values never end in a traceback."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arlm import sample as ar_sample
from dllm import sample as diffusion_sample
from eval import likelihood
from shared.errors import ConfigError
from shared.training import cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tiny_mdm_run"


@pytest.fixture
def tiny_ar(tiny_runs) -> Path:
    return tiny_runs["ar"]


def one_line_error(command: list[str | bytes]) -> str:
    done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True)
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def test_sampling_flags_name_themselves(tmp_path, tiny_ar):
    message = one_line_error(["-m", "dllm.sample", str(FIXTURE), "--gen-length", "0"])
    assert "--gen-length=0 must be >= 1" in message
    message = one_line_error(["-m", "arlm.sample", str(tiny_ar), "--prompts-file", str(tmp_path)])
    assert f"--prompts-file {tmp_path} is a folder" in message
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9\n".encode("latin-1"))
    message = one_line_error(["-m", "arlm.sample", str(tiny_ar), "--prompts-file", str(latin1)])
    assert "is not UTF-8 text" in message
    for module, checkpoint in (("arlm.sample", tiny_ar), ("dllm.sample", FIXTURE)):
        message = one_line_error(["-m", module, str(checkpoint), "--prompt", b"caf\xe9"])
        assert "--prompt must be UTF-8 text" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_device_on_a_cpu_machine_is_one_line(tiny_ar):
    message = one_line_error(
        ["-m", "arlm.sample", str(tiny_ar), "--prompt", "", "--device", "cuda"]
    )
    assert "--device cuda: this torch build" in message and "--device cpu" in message
    message = one_line_error(["-m", "dllm.sample", str(FIXTURE), "--device", "cuda"])
    assert "--device cuda" in message


def test_the_default_lengths_fit_a_small_context(tiny_ar, capsys):
    # the tiny preset's max_seq_len is 64: BOS + prompt + 64 new tokens would not fit
    assert ar_sample.main([str(tiny_ar), "--prompt", "In the", "--temperature", "0"]) == 0
    assert diffusion_sample.main([str(FIXTURE), "--prompt", "In the", "--steps", "4"]) == 0
    capsys.readouterr()
    long_prompt = "x" * 80
    assert diffusion_sample.main([str(FIXTURE), "--prompt", long_prompt]) == 2
    assert "fills the model's context of max_seq_len=64" in capsys.readouterr().err


def test_likelihood_json_target_is_checked_before_the_work(tmp_path, capsys):
    code = likelihood.main([str(FIXTURE), "--max-rows", "2", "--json", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 2 and "is a folder" in captured.err and captured.out == ""
    code = likelihood.main([str(FIXTURE), "--max-rows", "2", "--json", "/sys/duolm.json"])
    captured = capsys.readouterr()
    assert code == 2 and "cannot be written" in captured.err and captured.out == ""
    target = tmp_path / "out.json"
    assert likelihood.main([str(FIXTURE), "--max-rows", "2", "--json", str(target)]) == 0
    assert json.loads(target.read_text())["estimates"]["nelbo"]["tokens"] > 0


def test_resuming_a_changed_shape_names_the_tensors(tmp_path):
    out = tmp_path / "run"
    argv = ["--preset", "tiny", "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    cli.train_from_argv([*argv, "--max-steps", "2", "--eval-every", "100"])
    message = one_line_error(
        ["train.py", "--resume", str(out), "--allow-config-change", "--dim", "64"]
        + ["--max-steps", "4"]
    )
    assert "tensors have another shape" in message
    assert "layers.0.attention.wq.weight (32, 32) vs (64, 64)" in message
    assert "cannot continue from these weights" in message


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed"
)
def test_a_tracker_that_is_not_installed_is_refused(tmp_path):
    argv = ["--preset", "tiny", "--out", str(tmp_path), "--log-with", "tensorboard"]
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        cli.train_from_argv(argv)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_an_unknown_tracker_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="'nope' is not a tracker"):
        cli.train_from_argv(["--preset", "tiny", "--out", str(tmp_path), "--log-with", "nope"])


def call(main, argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as done:  # argparse: a malformed value
        return done.code


FLAG_VALUES = {
    "--gen-length": st.integers(-3, 40),
    "--steps": st.integers(-3, 40),
    "--num-samples": st.integers(-2, 3),
    "--block-length": st.integers(-2, 40),
    "--temperature": st.floats(-1, 3) | st.just(float("nan")),
    "--top-p": st.floats(-1, 2) | st.just(float("nan")),
    "--threads": st.integers(-2, 2),
    "--sampler": st.sampled_from(["ancestral", "fixed", "threshold", "bogus"]),
    "--eos": st.sampled_from(["stop", "pad", "none", "x"]),
    "--prompt": st.text(max_size=12),
}


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(sorted(FLAG_VALUES)), st.just(None), max_size=4), st.data())
def test_random_diffusion_sampling_flags_never_raise(chosen, data):
    argv = [str(FIXTURE)]
    for flag in chosen:
        argv += [flag, str(data.draw(FLAG_VALUES[flag]))]
    assert call(diffusion_sample.main, argv) in (0, 2)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.integers(-2, 3),
    st.sampled_from([-1, 1, 2]),
    st.sampled_from(["time", "count", "x"]),
    st.booleans(),
)
def test_random_likelihood_flags_never_raise(samples, max_rows, estimator, chain):
    argv = [str(FIXTURE), "--samples", str(samples), "--max-rows", str(max_rows)]
    argv += ["--estimator", estimator, "--batch-size", "4"]
    if chain:
        argv += ["--chain-rule-rows", "1"]
    assert call(likelihood.main, argv) in (0, 2)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.integers(-2, 70) | st.none(),
    st.floats(-1, 2) | st.just(float("nan")),
    st.integers(-2, 5),
    st.text(max_size=8),
)
def test_random_ar_sampling_flags_never_raise(tiny_ar, max_new, temperature, top_k, prompt):
    argv = [str(tiny_ar), "--prompt", prompt, "--temperature", str(temperature)]
    argv += ["--top-k", str(top_k)]
    if max_new is not None:
        argv += ["--max-new-tokens", str(max_new)]
    assert call(ar_sample.main, argv) in (0, 2)
