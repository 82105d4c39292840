"""Messages that say the right thing: ``findings --table`` refuses REPORTS folders its links would
miss, ``duolm sample`` on a udm run names udm (not ``--sampler fixed``), a curriculum longer than
the run is refused, the help texts name udm, an unknown command suggests the closest one, each
export refusal speaks of its own objective, a conversion refusal says "not converted" once, and
``--resume`` never suggests an ``--overwrite`` that would refuse.

Every test works inside its tmp path with HOME pointed there."""

import json
from pathlib import Path

import pytest

from eval import cli as duolm
from eval.findings import __main__ as findings
from shared.training.run_folder import mark_folder

pytestmark = pytest.mark.usefixtures("private_home")


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# ---- findings --table: every link of the table resolves ----------------------------------------


def findings_index(tmp_path: Path) -> Path:
    claim = {"title": "T", "statement": "S.", "source": "X 2024"}
    row = {"claim": claim, "measured": "1", "verdict": "reproduced", "wall_seconds": 60}
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"findings": [{"name": "a", **row}, {"name": "b", **row}]}))
    return index


def test_findings_table_refuses_a_reports_folder_its_links_would_miss(tmp_path, capsys):
    index = findings_index(tmp_path)
    reports = tmp_path / "reports"
    assert duolm.main(["findings", "--table", str(index), "/nonexistent"]) == 2
    line = error_line(capsys)
    assert line.startswith("error: --table REPORTS /nonexistent: no such folder"), line
    (reports / "a").mkdir(parents=True)
    (reports / "a" / "report.md").write_text("# a")
    assert findings.main(["--table", str(index), str(reports)]) == 2
    assert f"--table REPORTS {reports}: it has no b/report.md" in error_line(capsys)
    (tmp_path / "file").write_text("x")
    assert findings.main(["--table", str(index), str(tmp_path / "file")]) == 2
    assert "not a folder" in error_line(capsys)
    (reports / "b").mkdir()
    (reports / "b" / "report.md").write_text("# b")
    assert findings.main(["--table", str(index), str(reports)]) == 0
    assert f"[T]({reports}/b/report.md)" in capsys.readouterr().out


def test_the_committed_findings_table_resolves_from_the_project_root(monkeypatch, capsys):
    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(root)
    index = "docs/studies/findings-cpu/index.json"
    assert findings.main(["--table", index, "docs/studies/findings-cpu"]) == 0
    assert capsys.readouterr().out in (root / "README.md").read_text()


# ---- checkpoints of every objective, made directly (random tiny models) -------------------------


def checkpoint_of(root: Path, objective: str) -> Path:
    """A checkpoint of a random tiny model of ``objective`` (mdm and bd carry a [MASK] row)."""
    from shared.checkpoint import full_model_state, save_checkpoint
    from shared.config import ModelConfig
    from shared.model import Transformer
    from shared.tokenizer import Tokenizer

    tokenizer = Tokenizer.byte()
    extra = 1 if objective in ("mdm", "bd") else 0
    config = ModelConfig(vocab_size=tokenizer.vocab_size + extra, dim=16, n_layers=1, n_heads=2,
                         n_kv_heads=2, hidden_dim=32, max_seq_len=32)  # fmt: skip
    train = {"objective": objective, "schedule": "linear", "block_size": 4 * (objective == "bd")}
    state = {"objective": objective, "model_config": config.to_dict(), "train_config": train}
    weights = full_model_state(Transformer(config))
    save_checkpoint(root, 1, weights=weights, tokenizer=tokenizer, state=state)
    return root


@pytest.fixture(scope="module")
def checkpoint_per_objective(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: checkpoint_of(root / name, name) for name in ("ar", "mdm", "bd", "udm")}


# ---- duolm sample: the message names the model's own sampler ------------------------------------


