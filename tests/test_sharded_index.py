"""A sharded checkpoint's index is read from ``shards/index.json`` (strict JSON of names and
numbers), every field checked (``shared.sharded_index.checked_index``), and DCP's ``Metadata``
built from it in code: DCP's pickled ``shards/.metadata`` is never unpickled when a checkpoint is
read. Only ``convert-checkpoint --trust`` reads that pickle, for a checkpoint of an earlier
version that has nothing else, through torch's weights-only unpickler. Each crafted index below
is refused in one line, opens nothing outside the checkpoint and writes nothing."""

import io
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch import _weights_only_unpickler
from torch.distributed.checkpoint import metadata as dcp_metadata

from shared import checkpoint as ckpt
from shared import sharded_checkpoint as sharded
from shared import sharded_index
from shared.errors import CheckpointError
from shared.path_checks import check_inside
from shared.training import cli, convert

OPENED: list[str] | None = None
EMBEDDING = "model/tok_embeddings.weight"  # 258 x 32 float32, one chunk in the tiny preset


def _record_opens(event: str, args: tuple) -> None:
    if OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, Path)):
        OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_record_opens)  # inert unless a test sets OPENED


def rewrite_manifest(copy: Path, leave_out: tuple[str, ...] = ()) -> None:
    files = sorted(p for p in copy.rglob("*") if p.is_file() and p.name != ckpt.MANIFEST)
    listed = {str(p.relative_to(copy)): ckpt.file_sha256(p) for p in files}
    listed = {name: digest for name, digest in listed.items() if name not in leave_out}
    (copy / ckpt.MANIFEST).write_text(json.dumps(listed))


