"""``train.py`` never scatters a user's files, a refusal writes nothing, and the numbers it
records are true: ``--out .`` is not moved into itself, a folder of other files is not trained
into (nor moved by --overwrite), a seed beyond 32 bits names its flag, a shape flag against an
``--init-from`` source names both, an MFU above 100% is a warning naming the peak, the measured
peak does not drop with the machine's load, and an imported source's compute is unknown rather
than zero."""

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from shared import checkpoint as ckpt
from shared import hardware
from shared.errors import ConfigError
from shared.training import cli, new_run, train
from shared.training.trainer import Trainer
from shared.training.warm_start import source_record


@pytest.fixture(scope="module")
def two_step_ar_run(tmp_path_factory, cache_dir) -> Path:
    out = tmp_path_factory.mktemp("runs") / "ar"
    cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "2"))
    return out


def tiny(out: Path | str, cache: Path, *extra: str) -> list[str]:
    return ["--preset", "tiny", "--out", str(out), "--cache-dir", str(cache), *extra]


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_out_dot_with_overwrite_refuses_and_moves_nothing(
    two_step_ar_run, tmp_path, cache_dir, monkeypatch
):
    run = Path(shutil.copytree(two_step_ar_run, tmp_path / "run"))
    before = names(run)
    monkeypatch.chdir(run)
    with pytest.raises(ConfigError, match="cannot be moved aside: .* is the current folder"):
        cli.train_from_argv(tiny(".", cache_dir, "--max-steps", "1", "--overwrite"))
    assert names(run) == before
    assert not list(tmp_path.glob("*.replaced-*")) and not list(run.glob(".replaced-*"))


def test_a_folder_of_other_files_refuses_a_run_even_with_overwrite(tmp_path, cache_dir):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "config.json").write_text('{"lr": 1}')  # a user's own config.json is not a run's
    for overwrite in ([], ["--overwrite"]):
        with pytest.raises(ConfigError, match="duolm did not make .config.json"):
            cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "1", *overwrite))
        assert names(out) == ["config.json", "notes.txt"]  # and no .lock either
    assert not list(tmp_path.glob("mine.replaced-*"))


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--seed", str(2**32)], "--seed"),
        (["--eval-seed", str(2**32)], "--eval-seed"),
        (["--lr-schedule", "wsd", "--branch-budgets", "5"], "inside its warmup"),
        (["--lr-schedule", "wsd", "--cooldown-fraction", "1"], "inside its warmup"),
    ],
)
def test_a_refused_run_leaves_no_folder_and_no_lock(tmp_path, cache_dir, flags, said):
    with pytest.raises(ConfigError, match=said):
        cli.train_from_argv(tiny(tmp_path / "new" / "run", cache_dir, "--max-steps", "10", *flags))
    assert names(tmp_path) == []


def test_a_shape_flag_against_the_init_from_source_names_the_source(
    two_step_ar_run, tmp_path, cache_dir
):
    argv = tiny(
        tmp_path / "x", cache_dir, "--objective", "mdm", "--init-from", str(two_step_ar_run)
    )
    with pytest.raises(ConfigError) as refused:
        cli.train_from_argv([*argv, "--dim", "30"])
    assert (
        str(refused.value) == f"--init-from {two_step_ar_run}: dim=32 in the source, 30 in this run"
    )
    assert names(tmp_path) == []


def test_an_mfu_above_100_percent_is_one_warning_naming_the_peak(tmp_path, cache_dir, capsys):
    argv = tiny(tmp_path / "run", cache_dir, "--max-steps", "3", "--log-every", "1")
    cli.train_from_argv([*argv, "--peak-tflops", "0.000001"])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert text.count("warning: MFU") == 1
    assert "is above 100%: the peak it divides by, 1e-06 TFLOP/s (--peak-tflops)" in text


