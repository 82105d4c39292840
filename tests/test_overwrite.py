"""``--overwrite`` and ``--force`` move aside only what duolm made, and outputs replace only
regular files: a home folder, a folder of user files, a symbolic link's target, a folder holding
the Python environment, a mount point are refused with one line and left as they were; an output
file path that is a device, a FIFO, a socket, a folder or a symbolic link is refused before any
work; a compare onto a job folder of more families refuses as one of more seeds does.

Every test works inside its tmp path with HOME pointed at a fake home there."""

import os
import shutil
import socket
import stat
import sys
from pathlib import Path

import pytest

from eval import cli as duolm
from eval.experiments import compare
from eval.findings.registration import fresh_job_folder
from shared.door import check_output_file, write_atomic
from shared.errors import ConfigError
from shared.training import cli as train_cli
from shared.training import run_folder
from shared.training.run_folder import made_here, mark_folder, move_aside, why_not_movable


@pytest.fixture()
def home_of_user_files(tmp_path, monkeypatch) -> Path:
    """A fake home folder holding a user's files (and a stray run record, so that only its being
    the home folder can refuse it)."""
    folder = tmp_path / "home"
    (folder / "documents").mkdir(parents=True)
    for i in range(20):
        (folder / "documents" / f"f{i}.txt").write_text(str(i))
    (folder / ".bashrc").write_text("export X=1")
    (folder / "metrics.jsonl").write_text("{}\n")
    monkeypatch.setenv("HOME", str(folder))
    assert Path.home() == folder
    return folder


def tree(folder: Path) -> list[tuple[str, str]]:
    """Every entry under ``folder`` with its contents (or a marker), to compare before/after."""
    return sorted(
        (str(p.relative_to(folder)), p.read_text() if p.is_file() else "<dir>")
        for p in folder.rglob("*")
    )


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def user_files(folder: Path, n: int = 20) -> Path:
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"f{i}.txt").write_text(str(i))
    return folder


def tiny(out, cache, *extra: str) -> list[str]:
    return ["--preset", "tiny", "--out", str(out), "--cache-dir", str(cache), *extra]


