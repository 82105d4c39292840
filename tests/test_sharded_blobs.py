"""A sharded checkpoint's tensors are read from their records in the ``.distcp`` files as raw
bytes (``shared.sharded_blobs``): each record is the zip ``torch.save`` writes, read without
unpickling its ``data.pkl``. The tensors come out bit for bit as DCP's own loader
(``torch.load``) gives them; a record that is not one contiguous tensor of the dtype and shape
the index gives is refused in one line naming the shard file and the tensor; and a resume and a
conversion to one file never call ``torch.load`` or any unpickler."""

import io
import json
import pickle
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from helpers import checkpoint_in_a_run, relist
from safetensors.torch import load_file
from torch import _weights_only_unpickler, nn

from shared import checkpoint as ckpt
from shared import sharded_blobs, sharded_index
from shared import sharded_checkpoint as sharded
from shared.errors import CheckpointError
from shared.tokenizer import Tokenizer
from shared.training import cli, convert

EMBEDDING = "model/tok_embeddings.weight"  # 258 x 32 float32, one chunk in the tiny preset
SHARD = "__0_0.distcp"


def saved(tensor: torch.Tensor) -> bytearray:
    """The record DCP writes for ``tensor``: what ``torch.save`` makes of it."""
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return bytearray(buffer.getvalue())


def entries_of(record: bytearray) -> dict[str, bytes]:
    archive = zipfile.ZipFile(io.BytesIO(bytes(record)))
    return {info.filename: archive.read(info) for info in archive.infolist()}