def test_the_measured_peak_is_the_best_kept_for_this_device(tmp_path, monkeypatch):
    monkeypatch.delenv(hardware.PEAK_VARIABLE, raising=False)  # the test run sets one
    rates = iter([2e11, 5e10])  # an idle start-up, then one on a busy machine
    monkeypatch.setattr(hardware, "matmul_rate", lambda device, dtype: next(rates))
    cpu = torch.device("cpu")
    idle = hardware.peak_flops(cpu, torch.float32, 0.0, tmp_path)
    busy = hardware.peak_flops(cpu, torch.float32, 0.0, tmp_path)
    assert idle[0] == busy[0] == 2e11
    assert "best matmul rate measured" in busy[1] and "now 0.05" in busy[1]


def test_a_machine_peak_from_the_environment_is_used_unless_a_flag_gives_one(monkeypatch):
    monkeypatch.setattr(hardware, "matmul_rate", lambda device, dtype: pytest.fail("measured"))
    cpu = torch.device("cpu")
    monkeypatch.setenv(hardware.PEAK_VARIABLE, "0.25")
    assert hardware.peak_flops(cpu, torch.float32, 0.0) == (0.25e12, "DUOLM_PEAK_TFLOPS=0.25")
    assert hardware.peak_flops(cpu, torch.float32, 2.0) == (2e12, "--peak-tflops")
    for bad in ("fast", "0", "-1", "inf", "nan"):
        monkeypatch.setenv(hardware.PEAK_VARIABLE, bad)
        with pytest.raises(ConfigError, match=f"DUOLM_PEAK_TFLOPS='{bad}' must be a positive"):
            hardware.peak_flops(cpu, torch.float32, 0.0)


def test_an_imported_source_has_unknown_compute_not_zero(two_step_ar_run):
    checkpoint = ckpt.resolve_checkpoint(two_step_ar_run)
    imported = ckpt.read_state(checkpoint) | {"step": 0, "imported_from": {"source": "hub:x/y"}}
    record = source_record("runs/imported", checkpoint, imported)
    assert record["tokens_seen"] is None and record["total_flops"] is None
    assert "hub:x/y" in record["compute_unknown"]
    trained = ckpt.read_state(checkpoint) | {"init_from": record}
    after = source_record("runs/adapted", checkpoint, trained)
    assert after["flops"] > 0 and after["total_flops"] is None  # unknown + known is unknown
    assert after["compute_unknown"] == record["compute_unknown"]


def test_a_stopped_run_names_resume_only_where_train_py_is_the_command(
    tmp_path, cache_dir, monkeypatch, capsys
):
    step = Trainer.train_step

    def stopped_after(self, *args):  # as when SIGTERM arrives during the first step
        return dataclasses.replace(step(self, *args), stop_requested=True)

    monkeypatch.setattr(Trainer, "train_step", stopped_after)
    inner = train(new_run("tiny", tmp_path / "inner", cache_dir=str(cache_dir), max_steps=5))
    said = capsys.readouterr().out
    assert inner["step"] == 1 and "at step 1 (checkpoint saved)" in said and "--resume" not in said
    cli.train_from_argv(tiny(tmp_path / "cli", cache_dir, "--max-steps", "5"))
    assert f"resume with --resume {tmp_path / 'cli'}" in capsys.readouterr().out


def test_a_refused_branch_into_a_new_folder_leaves_nothing(two_step_ar_run, tmp_path):
    argv = ["--resume", str(two_step_ar_run), "--out", str(tmp_path / "branch"), "--max-steps", "1"]
    with pytest.raises(ConfigError, match="past this run's budget"):
        cli.train_from_argv(argv)
    assert names(tmp_path) == []


def test_the_progress_bar_counts_the_step_its_validation_and_checkpoint_name(
    tmp_path, cache_dir, monkeypatch
):
    shown = []
    validate = Trainer.validate_on_schedule

    def recorded(self, done):
        shown.append((done, self.progress.n))
        return validate(self, done)

    monkeypatch.setattr(Trainer, "validate_on_schedule", recorded)
    cli.train_from_argv(tiny(tmp_path / "run", cache_dir, "--max-steps", "3"))
    assert shown == [(1, 1), (2, 2), (3, 3)]  # not 292/3000 while step 293 is saved