@pytest.mark.parametrize(
    "flags",
    [["--schedule", "cosine"], ["--threshold", "0.5"], ["--remasking", "random"],
     ["--llada-reference"], ["--sampler", "ancestral", "--schedule", "cosine"]],
)  # fmt: skip
def test_masked_sampler_flags_on_a_udm_run_name_udm_not_the_fixed_sampler(
    checkpoint_per_objective, capsys, flags
):
    assert (
        duolm.main(["sample", str(checkpoint_per_objective["udm"]), "--gen-length", "4", *flags])
        == 2
    )
    line = error_line(capsys)
    assert f"{flags[-2] if flags[-1] == 'cosine' else flags[0]} does not apply to" in line, line
    assert "a udm (uniform-state) model: it samples ancestrally through its posterior" in line
    assert "--sampler fixed" not in line


def test_without_sampler_an_mdm_run_names_the_default_fixed_sampler(
    checkpoint_per_objective, capsys
):
    argv = [
        "sample",
        str(checkpoint_per_objective["mdm"]),
        "--gen-length",
        "4",
        "--threshold",
        "0.5",
    ]
    assert duolm.main(argv) == 2
    assert error_line(capsys) == (
        "error: --threshold only applies to --sampler threshold, not the default --sampler fixed"
    )
    assert duolm.main([*argv, "--sampler", "threshold", "--json", "--eos", "none"]) == 0


def words(text: str) -> str:
    """``text`` with its line breaks (argparse wraps help at the terminal's width) as spaces."""
    return " ".join(text.split())


def test_the_sample_and_train_help_name_udm(capsys):
    from dllm import sample
    from shared.training import cli as train_cli

    with pytest.raises(SystemExit):
        sample.main(["--help"])
    assert "uniform-state (udm)" in words(capsys.readouterr().out)
    assert duolm.main(["sample", "--help"]) == 0
    assert "uniform-state (udm)" in words(capsys.readouterr().out)
    with pytest.raises(SystemExit):
        train_cli.main(["--help"])
    text = words(capsys.readouterr().out)
    assert "udm (uniform-state diffusion)" in text.split("options:")[0]
    assert duolm.main(["sample"]) == 2
    assert "uniform-state (udm)" in words(capsys.readouterr().out)
    assert "uniform-state diffusion" in duolm.usage()


# ---- train: a curriculum longer than the run ----------------------------------------------------


