"""``duolm export`` scatters nothing and says what it writes: an output that is the current
folder, one above it, or one that holds the source is refused before anything moves; a folder
inside a live run is the run's; the files follow the umask; the row length travels with the
export; refusals say what each objective exports to, what a used folder holds, and which of
LLaDA's missing features a model has."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eval import cli as duolm
from shared.config import ModelConfig
from shared.errors import ConfigError
from shared.formats.diffusion import llada_config_fields
from shared.training import cli as train_cli

pytest.importorskip("transformers")

# Holds a run folder's lock from another process, as a training run does, until killed.
LOCK_HOLDER = """
import fcntl, json, os, sys, time
handle = open(os.path.join(sys.argv[1], ".lock"), "a+")
fcntl.flock(handle, fcntl.LOCK_EX)
handle.seek(0); handle.truncate()
handle.write(json.dumps({"pid": os.getpid(), "host": "here", "since": "now"})); handle.flush()
print("locked", flush=True)
time.sleep(300)
"""


@pytest.fixture(scope="module")
def ar_and_bd_runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    made = {}
    for objective in ("ar", "bd"):
        made[objective] = root / objective
        train_cli.train_from_argv(
            ["--preset", "tiny", "--objective", objective, "--out", str(made[objective])]
            + ["--max-steps", "2", "--block-size", "8", "--cache-dir", str(root / "cache")]
        )
    return made


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_overwrite_of_the_current_folder_or_one_above_it_refuses_and_moves_nothing(
    ar_and_bd_runs, tmp_path, monkeypatch, capsys
):
    here = tmp_path / "e"
    (here / "sub").mkdir(parents=True)
    for i in range(20):
        (here / f"f{i}.txt").write_text(str(i))
    before = names(here)
    for cwd, target in ((here, "."), (here / "sub", ".."), (here / "sub", str(here))):
        monkeypatch.chdir(cwd)
        assert duolm.main(["export", str(ar_and_bd_runs["ar"]), target, "--overwrite"]) == 2
        line = error_line(capsys)
        assert "cannot be moved aside" in line and "current folder" in line
    assert names(here) == before and names(here / "sub") == []
    assert not list(tmp_path.glob("*.replaced-*")) and not list(here.glob(".replaced-*"))


def test_overwrite_of_a_folder_holding_the_source_refuses(ar_and_bd_runs, tmp_path, capsys):
    parent = tmp_path / "runs"
    shutil.copytree(ar_and_bd_runs["ar"], parent / "ar")
    (parent / "notes.txt").write_text("mine")
    assert duolm.main(["export", str(parent / "ar"), str(parent), "--overwrite"]) == 2
    assert "holds the source" in error_line(capsys)
    assert names(parent) == ["ar", "notes.txt"] and (parent / "ar" / "checkpoints").is_dir()
    assert not list(tmp_path.glob("runs.replaced-*"))


def test_a_folder_inside_a_live_run_is_never_written(ar_and_bd_runs, tmp_path, capsys):
    live = tmp_path / "live"
    shutil.copytree(ar_and_bd_runs["ar"], live)
    checkpoints = names(live / "checkpoints")
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(live)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        for target in ([str(live / "checkpoints"), "--overwrite"], [str(live / "hf")]):
            assert duolm.main(["export", str(ar_and_bd_runs["ar"]), *target]) == 2
            assert f"inside {live.resolve()}, which is in use by a run" in error_line(capsys)
    finally:
        holder.kill()
        holder.wait()
    assert names(live / "checkpoints") == checkpoints and not (live / "hf").exists()
    assert not list(live.glob("checkpoints.replaced-*"))


def test_exported_files_follow_the_umask_and_record_the_row_length(ar_and_bd_runs, tmp_path):
    old = os.umask(0o022)
    try:
        assert duolm.main(["export", str(ar_and_bd_runs["ar"]), str(tmp_path / "hf")]) == 0
    finally:
        os.umask(old)
    for path in (tmp_path / "hf").rglob("*"):
        assert path.stat().st_mode & 0o777 == (0o755 if path.is_dir() else 0o644), path
    record = json.loads((tmp_path / "hf" / "duolm_export.json").read_text())
    assert record["seq_len"] == 32  # the tiny preset's rows, not the model's 64-token context


def test_refusals_say_what_each_objective_exports_to_and_what_a_folder_holds(
    ar_and_bd_runs, tmp_path, capsys
):
    assert duolm.main(["export", str(ar_and_bd_runs["bd"]), str(tmp_path / "bd")]) == 2
    line = error_line(capsys)
    assert "'bd' checkpoint" in line and "'mdm' one as LLaDA" in line
    assert "no public format" in line
    assert duolm.main(["export", str(ar_and_bd_runs["ar"]), str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    assert duolm.main(["export", str(ar_and_bd_runs["ar"]), str(tmp_path / "hf")]) == 2
    line = error_line(capsys)
    assert "already holds an export" in line and "training run" not in line


def test_the_llada_refusal_names_what_this_model_has():
    shifted = ModelConfig(dim=32, n_layers=1, n_heads=4, shift_logits=True)
    with pytest.raises(ConfigError) as refused:
        llada_config_fields(shifted, 0, 1, 2)
    message = str(refused.value)
    assert message.startswith("this model has shifted logits (shift_logits=true), which")
    assert "sliding_window=" not in message and "rope_scaling_factor=" not in message
