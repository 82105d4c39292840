"""A sharded checkpoint's index (DCP's pickled ``shards/.metadata``) is read by torch's own
weights-only unpickler and then checked whole (``shared.sharded_checkpoint.checked_index``).
Each crafted index below needs no code execution to do harm if it were trusted: a path object
whose printed name differs from what it opens, BUILD applied to a class, a size bomb, chunks that
leave gaps or overlap, a byte range beyond its file, a name that climbs out of the shard folder.
Each is refused in one line, opens nothing outside the checkpoint and writes nothing."""

import dataclasses
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata

from shared import checkpoint as ckpt
from shared import sharded_checkpoint as sharded
from shared.errors import CheckpointError
from shared.path_checks import check_inside
from shared.training import cli, convert

OPENED: list[str] | None = None


def _record_opens(event: str, args: tuple) -> None:
    if OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, Path)):
        OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_record_opens)  # inert unless a test sets OPENED


def crafted_copy(checkpoint: Path, tmp_path: Path, index_bytes: bytes) -> Path:
    copy = tmp_path / "run" / "checkpoints" / checkpoint.name
    shutil.copytree(checkpoint, copy)
    (copy / "shards" / ".metadata").write_bytes(index_bytes)
    files = sorted(p for p in copy.rglob("*") if p.is_file() and p.name != ckpt.MANIFEST)
    listed = {str(p.relative_to(copy)): ckpt.file_sha256(p) for p in files}
    (copy / ckpt.MANIFEST).write_text(json.dumps(listed))
    return copy


def mutated(index, change) -> bytes:
    """The clean index with ``change(index)`` applied, pickled as this project writes it."""
    change(index)
    return pickle.dumps(index, protocol=2)


def first_tensor(index):
    name = "model/tok_embeddings.weight"
    return name, index.state_dict_metadata[name]


def storage_of(index, name):
    return next(key for key in index.storage_data if key.fqn == name)


def refused(copy: Path, match: str, capsys) -> None:
    """Refused by the reader, by a resume and by the conversion, in one line, opening nothing
    outside the checkpoint and writing nothing into it."""
    global OPENED
    before = {p: p.stat().st_mtime_ns for p in copy.rglob("*")}
    OPENED = []
    try:
        with pytest.raises(CheckpointError, match=match):
            sharded.read_index(copy)
        assert convert.main([str(copy), "--to", "single"]) == 2
    finally:
        opened, OPENED = OPENED, None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    root = copy.resolve()
    outside = [
        p for p in opened if p.startswith("/tmp") and not Path(p).resolve().is_relative_to(root)
    ]
    assert not [p for p in outside if "secret" in p], outside
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*")} == before
    assert not (copy / "model.safetensors").exists()


def test_the_clean_index_reads_and_converts(small_sharded, tmp_path):
    copy = tmp_path / "c" / "checkpoints" / small_sharded.name
    shutil.copytree(small_sharded, copy)
    index = sharded.read_index(copy)
    assert all(
        type(m) is dcp_metadata.TensorStorageMetadata for m in index.state_dict_metadata.values()
    )
    assert convert.main([str(copy), "--to", "single"]) == 0


def test_a_path_object_in_the_index_is_refused(small_sharded, tmp_path, capsys):
    secret = tmp_path / "secret.distcp"
    secret.write_bytes(b"\0" * 64)

    def point_outside(index):
        key = storage_of(index, first_tensor(index)[0])
        index.storage_data[key].relative_path = Path(secret)

    copy = crafted_copy(
        small_sharded, tmp_path, mutated(sharded.read_index(small_sharded), point_outside)
    )
    refused(copy, "asks for pathlib", capsys)


def test_build_on_a_class_is_refused_and_changes_no_class(small_sharded, tmp_path, capsys):
    # PROTO 2; GLOBAL PosixPath's base is not allowed, so aim at an allowed class: BUILD on the
    # class Metadata itself with slot state {"is_relative_to": None} would set a class attribute
    build_on_class = (
        b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n"
        b"N}X\x0e\x00\x00\x00is_relative_toNs\x86b."
    )
    copy = crafted_copy(small_sharded, tmp_path, build_on_class)
    refused(copy, "refused to unpickle", capsys)
    assert "is_relative_to" not in vars(dcp_metadata.Metadata)
    with pytest.raises(Exception, match="lies outside"):
        check_inside(Path("/etc/passwd"), tmp_path, "a test")


