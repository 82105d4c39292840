"""The ``duolm`` commands write only where they may and name what went wrong: export never writes
into a training run, an earlier export or a file; sample finds its checkpoint among the flags;
an unknown flag is named even when its value looks like a positional argument; each subcommand's
usage line names it; a launcher's second process prints no usage error."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arlm import export as ar_export
from eval import cli as duolm
from shared.cli_args import CommandParser

ROOT = Path(__file__).resolve().parent.parent


def status_of(argv: list[str]) -> int:
    """The exit status of ``duolm argv``: what main returns, or what argparse exits with."""
    try:
        return duolm.main(argv)
    except SystemExit as exit:
        return exit.code


def error_line(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_export_refuses_a_training_run_an_earlier_export_and_a_file(tiny_runs, tmp_path, capsys):
    pytest.importorskip("transformers")
    target = tiny_runs["mdm"]
    config = (target / "config.json").read_text()
    assert duolm.main(["export", str(tiny_runs["ar"]), str(target)]) == 2
    assert "already holds a training run" in error_line(capsys)
    assert (target / "config.json").read_text() == config
    assert not (target / "model.safetensors").exists()

    exported = tmp_path / "hf"
    assert duolm.main(["export", str(tiny_runs["ar"]), str(exported)]) == 0
    first = (exported / "model.safetensors").read_bytes()
    assert duolm.main(["export", str(tiny_runs["ar"]), str(exported)]) == 2
    assert "--overwrite" in error_line(capsys)
    assert duolm.main(["export", str(tiny_runs["ar"]), str(exported), "--overwrite"]) == 0
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("hf.replaced-")]
    assert len(aside) == 1 and (aside[0] / "model.safetensors").read_bytes() == first

    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me")
    assert duolm.main(["export", str(tiny_runs["ar"]), str(a_file)]) == 2
    assert "is a file" in error_line(capsys) and a_file.read_text() == "keep me"


def test_duolm_export_writes_an_mdm_as_llada_and_the_llama_export_refuses_it(
    tiny_runs, tmp_path, capsys
):
    pytest.importorskip("transformers")
    assert duolm.main(["export", str(tiny_runs["mdm"]), str(tmp_path / "llada")]) == 0
    assert '"model_type": "llada"' in (tmp_path / "llada" / "config.json").read_text()
    assert ar_export.main([str(tiny_runs["mdm"]), str(tmp_path / "hf")]) == 2
    line = error_line(capsys)
    assert "'mdm' checkpoint" in line and "Hugging Face Llama folder" in line and "LLaDA" in line


def test_sample_finds_its_checkpoint_after_a_flag_value(tiny_runs, capsys):
    status = duolm.main(
        ["sample", "--prompt", "And God said", str(tiny_runs["ar"]), "--max-new-tokens", "4"]
    )
    assert status == 0, capsys.readouterr().err


@pytest.mark.parametrize(("family", "flag"), [("ar", "--max-new-tokens"), ("mdm", "--steps")])
def test_a_bad_sampling_value_names_duolm_sample(tiny_runs, family, flag, capsys):
    # the checkpoint's own sampler parses the flags, under the command the user typed
    assert status_of(["sample", str(tiny_runs[family]), flag, "many"]) == 2
    line = error_line(capsys)
    assert line.startswith("duolm sample: error:") and flag in line, line


@pytest.mark.parametrize("command", ["sample", "export", "side-by-side", "likelihood", "train"])
def test_an_unknown_flag_is_named(command, capsys):
    assert status_of([command, "--bogus", "3"]) == 2
    line = error_line(capsys)
    assert "unrecognized flag --bogus" in line and "does not exist" not in line


@pytest.mark.parametrize("command", ["train", "likelihood", "export", "side-by-side"])
def test_each_subcommands_usage_names_it(command, capsys):
    with pytest.raises(SystemExit):
        duolm.main([command, "--help"])
    assert capsys.readouterr().out.startswith(f"usage: duolm {command} ")


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_sample_prints_its_own_usage_naming_both_samplers(flag, capsys):
    # sample picks its sampler from the checkpoint, so its help points at both modules' flags
    assert duolm.main(["sample", flag]) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith("usage: duolm sample CHECKPOINT ") and printed.err == ""
    assert "python -m arlm.sample --help" in printed.out
    assert "python -m dllm.sample --help" in printed.out
    # without a checkpoint and without asking for help, the same usage is a failure
    assert duolm.main(["sample"]) == 2
    assert capsys.readouterr().out.startswith("usage: duolm sample CHECKPOINT ")


def test_the_docstrings_export_command_runs(tiny_runs, tmp_path):
    pytest.importorskip("transformers")
    line = next(line for line in duolm.__doc__.splitlines() if "duolm export" in line)
    words = line.split("#")[0].split()[2:]  # after "duolm export"
    assert words[-1] != "--out" and not any(w.startswith("--") for w in words)
    assert duolm.main(["export", str(tiny_runs["ar"]), str(tmp_path / "exported")]) == 0


def test_only_the_first_process_of_a_launcher_prints_a_usage_error():
    script = (
        "from shared.cli_args import CommandParser\n"
        "CommandParser(prog='x').parse_args(['--bogus'])\n"
    )
    for rank, printed in (("0", True), ("1", False)):
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env={**os.environ, "RANK": rank},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2
        assert ("unrecognized flag --bogus" in done.stderr) is printed


def test_a_flag_is_taken_whole_never_as_an_abbreviation(capsys):
    parser = CommandParser(prog="x")
    parser.add_argument("--max-new-tokens", type=int)
    assert parser.parse_args(["--max-new-tokens", "3"]).max_new_tokens == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-new", "3"])
    assert "unrecognized flag --max-new" in capsys.readouterr().err


def test_more_diffusion_steps_than_positions_says_how_many_ran(capsys):
    from dllm import sample as diffusion_sample

    fixture = Path(__file__).resolve().parent / "fixtures" / "tiny_mdm_run"
    argv = [str(fixture), "--gen-length", "8", "--steps", "50", "--sampler", "ancestral"]
    assert diffusion_sample.main([*argv, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    # At seed 0 the eight positions are all revealed by step 47 (the draw is float64 uniforms
    # against the schedule, the same on every CPU).
    assert stats["steps_asked"] == 50 and stats["steps"] == 47
    assert diffusion_sample.main(argv) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "of 50 steps asked, 47 ran" in line


def test_help_says_each_default_once(capsys):
    from dllm import sample as diffusion_sample

    with pytest.raises(SystemExit):
        diffusion_sample.main(["--help"])
    text = capsys.readouterr().out
    assert "(default: None)" not in text and "default" in text


@pytest.mark.parametrize("kind", ["ar", "mdm"])
def test_ctrl_c_during_an_export_is_one_line_130_and_leaves_nothing(
    kind, tiny_runs, tmp_path, capsys, monkeypatch
):
    pytest.importorskip("transformers")
    import transformers

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    # the tokenizer is written by both exports, after their weights
    monkeypatch.setattr(transformers.PreTrainedTokenizerFast, "save_pretrained", interrupted)
    out = tmp_path / "exported"
    assert status_of(["export", str(tiny_runs[kind]), str(out)]) == 130
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == ["error: stopped by Ctrl-C (SIGINT)"]
    assert not out.exists()
