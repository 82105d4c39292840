"""A full disk (ENOSPC, EDQUOT) or one that refuses the write (EROFS, EACCES, EPERM) is one line
naming the path and the free space (or the permission problem), exit status 2, in every
command; and nothing half-written stays: an export or import removes what it wrote, a training
run whose checkpoint cannot be written keeps its last complete checkpoint as the resume point,
and records are written whole.

The faults are injected (safetensors' ``save_file``, ``os.write``, ``write_atomic`` raising
the OS error a full disk gives), so no real small file system is needed. Every test works
inside its tmp path with HOME pointed there."""

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
from safetensors import SafetensorError

from arlm import export as ar_export
from dllm import export as llada_export
from eval.experiments.stages import Stages
from shared import checkpoint as ckpt
from shared import errors
from shared.config import ModelConfig
from shared.door import append_line, write_atomic
from shared.errors import disk_error_message, os_error_in, result_or_status
from shared.formats import importer
from shared.model import Transformer
from shared.tokenizer import Tokenizer
from shared.training import cli as train_cli

pytestmark = pytest.mark.usefixtures("private_home")


def full(path: Path | str | None = None, code: int = errno.ENOSPC) -> OSError:
    return OSError(code, os.strerror(code), None if path is None else str(path))


def rust_full(path: Path) -> SafetensorError:
    """What safetensors raises when the disk fills under it: the OS error in its message, at a
    temporary name beside the file."""
    return SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28) at path "
        f'"{Path(path).parent / ".tmpQ1w2e3"}"'
    )


