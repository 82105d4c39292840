"""Ownership by a marker: every folder duolm makes holds ``.duolm`` naming its kind, and
``--overwrite`` / ``--force`` move aside only a marked folder (or an empty one), never a user's
folder because it holds something named ``checkpoints``, ``stages`` or ``metrics.jsonl``."""

import json

import pytest

from shared.training import cli
from shared.training.run_folder import (
    MARKER,
    folder_kind,
    made_by_earlier_version,
    made_here,
    mark_folder,
    why_not_movable,
)

TINY = ["--preset", "tiny", "--max-steps", "2", "--eval-every", "2"]


def users_folder(path, names=("checkpoints", "stages", "metrics.jsonl")):
    """A folder of the user's own files that happens to use the names duolm's folders use."""
    path.mkdir(parents=True)
    for name in names:
        if "." in name:
            (path / name).write_text("the user's own notes\n")
        else:
            (path / name).mkdir()
            (path / name / "keep.txt").write_text("the user's\n")
    for i in range(7):
        (path / f"file{i}.txt").write_text(str(i))
    return sorted(p.name for p in path.iterdir())


def test_a_run_marks_its_folder_and_overwrite_moves_only_marked_ones(tmp_path, cache_dir, capsys):
    run = tmp_path / "run"
    assert cli.main([*TINY, "--out", str(run), "--cache-dir", str(cache_dir)]) == 0
    assert folder_kind(run) == "run" and made_here(run) == "a training run"
    assert json.loads((run / MARKER).read_text())["kind"] == "run"
    assert cli.main([*TINY, "--out", str(run), "--cache-dir", str(cache_dir), "--overwrite"]) == 0
    assert "aside" in capsys.readouterr().out
    assert folder_kind(run) == "run"


def test_overwrite_never_moves_a_users_folder_by_its_subfolder_names(tmp_path, cache_dir, capsys):
    folder = tmp_path / "mine"
    before = users_folder(folder)
    code = cli.main([*TINY, "--out", str(folder), "--cache-dir", str(cache_dir), "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "earlier version" in err and f"mv {folder}" in err  # how to move it by hand
    assert sorted(p.name for p in folder.iterdir()) == before
    assert not list(tmp_path.glob("mine.replaced-*"))


def test_a_folder_without_earlier_records_is_not_ours(tmp_path):
    folder = tmp_path / "plain"
    users_folder(folder, names=("notes.txt",))
    assert made_here(folder) is None and not made_by_earlier_version(folder)
    assert "did not make" in why_not_movable(folder)


def test_ownership_comes_from_the_marker_alone(tmp_path):
    """The rule, not an instance: a folder holding every record duolm's folders hold is still
    not duolm's without the marker; an otherwise ordinary folder with it is."""
    folder = tmp_path / "looks-like-a-run"
    users_folder(folder, names=("checkpoints", "metrics.jsonl", "final.json", "stages"))
    (folder / "config.json").write_text(json.dumps({"model_config": {}, "train_config": {}}))
    assert made_here(folder) is None and why_not_movable(folder) is not None
    mark_folder(folder, "run")
    assert made_here(folder) == "a training run" and why_not_movable(folder) is None
    (folder / MARKER).write_text(json.dumps({"kind": "something else"}))
    assert made_here(folder) is None
    (folder / MARKER).unlink()
    (folder / MARKER).symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"kind": "run"}))
    assert made_here(folder) is None  # a marker that is a link is no marker


# ------------------------------------------------------------------ a received folder's links


@pytest.mark.parametrize("entry", [".lock", "metrics.jsonl"])
def test_a_link_in_a_run_folder_never_writes_through(tmp_path, cache_dir, capsys, entry):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / entry).symlink_to(victim)
    code = cli.main([*TINY, "--out", str(run), "--cache-dir", str(cache_dir)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "symbolic link" in err or "earlier version" in err, err
    assert victim.read_text() == "precious\n"


def test_a_fifo_lock_is_refused_at_once(tmp_path, cache_dir, capsys):
    import os

    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / ".lock")
    code = cli.main([*TINY, "--out", str(run), "--cache-dir", str(cache_dir)])
    err = capsys.readouterr().err
    assert code == 2 and "FIFO" in err and err.count("\n") == 1, err