def test_a_curriculum_longer_than_the_run_is_refused_where_the_steps_are_known(tmp_path, capsys):
    from shared.errors import ConfigError
    from shared.training.config import TrainConfig

    argv = [
        "train",
        "--preset",
        "tiny",
        "--objective",
        "udm",
        "--out",
        str(tmp_path / "r"),
        "--max-steps",
        "5",
        "--curriculum-steps",
        "50",
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    assert duolm.main(argv) == 2  # fmt: skip
    assert error_line(capsys) == (
        "error: curriculum_steps=50 is longer than the run's max_steps=5 (the run would end "
        "inside it); give at most 5, or -1 for the first half of the run's steps"
    )
    assert not (tmp_path / "r").exists()
    fits = TrainConfig(objective="udm", max_steps=5, curriculum_steps=5).validate()
    assert fits.curriculum_steps == 5
    # A budget in tokens, FLOPs or epochs becomes steps only once the data is read: not judged.
    by_tokens = TrainConfig(objective="udm", max_tokens=1000, curriculum_steps=50).validate()
    assert by_tokens.curriculum_steps == 50
    with pytest.raises(ConfigError, match="curriculum_steps=6 is longer"):
        TrainConfig(objective="udm", max_steps=5, curriculum_steps=6).validate()


# ---- duolm: an unknown command suggests the closest one -----------------------------------------


@pytest.mark.parametrize(
    "typed, suggested",
    [("trian", "train"), ("smaple", "sample"), ("convert", "convert-checkpoint"), ("zzz", None)],
)
def test_an_unknown_command_suggests_the_closest(capsys, typed, suggested):
    assert duolm.main([typed]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    if suggested:
        assert first == f"error: unknown command {typed!r}; did you mean {suggested!r}?"
    else:
        assert first == f"error: unknown command {typed!r}"


# ---- export: each refusal speaks of its own objective -------------------------------------------


def test_export_refusals_are_per_objective(checkpoint_per_objective, tmp_path, capsys):
    from dllm import export as diffusion_export

    assert duolm.main(["export", str(checkpoint_per_objective["udm"]), str(tmp_path / "u")]) == 2
    line = error_line(capsys)
    assert "holds a 'udm' checkpoint (uniform-state diffusion), which has no public format" in line
    assert "bd" not in line and "block" not in line
    assert duolm.main(["export", str(checkpoint_per_objective["bd"]), str(tmp_path / "b")]) == 2
    line = error_line(capsys)
    assert "holds a 'bd' checkpoint (block diffusion), which has no public format" in line
    assert "udm" not in line
    assert diffusion_export.main([str(checkpoint_per_objective["ar"]), str(tmp_path / "a")]) == 2
    line = error_line(capsys)
    assert "holds an 'ar' checkpoint (autoregressive); this command writes a LLaDA folder" in line
    assert "duolm export writes an 'ar' checkpoint as a Hugging Face Llama folder" in line
    assert not any((tmp_path / name).exists() for name in "uba")


# ---- convert-checkpoint: "not converted" said once ----------------------------------------------


class Payload:
    def __reduce__(self):
        return (print, ("unpickled",))


def test_a_refused_pickle_says_not_converted_once(tmp_path, monkeypatch):
    import torch

    from shared.errors import CheckpointError
    from shared.training import convert

    file = tmp_path / "rng.pt"
    torch.save(Payload(), file)
    with pytest.raises(CheckpointError) as refused:
        convert.read_pickled(file)
    assert str(refused.value) == (
        f"{file}: refused to unpickle: it asks for print, which no checkpoint of this project holds"
    )
    # Several checkpoints: each failure is logged once with "not converted".
    folders = [tmp_path / "step_000001", tmp_path / "step_000002"]
    monkeypatch.setattr(convert, "checkpoints_at", lambda path: folders)
    monkeypatch.setattr(convert, "holder_if_locked", lambda folder: None)

    def fails(path):
        raise CheckpointError(f"{path / 'rng.pt'}: refused to unpickle: it asks for x.y")

    monkeypatch.setattr(convert, "convert_checkpoint", fails)
    said = []
    with pytest.raises(CheckpointError, match="2 of 2 checkpoints not converted"):
        convert.convert(tmp_path, log=said.append)
    assert all(line.count("not converted") == 1 for line in said) and len(said) == 2


# ---- train --resume: never an --overwrite that would refuse -------------------------------------


def test_resume_hints_suggest_overwrite_only_where_it_would_move_the_run(tmp_path, monkeypatch):
    from shared.errors import CheckpointError
    from shared.training import cli as train_cli

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"model_config": {}, "train_config": {}}')
    mark_folder(run, "run")
    with pytest.raises(
        CheckpointError, match=f"start a new run there with --out {run} --overwrite"
    ):
        train_cli.train_from_argv(["--resume", str(run)])
    # The run in the current folder: --overwrite would refuse to move it, so it is not offered.
    monkeypatch.chdir(run)
    with pytest.raises(CheckpointError) as refused:
        train_cli.train_from_argv(["--resume", "."])
    message = str(refused.value)
    assert "--overwrite" not in message and "start a new run in another folder" in message
    assert "is the current folder or holds it" in message
    # A folder that holds no run at all is not called a run that stopped early.
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError) as refused:
        train_cli.train_from_argv(["--resume", str(tmp_path / "empty")])
    assert "holds no training run" in str(refused.value)
    assert "--overwrite" not in str(refused.value)


def test_output_into_a_pipe_whose_reader_has_gone_stops_quietly():
    """``duolm findings --table INDEX REPORTS | head`` once ended in a BrokenPipeError
    traceback: a command whose stdout's reader has gone now stops without a word, with the
    status of a SIGPIPE (141), as shell tools do."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    findings = root / "docs" / "studies" / "findings-cpu"
    read, write = os.pipe()
    os.close(read)  # no reader at all: the first write meets a broken pipe
    try:
        done = subprocess.run(
            [sys.executable, "-m", "eval.findings", "--table", str(findings / "index.json"),
             str(findings)],
            stdout=write, stderr=subprocess.PIPE, text=True, cwd=root, timeout=120,
        )  # fmt: skip
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")