def rezipped(entries: dict[str, bytes], compressed: tuple[str, ...] = ()) -> bytearray:
    """A zip of ``entries`` in order, stored unless named in ``compressed``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            how = zipfile.ZIP_DEFLATED if name in compressed else zipfile.ZIP_STORED
            archive.writestr(name, data, compress_type=how)
    return bytearray(buffer.getvalue())


def read_back(record: bytearray, tensor: torch.Tensor) -> torch.Tensor:
    return sharded_blobs.tensor_of_record(record, tensor.dtype, tuple(tensor.shape), "f: t")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8))
    )


def every_tensor(checkpoint: Path) -> dict[str, tuple[torch.dtype, tuple]]:
    index = sharded.read_index(checkpoint)
    return {k: (m.properties.dtype, tuple(m.size)) for k, m in index.state_dict_metadata.items()}


def dcps_own(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Every tensor as DCP's stock reader gives it (the oracle: its pickled index and
    ``torch.load`` of each record, over the test's own fixture)."""
    tensors = {k: torch.empty(s, dtype=d) for k, (d, s) in every_tensor(checkpoint).items()}
    reader = dcp.FileSystemReader(str(checkpoint / ckpt.SHARDS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(tensors, storage_reader=reader, no_dist=True)
    return tensors


def forbid_unpickling(monkeypatch) -> None:
    """torch.load and every unpickler raise from here to the end of the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a received file was unpickled")

    for owner, name in (
        (torch, "load"),
        (torch.serialization, "load"),
        (pickle, "load"),
        (pickle, "loads"),
        (pickle, "Unpickler"),
        (_weights_only_unpickler, "Unpickler"),
        (_weights_only_unpickler, "load"),
    ):
        monkeypatch.setattr(owner, name, refuse)


@pytest.fixture
def no_unpickling(monkeypatch):
    forbid_unpickling(monkeypatch)


# ------------------------------------------------------------------ records read as bytes


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(5, 3),
        torch.randn(2, 3, 4).to(torch.bfloat16),
        torch.randn(7).half(),
        torch.randn(3, 2).double(),
        torch.tensor(3.0),  # AdamW's step count
        torch.arange(-6, 6).reshape(3, 4),
        torch.arange(12, dtype=torch.int32),
        torch.tensor([True, False, True]),
        torch.empty(0, 4),
    ],
)
def test_a_record_reads_back_bit_for_bit_without_torch_load(tensor, no_unpickling):
    assert same_bits(read_back(saved(tensor), tensor), tensor)


def test_a_big_endian_record_is_swapped_into_place():
    tensor = torch.randn(4, 3)
    entries = entries_of(saved(tensor))
    for name in entries:
        if name.endswith("/byteorder"):
            entries[name] = b"big"
        elif name.endswith("/data/0"):
            entries[name] = tensor.numpy().astype(">f4").tobytes()
    assert same_bits(read_back(rezipped(entries), tensor), tensor)


def with_entries(change):
    """A record of a 4 x 3 float32 tensor with ``change(entries)`` applied, rezipped; change
    may return (entries, names to compress)."""

    def record():
        entries = entries_of(saved(torch.randn(4, 3)))
        changed = change(entries)
        return rezipped(*changed) if isinstance(changed, tuple) else rezipped(entries)

    return record


def entry(entries: dict, suffix: str) -> str:
    return next(name for name in entries if name.endswith(suffix))


def two_storages(entries):
    entries["archive/data/1"] = entries[entry(entries, "/data/0")]


def compressed(entries):
    return entries, (entry(entries, "/data.pkl"),)  # any entry: data/0 would shrink below its size


def short_storage(entries):
    entries[entry(entries, "/data/0")] = entries[entry(entries, "/data/0")][:-4]


def odd_byte_order(entries):
    entries[entry(entries, "/byteorder")] = b"middle"


CRAFTED = [
    (with_entries(short_storage), "its storage holds 44 bytes; a 4 x 3 torch.float32 chunk is 48"),
    (with_entries(two_storages), "holds 2 storages, not one"),
    (with_entries(compressed), "compressed or encrypted"),
    (with_entries(odd_byte_order), "byte order is 'middle'"),
    (lambda: saved(torch.randn(3, 4).t()), "does not describe a contiguous torch.float32"),
    (lambda: saved(torch.randn(4, 3))[:-30], "not a torch.save archive"),
    (lambda: bytearray(b"\x80\x02" + bytes(60)), "not a torch.save archive"),
]


@pytest.mark.parametrize("record, match", CRAFTED)
def test_a_crafted_record_is_one_refused_line(record, match, no_unpickling):
    with pytest.raises(CheckpointError, match=f"^f: t: .*{match}") as refused:
        sharded_blobs.tensor_of_record(record(), torch.float32, (4, 3), "f: t")
    assert "\n" not in str(refused.value)


# ------------------------------------------------------------------ a checkpoint's records


def test_a_checkpoint_reads_bit_for_bit_as_dcps_own_loader(small_sharded, monkeypatch):
    theirs = dcps_own(small_sharded)
    forbid_unpickling(monkeypatch)
    shapes = every_tensor(small_sharded)
    ours = {k: torch.full(s, 7, dtype=d) for k, (d, s) in shapes.items()}
    sharded.load_checked(small_sharded, sharded.read_index(small_sharded), ours, no_dist=True)
    assert ours.keys() == theirs.keys() and len(ours) > 50
    assert all(same_bits(ours[k], theirs[k]) for k in ours)


def with_embedding_record(checkpoint: Path, tmp_path: Path, record: bytearray) -> Path:
    """A copy whose embedding's record is ``record``, appended to its shard file and pointed at
    by its index, the manifest rewritten to match (what a sender of a crafted folder does)."""
    copy = checkpoint_in_a_run(checkpoint, tmp_path)
    shard = copy / ckpt.SHARDS / SHARD
    offset = shard.stat().st_size
    shard.write_bytes(shard.read_bytes() + bytes(record))
    index = json.loads((copy / sharded_index.INDEX).read_text())
    index["tensors"][EMBEDDING]["chunks"][0].update(offset=offset, length=len(record))
    (copy / sharded_index.INDEX).write_text(json.dumps(index))
    relist(copy)
    return copy


def embedding_entries(checkpoint: Path) -> dict[str, bytes]:
    chunk = json.loads((checkpoint / sharded_index.INDEX).read_text())["tensors"][EMBEDDING]
    start, length = chunk["chunks"][0]["offset"], chunk["chunks"][0]["length"]
    data = (checkpoint / ckpt.SHARDS / SHARD).read_bytes()
    return entries_of(bytearray(data[start : start + length]))


@pytest.mark.parametrize(
    "change, match",
    [
        (short_storage, "its storage holds 33,020 bytes; a 258 x 32 torch.float32 chunk is 33,024"),
        (two_storages, "holds 2 storages, not one"),
        (compressed, "compressed or encrypted"),
    ],
)
def test_a_checkpoint_with_a_crafted_record_is_refused_in_one_line(
    small_sharded, tmp_path, capsys, no_unpickling, change, match
):
    entries = embedding_entries(small_sharded)
    changed = change(entries)
    record = rezipped(*changed) if isinstance(changed, tuple) else rezipped(entries)
    copy = with_embedding_record(small_sharded, tmp_path, record)
    assert cli.main(["--resume", str(copy), "--out", str(tmp_path / "resumed")]) == 2
    assert convert.main([str(copy), "--to", "single"]) == 2
    lines = capsys.readouterr().err.splitlines()
    named = f"{copy / ckpt.SHARDS / SHARD}: {EMBEDDING} at [0, 0]: "
    assert len(lines) == 2 and all(named in line and match in line for line in lines), lines
    assert not (copy / "model.safetensors").exists()


def test_a_cut_record_is_refused_in_one_line(small_sharded, tmp_path, capsys):
    copy = checkpoint_in_a_run(small_sharded, tmp_path)
    index = json.loads((copy / sharded_index.INDEX).read_text())
    index["tensors"][EMBEDDING]["chunks"][0]["length"] = 258 * 32 * 4 + 100  # no zip directory
    (copy / sharded_index.INDEX).write_text(json.dumps(index))
    relist(copy)
    assert convert.main([str(copy), "--to", "single"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{EMBEDDING} at [0, 0]: " in err, err
    assert "not a torch.save archive" in err


def test_resume_and_conversion_never_unpickle_and_give_dcps_weights(
    small_sharded, tmp_path, monkeypatch, capsys
):
    theirs = dcps_own(small_sharded)
    copy = checkpoint_in_a_run(small_sharded, tmp_path)
    forbid_unpickling(monkeypatch)
    status = cli.main(["--resume", str(copy), "--out", str(tmp_path / "on"), "--max-steps", "4"])
    assert status == 0, capsys.readouterr().err
    assert ckpt.list_checkpoints(tmp_path / "on" / "checkpoints")[-1].name.endswith("4")
    assert convert.main([str(tmp_path / "run"), "--to", "single"]) == 0  # the run's checkpoints
    weights = load_file(copy / "model.safetensors")
    moments = load_file(copy / "optimizer.safetensors")
    for key, tensor in theirs.items():
        kind, name = key.split("/", 1)
        assert same_bits((weights if kind == "model" else moments)[name], tensor), key


def test_a_non_contiguous_parameter_is_saved_as_a_record_the_reader_takes(tmp_path):
    model = nn.Linear(3, 4)
    model.weight = nn.Parameter(torch.randn(3, 4).t())  # transposed: DCP would save its strides
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    checkpoint = sharded.save_sharded_checkpoint(
        tmp_path / "checkpoints",
        1,
        model=model,
        optimizer=optimizer,
        tokenizer=Tokenizer.byte(),
        state={},
        scheduler_state=None,
    )
    shapes = every_tensor(checkpoint)
    back = {k: torch.empty(s, dtype=d) for k, (d, s) in shapes.items()}
    sharded.load_checked(checkpoint, sharded.read_index(checkpoint), back, no_dist=True)
    assert same_bits(back["model/weight"], model.weight.detach().contiguous())
    moment = optimizer.state[model.weight]["exp_avg"]
    assert same_bits(back["optimizer/weight/exp_avg"], moment.contiguous())
