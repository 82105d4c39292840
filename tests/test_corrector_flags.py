"""The sampling command's corrector and EB flags (dllm/corrector_flags.py): they sample from
mdm and udm checkpoints, their limits give the plain samplers' texts, and every bad value is one
line naming the flag, the value and the valid range, with status 2 and nothing printed."""

import json
from pathlib import Path

import pytest

from dllm.sample import main
from shared.training import cli


def train(tmp_path_factory, objective: str) -> Path:
    root = tmp_path_factory.mktemp(objective)
    cli.train_from_argv(
        ["--preset", "tiny", "--objective", objective, "--out", str(root / "run")]
        + ["--cache-dir", str(root / "cache"), "--eval-every", "100", "--max-steps", "2"]
    )
    return root / "run"


@pytest.fixture(scope="module")
def mdm_run(tmp_path_factory) -> Path:
    return train(tmp_path_factory, "mdm")


def sampled(run: Path, capsys, *flags: str) -> dict:
    status = main([str(run), "--gen-length", "8", "--eos", "none", "--json", *flags])
    out = capsys.readouterr()
    assert status == 0, out.err
    return json.loads(out.out)


def test_remdm_and_eb_sample_from_an_mdm_checkpoint(mdm_run, capsys):
    plain = sampled(mdm_run, capsys, "--sampler", "ancestral", "--steps", "8")
    zero = sampled(mdm_run, capsys, "--remdm", "cap", "--eta", "0", "--steps", "8")
    assert zero["sampler"] == "remdm" and zero["texts"] == plain["texts"]
    loop = sampled(mdm_run, capsys, "--remdm", "loop", "--steps", "24")
    assert loop["steps"] == 24 and loop["nfe"] <= 24
    eb = sampled(mdm_run, capsys, "--sampler", "eb", "--gamma", "0")
    assert eb["sampler"] == "eb" and eb["revealed_per_step"] == [1] * 8


def test_psi_samples_from_a_udm_checkpoint(udm_run, capsys):
    plain = sampled(udm_run, capsys, "--steps", "6")
    same = sampled(udm_run, capsys, "--steps", "6", "--psi", "cap", "--eta", "0")
    assert same["texts"] == plain["texts"] and same["sampler"] == "uniform-psi"
    kappa = sampled(udm_run, capsys, "--steps", "6", "--kappa", "1")
    assert kappa["texts"] == plain["texts"] and kappa["sampler"] == "uniform-ancestral"
    assert sampled(udm_run, capsys, "--steps", "6", "--psi", "loop", "--eta", "0.05")["nfe"] == 6


BEFORE_LOADING = [
    (["--remdm", "cap", "--eta", "-0.1"], "error: --eta -0.1 is out of range: valid eta >= 0"),
    (["--remdm", "cap", "--eta", "1.5"],
     "error: --eta 1.5 is above its bound for mode cap: valid [0, 1]"),
    (["--remdm", "loop", "--eta", "0.5"],
     "error: --eta 0.5 is above its bound for mode loop: valid [0, 0.1111]"),
    (["--remdm", "loop", "--t-on", "0.1", "--t-off", "0.5"],
     "error: --t-on 0.1, --t-off 0.5 are out of range: valid 0 <= t_off < t_on <= 1"),
    (["--remdm", "cap", "--t-on", "0.3", "--t-off", "0.3"],
     "error: --t-on 0.3, --t-off 0.3 are out of range: valid 0 <= t_off < t_on <= 1"),
    (["--remdm", "loop", "--alpha-on", "1.5"],
     "error: --alpha-on 1.5 is out of range: valid (0, 1)"),
    (["--psi", "loop", "--alpha-on", "0"], "error: --alpha-on 0.0 is out of range: valid (0, 1)"),
    (["--psi", "rescale", "--eta", "-1"],
     "error: --eta -1.0 is out of range for psi rescale: valid [0, 1]"),
    (["--sampler", "eb", "--gamma", "-0.5"],
     "error: --gamma -0.5 is out of range: valid gamma >= 0 (finite)"),
    (["--eta", "0.1"], "error: --eta applies to --remdm or --psi only (a corrector's knob)"),
    (["--remdm", "cap", "--sampler", "fixed"], "error: --remdm applies to ancestral steps, not "
     "--sampler fixed: leave --sampler out or give --sampler ancestral"),
    (["--sampler", "fixed", "--gamma", "0.1"],
     "error: --gamma only applies to --sampler eb, not --sampler fixed"),
]  # fmt: skip


@pytest.mark.parametrize("flags, line", BEFORE_LOADING)
def test_bad_values_are_refused_before_loading(flags, line, capsys, tmp_path):
    # the checkpoint does not exist: each refusal comes before anything is loaded
    assert main([str(tmp_path / "no-run"), *flags]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.splitlines() == [line]


def refused(run: Path, capsys, *flags: str) -> str:
    assert main([str(run), "--gen-length", "8", *flags]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.splitlines()) == 1
    return out.err.strip()


def test_sigma_above_its_bound_and_correctors_of_other_families(mdm_run, udm_run, capsys):
    line = refused(mdm_run, capsys, "--remdm", "constant", "--sigma", "0.5", "--steps", "8")
    assert line == "error: --sigma 0.5 is above its bound sigma_max over 8 steps: valid [0, 0.1667]"
    line = refused(mdm_run, capsys, "--psi", "cap")
    assert line.startswith("error: --psi only applies to udm checkpoints")
    line = refused(udm_run, capsys, "--remdm", "cap")
    assert line.startswith(f"error: --remdm does not apply to {udm_run}, a udm (uniform-state)")
    line = refused(udm_run, capsys, "--sampler", "eb")
    assert line.startswith("error: --sampler eb does not apply to")