def test_export_import_and_train_onto_the_home_folder_refuse_and_move_nothing(
    tiny_runs, home_of_user_files, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # a folder outside the home, as in the probe
    before = tree(home_of_user_files)
    assert duolm.main(["export", str(tiny_runs["ar"]), str(home_of_user_files), "--overwrite"]) == 2
    assert "is or holds the home folder" in error_line(capsys)
    # the output is checked before the source is read
    assert duolm.main(["import", str(tiny_runs["ar"]), str(home_of_user_files), "--overwrite"]) == 2
    assert "is or holds the home folder" in error_line(capsys)
    with pytest.raises(ConfigError, match="home folder"):
        train_cli.train_from_argv(
            tiny(home_of_user_files, tmp_path / "cache", "--max-steps", "1", "--overwrite")
        )
    assert tree(home_of_user_files) == before
    assert not list(tmp_path.glob("home.replaced-*"))


def test_overwrite_never_moves_a_folder_of_user_files(tiny_runs, tmp_path, capsys):
    mine = user_files(tmp_path / "mine")
    before = tree(mine)
    assert duolm.main(["export", str(tiny_runs["ar"]), str(mine), "--overwrite"]) == 2
    line = error_line(capsys)
    assert "files duolm did not make" in line and "--overwrite" not in line.split(";")[0]
    assert tree(mine) == before and not list(tmp_path.glob("mine.replaced-*"))


def test_overwrite_on_a_symlink_names_the_target_and_moves_nothing(tiny_runs, tmp_path, capsys):
    target = user_files(tmp_path / "target")
    (target / "metrics.jsonl").write_text("{}\n")  # even a run-looking target is not followed
    link = tmp_path / "link"
    link.symlink_to(target)
    before = tree(target)
    assert duolm.main(["export", str(tiny_runs["ar"]), str(link), "--overwrite"]) == 2
    line = error_line(capsys)
    assert "symbolic link" in line and str(target) in line
    with pytest.raises(ConfigError, match=f"symbolic link to {target}"):
        move_aside(link)
    with pytest.raises(ConfigError, match=f"symbolic link to {target}"):
        train_cli.train_from_argv(tiny(link, tmp_path / "cache", "--max-steps", "1", "--overwrite"))
    assert tree(target) == before and link.is_symlink()
    assert not list(tmp_path.glob("*.replaced-*"))


def test_a_folder_holding_the_python_environment_or_a_mount_point_is_never_moved(
    tmp_path, monkeypatch
):
    env = tmp_path / "work"
    (env / "venv" / "bin").mkdir(parents=True)
    (env / "metrics.jsonl").write_text("{}\n")
    mark_folder(env, "run")
    monkeypatch.setattr(sys, "prefix", str(env / "venv"))
    assert "Python environment" in why_not_movable(env)
    assert "Python environment" in why_not_movable(env / "venv")
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    assert why_not_movable(env) is None  # the same folder, once it holds nothing protected
    monkeypatch.setattr(run_folder.os.path, "ismount", lambda path: Path(path) == env)
    assert "mount point" in why_not_movable(env)


def test_only_what_duolm_made_or_an_empty_folder_is_movable(tmp_path):
    """Made by duolm means marked by it (tests/test_folder_marker.py): each kind's marker makes
    its folder movable; the records alone (an earlier version's folder) do not."""
    cases = {
        "export": ("duolm_export.json", "an export"),
        "import": ("import.json", "a training run (an imported checkpoint)"),
        "compare job": ("stages/", "a compare job"),
        "findings job": ("finding-code.json", "a findings job"),
        "run": ("metrics.jsonl", "a training run"),
    }
    for kind, (record, said) in cases.items():
        folder = tmp_path / kind.replace(" ", "-")
        folder.mkdir()
        if record.endswith("/"):
            (folder / record).mkdir()
        else:
            (folder / record).write_text("{}")
        assert made_here(folder) is None and "earlier version" in why_not_movable(folder)
        mark_folder(folder, kind)
        assert made_here(folder) == said and why_not_movable(folder) is None
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_text('{"vocab_size": 5}')  # a user's own config.json
    assert made_here(config_only) is None and "did not make" in why_not_movable(config_only)
    (tmp_path / "empty").mkdir()
    assert why_not_movable(tmp_path / "empty") is None


def test_compare_force_and_findings_refuse_a_folder_of_user_files(tmp_path, capsys):
    mine = user_files(tmp_path / "mine")
    before = tree(mine)
    flags = ["--preset", "smoke", "--out", str(mine), "--no-mauve", "--max-steps", "2", "--force"]
    assert compare.main(flags) == 2
    assert "files duolm did not make" in error_line(capsys)
    with pytest.raises(ConfigError, match="files duolm did not make"):
        fresh_job_folder(mine, {"source_hash": "x", "registration": "y"}, force=False)
    assert tree(mine) == before and not list(tmp_path.glob("mine.replaced-*"))


def test_a_run_in_the_current_folder_does_not_suggest_overwrite(tiny_runs, tmp_path, monkeypatch):
    run = Path(shutil.copytree(tiny_runs["ar"], tmp_path / "run"))
    monkeypatch.chdir(run)
    with pytest.raises(ConfigError) as refused:
        train_cli.train_from_argv(tiny(".", tmp_path / "cache", "--max-steps", "1"))
    said = str(refused.value)
    assert "--resume ." in said and "current folder" in said and "--overwrite" not in said


def special_paths(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a socket, a folder, a symbolic link (to a file outside) and, where this user may
    make one, a character device, all inside the tmp path."""
    made = {}
    os.mkfifo(tmp_path / "fifo")
    made["FIFO"] = tmp_path / "fifo"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    server.close()  # the socket file stays
    made["socket"] = tmp_path / "sock"
    (tmp_path / "folder").mkdir()
    made["folder"] = tmp_path / "folder"
    (tmp_path / "elsewhere.txt").write_text("keep me")
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.txt")
    made["symbolic link"] = tmp_path / "link.json"
    try:
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        made["character device"] = tmp_path / "null"
    except PermissionError:
        pass  # not privileged: the other kinds still run
    return made


def test_outputs_replace_only_regular_files_or_new_paths(tiny_runs, tmp_path, capsys):
    for kind, path in special_paths(tmp_path).items():
        mode = os.lstat(path).st_mode
        assert duolm.main(["likelihood", str(tiny_runs["ar"]), "--json", str(path)]) == 2
        line = error_line(capsys)
        assert f"--json {path} is " in line and kind in line and "regular file" in line
        with pytest.raises(ConfigError, match=kind):
            write_atomic(path, "{}")
        assert os.lstat(path).st_mode == mode  # still what it was
    assert (tmp_path / "elsewhere.txt").read_text() == "keep me"
    regular = tmp_path / "out.json"
    regular.write_text("old")
    write_atomic(regular, "new")
    assert regular.read_text() == "new" and check_output_file(tmp_path / "new.json")


def test_fewer_families_onto_a_job_folder_refuses_naming_both_sets(tmp_path, capsys):
    out = tmp_path / "job"
    for name in ("ar", "mdm", "udm"):
        (out / "seed-0" / name).mkdir(parents=True)
        (out / "seed-0" / name / "metrics.jsonl").write_text("{}\n")
        mark_folder(out / "seed-0" / name, "run")
    (out / "report.md").write_text("three families")
    mark_folder(out, "compare job")
    before = tree(out)
    flags = ["--preset", "smoke", "--out", str(out), "--no-mauve", "--max-steps", "2"]
    assert compare.main([*flags, "--objectives", "ar,mdm"]) == 2
    line = error_line(capsys)
    assert "objectives ar,mdm,udm" in line and "--objectives ar,mdm " in line
    assert "without udm" in line and "--out" in line and "--force" in line
    assert tree(out) == before
    compare.refuse_other_families(out, ("ar", "mdm", "udm", "bd"))  # more is a continuation