def test_a_size_bomb_is_refused_before_anything_is_allocated(small_sharded, tmp_path, capsys):
    def bomb(index):
        name, meta = first_tensor(index)
        meta.size = torch.Size([1 << 20, 1 << 12])
        meta.chunks = [dcp_metadata.ChunkStorageMetadata(torch.Size([0, 0]), meta.size)]
        key = storage_of(index, name)
        index.storage_data[dcp_metadata.MetadataIndex(name, torch.Size([0, 0]))] = (
            index.storage_data.pop(key)
        )

    copy = crafted_copy(small_sharded, tmp_path, mutated(sharded.read_index(small_sharded), bomb))
    refused(copy, "bytes of data in a", capsys)


@pytest.mark.parametrize(
    "chunks, match",
    [
        ([((0, 0), (129, 32))], "do not cover"),  # half of the 258 rows: a gap
        ([((0, 0), (200, 32)), ((100, 0), (158, 32))], "do not cover"),  # overlap, too many
        ([((0, 0), (130, 32)), ((129, 0), (128, 32))], "overlap"),  # same total, overlapping
        ([((0, 0), (258, 40))], "beyond the tensor"),
    ],
)
def test_chunks_that_leave_gaps_or_overlap_are_refused(
    small_sharded, tmp_path, capsys, chunks, match
):
    def tile(index):
        name, meta = first_tensor(index)
        key = storage_of(index, name)
        info = index.storage_data.pop(key)
        meta.chunks = []
        for at, size in chunks:
            meta.chunks.append(dcp_metadata.ChunkStorageMetadata(torch.Size(at), torch.Size(size)))
            index.storage_data[dcp_metadata.MetadataIndex(name, torch.Size(at))] = info

    copy = crafted_copy(small_sharded, tmp_path, mutated(sharded.read_index(small_sharded), tile))
    refused(copy, match, capsys)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(relative_path="../secret.distcp"), "not a plain file name"),
        (dict(relative_path="."), "not a plain file name"),
        (dict(relative_path="__9_0.distcp"), "manifest does not list"),
        (dict(offset=1 << 40), "beyond the end"),
        (dict(length=-5), "non-negative integer"),
        (dict(offset="0"), "non-negative integer"),
        (dict(transform_descriptors=["zlib"]), "transforms"),
    ],
)
def test_a_storage_entry_outside_its_file_is_refused(
    small_sharded, tmp_path, capsys, change, match
):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "secret.distcp").write_bytes(b"\0" * 64)

    def edit(index):
        key = storage_of(index, first_tensor(index)[0])
        index.storage_data[key] = dataclasses.replace(index.storage_data[key], **change)

    copy = crafted_copy(small_sharded, tmp_path, mutated(sharded.read_index(small_sharded), edit))
    refused(copy, match, capsys)


def test_an_item_that_is_not_a_tensor_is_refused(small_sharded, tmp_path, capsys):
    def add_bytes(index):
        index.state_dict_metadata["extra"] = dcp_metadata.BytesStorageMetadata()

    data = mutated(sharded.read_index(small_sharded), add_bytes)
    copy = crafted_copy(small_sharded, tmp_path, data)
    refused(copy, "refused to unpickle|not a tensor", capsys)


def test_a_resume_whose_index_lacks_a_tensor_is_refused(small_sharded, tmp_path, capsys):
    def drop(index):
        name, _ = first_tensor(index)
        del index.state_dict_metadata[name]
        del index.storage_data[storage_of(index, name)]

    copy = crafted_copy(small_sharded, tmp_path, mutated(sharded.read_index(small_sharded), drop))
    assert cli.main(["--resume", str(copy), "--max-steps", "4"]) == 2
    err = capsys.readouterr().err
    assert "hold no model/tok_embeddings.weight" in err and err.count("\n") == 1


def test_the_written_index_holds_no_path(small_sharded):
    data = (small_sharded / "shards" / ".metadata").read_bytes()
    assert data[:2] == b"\x80\x02" and b"pathlib" not in data
    assert isinstance(sharded.read_index(small_sharded).storage_data, dict)
    assert filesystem._StorageInfo  # the class DCP's reader looks storage up with