def copy_of(checkpoint: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run" / "checkpoints" / checkpoint.name
    shutil.copytree(checkpoint, copy)
    return copy


def with_index(checkpoint: Path, tmp_path: Path, change) -> Path:
    """A copy of ``checkpoint`` whose index.json is the clean one with ``change(record)``
    applied (or ``change``'s return value, when it returns one), listed in its manifest."""
    copy = copy_of(checkpoint, tmp_path)
    record = json.loads((copy / sharded_index.INDEX).read_text())
    changed = change(record)
    text = (
        changed if isinstance(changed, str) else json.dumps(record if changed is None else changed)
    )
    (copy / sharded_index.INDEX).write_text(text)
    rewrite_manifest(copy)
    return copy


def with_pickled_index_only(
    checkpoint: Path, tmp_path: Path, metadata: bytes | None = None
) -> Path:
    """A copy as an earlier version wrote it: no index.json, only DCP's pickled .metadata."""
    copy = copy_of(checkpoint, tmp_path)
    (copy / sharded_index.INDEX).unlink()
    if metadata is not None:
        (copy / sharded_index.METADATA).write_bytes(metadata)
    rewrite_manifest(copy)
    return copy


def refused(copy: Path, match: str, capsys) -> None:
    """Refused by the reader and by the conversion, in one line, opening nothing outside the
    checkpoint and writing nothing into it."""
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


def embedding(record) -> dict:
    return record["tensors"][EMBEDDING]


def tiled(*boxes):
    """A change that stores the embedding as ``boxes`` ((offsets, sizes), ...), each in the
    byte range its one chunk had."""

    def change(record):
        entry = embedding(record)
        stored = entry["chunks"][0]
        entry["chunks"] = [{**stored, "offsets": list(a), "sizes": list(s)} for a, s in boxes]

    return change


def edit(path: str, value):
    """A change that sets one field of the embedding's entry, ``path`` as dotted keys."""

    def change(record):
        target = embedding(record)
        *parents, last = path.split(".")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[int(last) if isinstance(target, list) else last] = value

    return change


def drop(path: str):
    def change(record):
        target = embedding(record)
        *parents, last = path.split(".")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        del target[last]

    return change


# ------------------------------------------------------------------ the project's own index


def test_the_written_index_is_the_json_form_of_dcps_own(small_sharded):
    listed = ckpt.read_manifest(small_sharded)
    assert sharded_index.INDEX in listed and sharded_index.METADATA in listed
    record = json.loads((small_sharded / sharded_index.INDEX).read_text())
    # the test reads its own fixture's pickle as the oracle; the project never does
    dcp_own = pickle.loads((small_sharded / sharded_index.METADATA).read_bytes())
    assert record == sharded_index.index_record(dcp_own)
    assert embedding(record)["dtype"] == "float32" and embedding(record)["size"] == [258, 32]
    index = sharded.read_index(small_sharded)
    assert index.state_dict_metadata.keys() == dcp_own.state_dict_metadata.keys()
    assert index.storage_data == dcp_own.storage_data


def resumed(checkpoint: Path, out: Path, capsys) -> Path:
    """The newest checkpoint of a run that continued ``checkpoint`` to step 4 in ``out``."""
    status = cli.main(["--resume", str(checkpoint), "--out", str(out), "--max-steps", "4"])
    assert status == 0, capsys.readouterr().err
    return ckpt.list_checkpoints(out / "checkpoints")[-1]


def test_a_save_and_resume_read_the_json_and_never_unpickle(
    small_sharded, tmp_path, monkeypatch, capsys
):
    # the pickled index is garbage that would run a command, and every unpickler of the
    # standard library and the conversion's own raise: the resume still works
    witness = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {witness}",))

    copy = copy_of(small_sharded, tmp_path)
    (copy / sharded_index.METADATA).write_bytes(pickle.dumps(Payload(), protocol=2))
    rewrite_manifest(copy)

    def no_unpickling(*args, **kwargs):
        raise AssertionError("a checkpoint's index was unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, no_unpickling)
    monkeypatch.setattr(convert, "unpickle_index", no_unpickling)
    newest = resumed(copy, tmp_path / "resumed", capsys)
    assert newest.name == ckpt.checkpoint_name(4)
    assert sharded_index.INDEX in ckpt.read_manifest(newest)
    assert sharded.read_index(newest).state_dict_metadata.keys() == (
        sharded.read_index(copy).state_dict_metadata.keys()
    )
    assert convert.main([str(newest), "--to", "single"]) == 0
    assert not witness.exists()


def test_an_index_altered_after_the_save_fails_its_checksum(small_sharded, tmp_path, capsys):
    copy = copy_of(small_sharded, tmp_path)
    record = json.loads((copy / sharded_index.INDEX).read_text())
    embedding(record)["chunks"][0]["offset"] = 1
    (copy / sharded_index.INDEX).write_text(json.dumps(record))  # the manifest left as it was
    assert cli.main(["--resume", str(copy), "--max-steps", "4"]) == 2
    err = capsys.readouterr().err
    assert "checksum mismatch in shards/index.json" in err and err.count("\n") == 1, err


def mem_format_attack() -> bytes:
    """A pickle that BUILDs onto a member of DCP's _MEM_FORMAT_ENCODING (an allowed class):
    the member is one object for the whole process, so its value would stay 99 after."""
    return (
        b"\x80\x02ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\n"
        b"K\x00\x85R}X\x07\x00\x00\x00_value_Kcsb."
    )


def contiguous_value() -> int:
    return dcp_metadata._MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT.value


def test_the_mem_format_attack_is_real_against_the_bare_unpickler():
    member = dcp_metadata._MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT
    saved = dict(vars(member))
    try:
        with torch.serialization.safe_globals([dcp_metadata._MEM_FORMAT_ENCODING]):
            _weights_only_unpickler.Unpickler(io.BytesIO(mem_format_attack())).load()
        assert contiguous_value() == 99  # what a resume through the unpickler would have kept
    finally:
        vars(member).update(saved)
    assert contiguous_value() == 0


def test_a_crafted_metadata_beside_a_good_index_changes_nothing(small_sharded, tmp_path, capsys):
    copy = copy_of(small_sharded, tmp_path)
    (copy / sharded_index.METADATA).write_bytes(mem_format_attack())
    rewrite_manifest(copy)
    newest = resumed(copy, tmp_path / "resumed", capsys)
    assert contiguous_value() == 0
    assert convert.main([str(newest), "--to", "single"]) == 0  # what the run wrote after reads

    alone = with_pickled_index_only(small_sharded, tmp_path / "alone", mem_format_attack())
    assert convert.main([str(alone), "--trust"]) == 2
    err = capsys.readouterr().err
    assert "changed DCP's _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT" in err, err
    assert contiguous_value() == 0 and not (alone / sharded_index.INDEX).exists()


# ------------------------------------------------------------------ an earlier version's


def test_a_checkpoint_with_only_the_pickled_index_is_refused_with_the_convert_hint(
    small_sharded, tmp_path, capsys
):
    old = with_pickled_index_only(small_sharded, tmp_path)
    hint = f"duolm convert-checkpoint {old} --trust"
    with pytest.raises(CheckpointError, match="--trust"):
        sharded.read_index(old)
    for command, argv in (
        (cli.main, ["--resume", str(old), "--max-steps", "4"]),
        (convert.main, [str(old), "--to", "single"]),
    ):
        status = command(argv)
        err = capsys.readouterr().err
        assert status == 2 and hint in err and err.count("\n") == 1, err
    assert convert.main([str(old)]) == 2  # without --trust nothing is unpickled
    assert not (old / sharded_index.INDEX).exists()


def test_convert_trust_writes_the_json_index_and_then_it_resumes(small_sharded, tmp_path, capsys):
    old = with_pickled_index_only(small_sharded, tmp_path)
    assert convert.main([str(old), "--trust"]) == 0
    assert f"converted {old}" in capsys.readouterr().out
    assert sharded_index.INDEX in ckpt.read_manifest(old)
    ckpt.verify_checkpoint(old)
    assert (old / sharded_index.INDEX).read_bytes() == (
        small_sharded / sharded_index.INDEX
    ).read_bytes()
    assert convert.main([str(old), "--trust"]) == 0
    assert "already current" in capsys.readouterr().out
    resumed(old, tmp_path / "resumed", capsys)


def clean_index(checkpoint: Path):
    return pickle.loads((checkpoint / sharded_index.METADATA).read_bytes())  # the test's own


def test_convert_trust_refuses_a_path_object_in_the_pickled_index(small_sharded, tmp_path, capsys):
    secret = tmp_path / "secret.distcp"
    secret.write_bytes(b"\0" * 64)
    index = clean_index(small_sharded)
    key = next(key for key in index.storage_data if key.fqn == EMBEDDING)
    index.storage_data[key].relative_path = Path(secret)
    old = with_pickled_index_only(small_sharded, tmp_path, pickle.dumps(index, protocol=2))
    assert convert.main([str(old), "--trust"]) == 2
    err = capsys.readouterr().err
    assert "asks for pathlib" in err and err.count("\n") == 1, err


def test_convert_trust_refuses_build_on_a_class_and_changes_no_class(
    small_sharded, tmp_path, capsys
):
    # BUILD on the class Metadata itself with slot state {"is_relative_to": None} would set a
    # class attribute
    build_on_class = (
        b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n"
        b"N}X\x0e\x00\x00\x00is_relative_toNs\x86b."
    )
    old = with_pickled_index_only(small_sharded, tmp_path, build_on_class)
    assert convert.main([str(old), "--trust"]) == 2
    assert "refused to unpickle" in capsys.readouterr().err
    assert "is_relative_to" not in vars(dcp_metadata.Metadata)
    with pytest.raises(Exception, match="lies outside"):
        check_inside(Path("/etc/passwd"), tmp_path, "a test")


def test_convert_trust_checks_the_unpickled_index_as_a_read_does(small_sharded, tmp_path, capsys):
    index = clean_index(small_sharded)
    key = next(key for key in index.storage_data if key.fqn == EMBEDDING)
    index.storage_data[key].relative_path = "../secret.distcp"
    old = with_pickled_index_only(small_sharded, tmp_path, pickle.dumps(index, protocol=2))
    assert convert.main([str(old), "--trust"]) == 2
    err = capsys.readouterr().err
    assert "not a plain file name" in err and err.count("\n") == 1, err
    assert not (old / sharded_index.INDEX).exists()


# ------------------------------------------------------------------ crafted JSON indexes


CRAFTED = [
    (lambda record: [], "not an object"),
    (lambda record: "{" * 100_000, "nested too deeply|not JSON"),
    (lambda record: '{"format": 1, "tensors": {"a": ' + "9" * 400 + "}}", "400 digits"),
    (lambda record: {**record, "format": "1"}, "format is '1'"),
    (lambda record: {**record, "format": True}, "format is true"),
    (lambda record: {"format": 1}, "lacks 'tensors'"),
    (lambda record: {**record, "bytes": {}}, "holds 'bytes'"),
    (lambda record: {**record, "tensors": []}, "tensors is a list"),
    (lambda record: {**record, "tensors": {"": embedding(record)}}, "name is 0 characters"),
    (edit("dtype", "complex64"), "dtype is 'complex64'"),
    (edit("dtype", 5), "dtype is 5"),
    (drop("dtype"), "lacks 'dtype'"),
    (edit("size", [-1, 32]), r"size\[0\] is -1"),
    (edit("size", ["258", 32]), r"size\[0\] is '258'"),
    (edit("size", [10**30, 32]), r"size\[0\] is 1000000000000000000000000000000"),
    (edit("size", [1] * 9), "at most 8"),
    (edit("size", 258.0), "size is 258.0"),
    (edit("size", [1 << 62, 1 << 62]), "more than 2\\*\\*63 bytes"),
    (edit("chunks", {}), "chunks is an object"),
    (edit("chunks", []), "list of 1 to"),
    (edit("chunks.0", "chunk"), r"chunks\[0\] is 'chunk'"),
    (drop("chunks.0.length"), "lacks 'length'"),
    (edit("chunks.0.extra", 1), "holds 'extra'"),
    (edit("chunks.0.offsets", [0]), "has 1 dimensions; its tensor has 2"),
    (edit("chunks.0.sizes", [258, -32]), r"sizes\[1\] is -32"),
    (edit("chunks.0.file", "../secret.distcp"), "not a plain file name"),
    (edit("chunks.0.file", "."), "not a plain file name"),
    (edit("chunks.0.file", ["__0_0.distcp"]), "not a plain file name"),
    (edit("chunks.0.file", "__9_0.distcp"), "manifest does not list"),
    (edit("chunks.0.file", "index.json"), "manifest does not list"),
    (edit("chunks.0.offset", 1 << 40), "beyond the end"),
    (edit("chunks.0.length", -5), "length is -5"),
    (edit("chunks.0.offset", "0"), "offset is '0'"),
    (edit("chunks.0.length", True), "length is true"),
    (edit("chunks.0.length", 100), "bytes of data in a 100-byte record"),
    (tiled(((0, 0), (129, 32))), "no chunk covers 129 to 258 along dimension 0"),
    (tiled(((0, 0), (130, 32)), ((129, 0), (129, 32))), "chunks overlap along dimension 0"),
    (tiled(((0, 0), (258, 16)), ((0, 0), (258, 32))), "same offsets"),
    (tiled(((0, 0), (258, 16)), ((0, 15), (258, 17))), "overlap along dimension 1"),
    (tiled(((0, 0), (258, 40))), "beyond the tensor's 32"),
]


@pytest.mark.parametrize("change, match", CRAFTED)
def test_a_crafted_json_index_is_refused_in_one_line(
    small_sharded, tmp_path, capsys, change, match
):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "secret.distcp").write_bytes(b"\0" * 64)
    refused(with_index(small_sharded, tmp_path, change), match, capsys)


def test_a_size_bomb_is_refused_before_anything_is_allocated(small_sharded, tmp_path, capsys):
    def bomb(record):
        entry = embedding(record)
        entry["size"] = [1 << 20, 1 << 12]
        entry["chunks"][0].update(sizes=[1 << 20, 1 << 12], length=1 << 34)

    refused(with_index(small_sharded, tmp_path, bomb), "beyond the end", capsys)


def test_an_index_of_more_chunks_than_the_bound_is_refused(
    small_sharded, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(sharded_index, "MAX_CHUNKS", 10)
    refused(with_index(small_sharded, tmp_path, lambda record: None), "more than 10 chunks", capsys)


def test_a_resume_whose_index_lacks_a_tensor_is_refused(small_sharded, tmp_path, capsys):
    def lose_the_embedding(record):
        del record["tensors"][EMBEDDING]

    copy = with_index(small_sharded, tmp_path, lose_the_embedding)
    assert cli.main(["--resume", str(copy), "--max-steps", "4"]) == 2
    err = capsys.readouterr().err
    # refused before the model is built: the index declares no such weight
    assert "missing ['tok_embeddings.weight']" in err and err.count("\n") == 1


# ------------------------------------------------------------------ tiling, without a checkpoint


def record_of(size: list[int], boxes) -> dict:
    chunks = [
        {"offsets": list(at), "sizes": list(extent), "file": "a", "offset": 0, "length": 1 << 20}
        for at, extent in boxes
    ]
    return {"format": 1, "tensors": {"t": {"dtype": "float32", "size": size, "chunks": chunks}}}


def check(size, boxes):
    return sharded_index.checked_index(record_of(size, boxes), Path("index.json"), {"a": 1 << 20})


def test_a_tensor_of_16384_chunks_is_checked_by_sorting():
    rows = 1 << 14
    boxes = [((row, 0), (1, 4)) for row in reversed(range(rows))]
    index = check([rows, 4], boxes)
    assert len(index.storage_data) == rows
    overlapping = [*boxes[:-1], ((0, 0), (2, 4))]  # row 0's chunk reaches over row 1
    with pytest.raises(CheckpointError, match="index.json: tensors\\['t'\\]: .*overlap"):
        check([rows, 4], overlapping)


@pytest.mark.parametrize(
    "size, boxes, match",
    [
        ([4, 6], [((r, c), (2, 3)) for r in (2, 0) for c in (3, 0)], None),  # a 2 x 2 grid
        ([4, 6], [((0, 0), (2, 6)), ((2, 0), (2, 2)), ((2, 2), (2, 4))], None),  # slabs split
        ([3, 2], [((0, 0), (3, 2)), ((3, 0), (0, 2))], None),  # an empty chunk at the end
        ([0, 5], [((0, 0), (0, 5))], None),  # an empty tensor
        ([], [((), ())], None),  # a scalar (AdamW's step)
        ([], [((), ()), ((), ())], "same offsets"),
        ([4, 6], [((0, 0), (2, 6)), ((2, 0), (2, 2)), ((2, 3), (2, 3))], "no chunk covers 2 to 3"),
        ([4, 6], [((0, 0), (4, 6)), ((1, 1), (1, 1))], "overlap along dimension 0"),
        ([128, 4096], [((r, 0), (1, 4096)) for r in range(128)], "the shard files hold fewer"),
    ],
)
def test_chunk_layouts(size, boxes, match):
    if match is None:
        check(size, boxes)
    else:
        with pytest.raises(CheckpointError, match=match):
            check(size, boxes)