def one_error_line(capsys) -> str:
    """The one ``error:`` line on stderr (progress bars may be there too), and no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------- the one line


def test_a_full_disk_names_the_path_and_the_free_space_of_the_nearest_folder(tmp_path):
    missing = tmp_path / "not" / "yet" / "model.safetensors"
    line = disk_error_message(full(missing))
    usage = shutil.disk_usage(tmp_path)
    assert line.startswith(f"No space left on device writing {missing} (")
    assert f"free of {errors.human_size(usage.total)} on {tmp_path})" in line, line
    quota = disk_error_message(full(missing, errno.EDQUOT))
    assert quota.startswith("Disk quota exceeded writing") and f"on {tmp_path})" in quota


@pytest.mark.parametrize(
    "code, words",
    [
        (errno.EROFS, "Read-only file system writing {path}: choose an output folder"),
        (errno.EACCES, "Permission denied: {path} (running as "),
        (errno.EPERM, "Operation not permitted: {path} (running as "),
    ],
)
def test_a_refused_write_names_the_path_and_the_problem(tmp_path, code, words):
    path = tmp_path / "out" / "config.json"
    assert words.format(path=path) in disk_error_message(full(path, code))


def test_safetensors_os_errors_are_read_from_their_message():
    found = os_error_in(rust_full(Path("/somewhere/model.safetensors")))
    assert found.errno == errno.ENOSPC and found.filename == "/somewhere/.tmpQ1w2e3"
    older = SafetensorError("Error while serializing: IoError(Os { code: 122, kind: Other })")
    assert os_error_in(older).errno == errno.EDQUOT
    assert os_error_in(SafetensorError("Error while deserializing header: too large")) is None
    assert disk_error_message(OSError(errno.EIO, "Input/output error", "/x")) is None
    assert disk_error_message(ValueError("no")) is None


def test_every_command_reports_it_as_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    def fails(error):
        def job():
            raise error

        return job

    assert result_or_status(fails(full(tmp_path / "x")))[1] == 2
    assert "No space left on device writing" in one_error_line(capsys)
    assert result_or_status(fails(rust_full(tmp_path / "m.safetensors")))[1] == 2
    assert "No space left on device writing" in one_error_line(capsys)
    assert result_or_status(fails(PermissionError(errno.EACCES, "Permission denied", "/p")))[1] == 2
    assert "Permission denied: /p" in one_error_line(capsys)
    with pytest.raises(OSError):  # another OS error is a bug, and keeps its traceback
        result_or_status(fails(OSError(errno.EIO, "Input/output error")))
    monkeypatch.setenv("DUOLM_DEBUG", "1")
    with pytest.raises(OSError):
        result_or_status(fails(full(tmp_path / "x")))


# ---------------------------------------------------------------- records written whole


def test_a_cut_short_append_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    metrics = tmp_path / "metrics.jsonl"
    append_line(metrics, '{"step": 1}')
    real_write = os.write

    def half_then_full(fd, data):
        if len(data) > 1:
            return real_write(fd, data[: len(data) // 2])
        raise full()

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError) as raised:
        append_line(metrics, '{"step": 2, "loss": 1.5}')
    monkeypatch.undo()
    assert raised.value.filename == str(metrics)  # the report can name it
    assert metrics.read_text() == '{"step": 1}\n'


def test_a_failed_atomic_write_names_its_file_and_leaves_the_old_one(tmp_path):
    path = tmp_path / "final.json"
    write_atomic(path, "old")

    def runs_out(handle):
        handle.write(b"new, half")
        raise full()

    with pytest.raises(OSError) as raised:
        write_atomic(path, runs_out)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_stage_cut_short_is_not_stored(tmp_path, monkeypatch):
    stages = Stages(tmp_path / "job", force=False)

    def no_room(src, dst, **_):
        raise full(dst)

    monkeypatch.setattr(os, "replace", no_room)
    with pytest.raises(OSError):
        stages.run("likelihood", {"a": 1}, lambda: {"nll": 1.0})
    monkeypatch.undo()
    assert list((tmp_path / "job" / "stages").iterdir()) == []


# ---------------------------------------------------------------- checkpoints


def small_model(vocab_size: int) -> Transformer:
    torch.manual_seed(0)
    shape = dict(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=48, max_seq_len=32)
    return Transformer(ModelConfig(vocab_size=vocab_size, **shape)).eval()


def save(root: Path, step: int, objective: str = "ar") -> Path:
    tokenizer = Tokenizer.byte()
    model = small_model(tokenizer.vocab_size + (objective == "mdm"))
    state = {"objective": objective, "model_config": model.config.to_dict()}
    weights = ckpt.full_model_state(model)
    return ckpt.save_checkpoint(root, step, weights=weights, tokenizer=tokenizer, state=state)


def test_a_checkpoint_the_disk_cannot_hold_leaves_the_last_good_one(tmp_path, monkeypatch):
    root = tmp_path / "run" / "checkpoints"
    good = save(root, 2)

    def fails(tensors, path, metadata=None):
        raise rust_full(path)

    monkeypatch.setattr(safetensors.torch, "save_file", fails)
    with pytest.raises(OSError) as raised:
        save(root, 4)
    assert raised.value.filename.endswith("model.safetensors")  # ours, not safetensors' temp
    assert sorted(p.name for p in root.iterdir()) == [good.name]  # no staging folder left
    assert ckpt.resolve_checkpoint(tmp_path / "run") == good


def test_resaving_a_step_keeps_the_old_one_until_the_new_one_is_in_place(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    first = save(root, 3)
    manifest = (first / ckpt.MANIFEST).read_text()
    real_rename = os.rename

    def no_room_for_the_new_one(src, dst, **folders):
        staged = Path(src).name.startswith(".step_000003.") and not str(src).endswith("retired")
        if staged and Path(dst).name == first.name:
            raise full(dst)
        return real_rename(src, dst, **folders)

    monkeypatch.setattr(os, "rename", no_room_for_the_new_one)
    with pytest.raises(OSError):
        save(root, 3)
    monkeypatch.undo()
    assert sorted(p.name for p in root.iterdir()) == [first.name]
    assert (first / ckpt.MANIFEST).read_text() == manifest
    ckpt.verify_checkpoint(first)


def test_a_training_run_on_a_full_disk_stops_with_one_line_and_resumes(
    tmp_path, capsys, monkeypatch
):
    out = tmp_path / "run"
    flags = ["--preset", "tiny", "--objective", "ar", "--out", str(out), "--eval-every", "100"]
    flags += ["--checkpoint-every", "2", "--max-steps", "4", "--cache-dir", str(tmp_path / "c")]
    real_save = safetensors.torch.save_file

    def full_at_step_4(tensors, path, metadata=None):
        if ".step_000004." in str(path):
            raise rust_full(path)
        return real_save(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", full_at_step_4)
    assert train_cli.main(flags) == 2
    line = one_error_line(capsys)
    assert "No space left on device writing" in line and " free of " in line, line
    assert f"the run's newest checkpoint is {out / 'checkpoints' / 'step_000002'}" in line
    assert f"--resume {out}" in line
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000002"]
    for line_text in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line_text)  # whole records only
    monkeypatch.undo()
    resumed = ["--resume", str(out), "--cache-dir", str(tmp_path / "c")]
    assert train_cli.main(resumed) == 0
    assert ckpt.read_state(ckpt.resolve_checkpoint(out))["step"] == 4


# ---------------------------------------------------------------- exports and imports


@pytest.mark.parametrize("made_before", [False, True])
def test_an_llada_export_on_a_full_disk_leaves_no_folder(
    tmp_path, capsys, monkeypatch, made_before
):
    pytest.importorskip("transformers")
    source = save(tmp_path / "mdm" / "checkpoints", 3, "mdm")
    out = tmp_path / "exports" / "llada"
    if made_before:
        out.mkdir(parents=True)

    def fails(tensors, path, metadata=None):
        raise rust_full(path)

    monkeypatch.setattr(safetensors.torch, "save_file", fails)
    assert llada_export.main([str(source), str(out)]) == 2
    line = one_error_line(capsys)
    assert f"No space left on device writing {out / 'model.safetensors'} (" in line, line
    # only what the export made goes: a folder that was there stays (empty)
    assert (out.is_dir() and not any(out.iterdir())) if made_before else not out.parent.exists()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_llama_export_failing_at_its_last_file_removes_the_rest(
    tmp_path, capsys, monkeypatch, code
):
    pytest.importorskip("transformers")
    source = save(tmp_path / "ar" / "checkpoints", 3)
    out = tmp_path / "llama"

    def last_file_fails(path, data, **kwargs):
        assert (Path(path).parent / "model.safetensors").is_file()  # the weights were written
        raise full(path, code)

    monkeypatch.setattr(ar_export, "write_atomic", last_file_fails)
    assert ar_export.main([str(source), str(out)]) == 2
    assert os.strerror(code) in one_error_line(capsys)
    assert not out.exists()


def test_an_import_on_a_full_disk_leaves_no_folder_and_a_rerun_works(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    source = save(tmp_path / "ar" / "checkpoints", 3)
    exported = ar_export.export_checkpoint(source, tmp_path / "exported")
    out = tmp_path / "imported"
    real_write = importer.write_atomic

    def record_fails(path, data, **kwargs):
        raise full(path, errno.EDQUOT)

    monkeypatch.setattr(importer, "write_atomic", record_fails)
    assert importer.main([str(exported), str(out)]) == 2
    assert "Disk quota exceeded writing" in one_error_line(capsys)
    assert not out.exists()
    monkeypatch.setattr(importer, "write_atomic", real_write)
    assert importer.main([str(exported), str(out)]) == 0
    assert ckpt.read_state(ckpt.resolve_checkpoint(out))["objective"] == "ar"


def test_an_import_cut_short_mid_tensor_names_its_file(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    source = save(tmp_path / "ar" / "checkpoints", 3)
    exported = ar_export.export_checkpoint(source, tmp_path / "exported")
    out = tmp_path / "imported"
    real_write = importer.write_safetensors

    def header_then_full(path, *args):
        real_write(path, *args)  # the tensors were written; the disk fills at the end
        with importer.named_in_errors(path):
            raise full()  # as a write to an open file does: no path in it

    monkeypatch.setattr(importer, "write_safetensors", header_then_full)
    assert importer.main([str(exported), str(out)]) == 2
    line = one_error_line(capsys)
    assert "No space left on device writing" in line and "model.safetensors" in line, line
    assert not out.exists()


def test_a_run_folder_that_cannot_be_made_for_lack_of_room_says_how_much_is_free(
    tmp_path, capsys, monkeypatch
):
    real_mkdir = os.mkdir

    def no_room(path, *args, **kwargs):
        if Path(path).name == "run":
            raise full(path)
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", no_room)
    flags = ["--preset", "tiny", "--objective", "ar", "--out", str(tmp_path / "run")]
    assert train_cli.main(flags + ["--max-steps", "1", "--cache-dir", str(tmp_path / "c")]) == 2
    line = one_error_line(capsys)
    assert f"cannot write to the run folder {tmp_path / 'run'}: No space left" in line, line
    assert "free of" in line and not (tmp_path / "run").exists()
