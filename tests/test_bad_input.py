"""Absurd values a user can type (a device this machine lacks, counts of 10**12, names longer
than the file system takes, a vocabulary of 10**12) are one ``error:`` line with exit status 2,
refused before anything is allocated or written."""

import errno
import os

import pytest

from eval import cli
from eval.experiments import side_by_side
from shared.cli_args import MAX_SAMPLES, MAX_SAMPLING_STEPS, device_argument
from shared.errors import ConfigError, result_or_status
from shared.tokenizer import MAX_BPE_VOCAB
from shared.training import cli as train_cli

HUGE = str(10**12)


def one_error_line(capsys) -> str:
    """The command's stderr, which must be exactly one ``error:`` line."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "name, message",
    [
        ("tpu", r"--device 'tpu' is not a device; use cpu, cuda or cuda:N"),
        ("mps", r"--device 'mps': only cpu and cuda devices are supported"),
        ("cpu", None),
    ],
)
def test_a_device_this_machine_cannot_use_is_one_line(name, message):
    if message is None:
        assert device_argument(name).type == "cpu"
        return
    with pytest.raises(ConfigError, match=message) as refused:
        device_argument(name)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "flag, most", [("--steps", MAX_SAMPLING_STEPS), ("--num-samples", MAX_SAMPLES)]
)
def test_sampling_counts_past_their_bound_are_one_line(tiny_run, private_home, flag, most, capsys):
    argv = ["sample", str(tiny_run), "--gen-length", "4", flag]
    assert cli.main([*argv, HUGE]) == 2
    line = one_error_line(capsys)
    assert f"{flag}={HUGE} is more than {most:,}" in line
    assert cli.main([*argv, "2", "--json"]) == 0  # a count within the bound samples


def test_samples_of_several_prompts_past_the_bound_are_one_line(tiny_run, private_home, capsys):
    argv = ["sample", str(tiny_run), "--prompt", "a", "--prompt", "b", "--num-samples", "3000"]
    assert cli.main(argv) == 2
    assert "--num-samples=3000 x 2 prompts is 6,000 samples, more than 4,096" in one_error_line(
        capsys
    )


def test_side_by_side_steps_past_their_bound_are_one_line(tiny_run, private_home, capsys):
    argv = [str(tiny_run), str(tiny_run), "--steps", HUGE]
    assert side_by_side.main(argv) == 2
    assert f"--steps={HUGE} is more than {MAX_SAMPLING_STEPS:,}" in one_error_line(capsys)


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--width", "0"], "--width=0 must be >= 1"),
        (["--width", HUGE], f"--width={HUGE} is more than 1,000"),
        (["--threads", HUGE], f"--threads={HUGE} is more than 4,096"),
    ],
)
def test_side_by_side_layout_and_threads_out_of_range_are_one_line(
    tiny_run, private_home, flags, said, capsys
):
    assert side_by_side.main([str(tiny_run), str(tiny_run), *flags]) == 2
    assert said in one_error_line(capsys)


def test_likelihood_draws_past_their_bound_are_one_line(tiny_run, private_home, capsys):
    assert cli.main(["likelihood", str(tiny_run), "--samples", HUGE]) == 2
    assert f"samples={HUGE} is more than 4,096" in one_error_line(capsys)


def test_an_out_name_longer_than_the_file_system_takes_is_one_line(tmp_path, private_home, capsys):
    out = tmp_path / ("a" * 300)
    argv = ["--preset", "tiny", "--max-steps", "1", "--out", str(out)]
    assert train_cli.main(argv) == 2
    line = one_error_line(capsys)
    assert "is 300 bytes long; this file system takes names of at most 255 bytes" in line
    assert list(tmp_path.iterdir()) == []


def test_an_out_path_past_the_longest_path_is_one_line(tmp_path, private_home, capsys):
    out = tmp_path.joinpath(*["b" * 200] * 21)
    assert cli.main(["shard-data", "--data", "synthetic:hmm?seed=1&n=200", "--out", str(out)]) == 2
    assert "leaves no room for the files written inside it" in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_an_export_into_a_name_too_long_is_one_line(tiny_run, tmp_path, private_home, capsys):
    pytest.importorskip("transformers")
    assert cli.main(["export", str(tiny_run), str(tmp_path / ("c" * 256))]) == 2
    assert "the export folder" in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_any_name_the_system_finds_too_long_is_one_line(capsys):
    def job():
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), "/x/" + "d" * 300)

    assert result_or_status(job) == (None, 2)
    line = one_error_line(capsys)
    assert line.startswith("error: File name too long: /x/ddd") and "(303 characters)" in line


@pytest.mark.parametrize(
    "flag, said",
    [
        ("--curve-points", f"curve_points={HUGE} (--curve-points) is more than 65,536"),
        ("--num-threads", f"num_threads={HUGE} (--num-threads) is more than 4,096"),
    ],
)
def test_training_counts_past_their_bound_are_one_line(tmp_path, private_home, flag, said, capsys):
    out = tmp_path / "run"
    assert train_cli.main(["--preset", "tiny", "--out", str(out), flag, HUGE]) == 2
    assert said in one_error_line(capsys)
    assert not out.exists()


def test_a_bpe_vocabulary_past_its_bound_is_one_line(tmp_path, private_home, capsys):
    argv = ["--preset", "tiny", "--out", str(tmp_path / "run"), "--tokenizer", "bpe"]
    assert train_cli.main([*argv, "--tokenizer-vocab-size", HUGE]) == 2
    line = one_error_line(capsys)
    assert f"tokenizer_vocab_size must be at most {MAX_BPE_VOCAB:,} (2**24)" in line
    assert not (tmp_path / "run").exists()
