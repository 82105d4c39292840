"""The tensors of a sharded checkpoint, read from its shard files without unpickling anything.

DCP stores each chunk of a tensor in a ``.distcp`` file as the bytes ``torch.save`` writes for
it: a zip archive of stored (uncompressed) entries, ``<archive>/data.pkl`` a pickle describing
the tensor and ``<archive>/data/0`` its raw bytes. DCP's own reader hands every such record to
``torch.load``, which unpickles ``data.pkl`` (restricted to tensors, but still received bytes).
Here nothing is unpickled: the record's byte range, its dtype and its chunk's sizes come from the
checked index (``shared.sharded_index``), and the record is read as a zip (``zipfile`` parses
the central directory; reading it runs no code). A record must hold every entry stored, exactly
one storage (``data/0``) of exactly the chunk's bytes, a byte order torch names, and a
``data.pkl`` byte for byte the one ``torch.save`` writes for a contiguous tensor of that dtype
and shape (so its strides, storage offset and element count are the ones assumed; the pickle is
compared, never run). Then the tensor is built from the storage's bytes. Anything else is one
line naming the shard file and the tensor.
"""

from __future__ import annotations

import functools
import io
import struct
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch

from shared import door
from shared.errors import CheckpointError

LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then the name's and the extra's lengths
LOCAL_SIGNATURE = b"PK\x03\x04"
BYTE_ORDERS = ("little", "big")
RECORD_ENTRIES = 16  # torch.save writes seven; a record of more is not one of its
# what zipfile raises on bytes that are not a zip archive, or a damaged one
NOT_A_ZIP = (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError, struct.error)


def chunk_shapes(index: Any) -> dict[tuple[str, tuple[int, ...]], tuple[torch.dtype, tuple]]:
    """{(tensor name, chunk offsets): (dtype, chunk sizes)} of a checked index (a ``Metadata``
    built by ``shared.sharded_index.dcp_index``)."""
    return {
        (fqn, tuple(chunk.offsets)): (meta.properties.dtype, tuple(chunk.sizes))
        for fqn, meta in index.state_dict_metadata.items()
        for chunk in meta.chunks
    }


def read_items(reader: Any, plan: Any, planner: Any, shapes: dict) -> None:
    """DCP's ``read_data`` for ``reader`` (a FileSystemReader given a checked index): every
    ReadItem of ``plan`` read from its record through the door, its slice copied into the
    planner's target. Each shard file is opened once, its records read in file order."""
    from torch.distributed.checkpoint.planner import LoadItemType

    per_file: dict[str, list] = {}
    for item in plan.items:
        per_file.setdefault(reader.storage_data[item.storage_index].relative_path, []).append(item)
    for name, items in per_file.items():
        file = Path(reader.path) / name
        items.sort(key=lambda item: reader.storage_data[item.storage_index].offset)
        with door.open_read(file, error=CheckpointError) as handle:
            for item in items:
                key = (item.storage_index.fqn, tuple(item.storage_index.offset))
                where = f"{file}: {key[0]} at {list(key[1])}"
                if item.type == LoadItemType.BYTE_IO:
                    raise CheckpointError(f"{where}: asks for pickled bytes, which it never holds")
                dtype, sizes = shapes[key]
                info = reader.storage_data[item.storage_index]
                record = read_record(handle, info.offset, info.length, where)
                chunk = tensor_of_record(record, dtype, sizes, where)
                copy_into_target(chunk, item, planner, where)


def read_record(handle, offset: int, length: int, where: str) -> bytearray:
    """The ``length`` bytes at ``offset`` of the open shard file ``handle``."""
    record = bytearray(length)
    handle.seek(offset)
    got = handle.readinto(record)
    if got != length:
        raise CheckpointError(f"{where}: the file ends {length - got:,} bytes into its record")
    return record


def copy_into_target(chunk: torch.Tensor, item: Any, planner: Any, where: str) -> None:
    """The slice of ``chunk`` the ReadItem asks for (``storage_offsets`` and ``lengths``,
    relative to the chunk) copied into the planner's tensor for it, as DCP's reader does."""
    for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths)):
        if start + length > chunk.shape[dim]:
            raise CheckpointError(f"{where}: a read reaches beyond its chunk along dimension {dim}")
        chunk = chunk.narrow(dim, start, length)
    target = planner.resolve_tensor(item).detach()
    if target.shape != chunk.shape:
        raise CheckpointError(
            f"{where}: a slice of {tuple(chunk.shape)} read into {tuple(target.shape)}"
        )
    target.copy_(chunk)
    planner.commit_tensor(item, target)


def tensor_of_record(record: bytearray, dtype: torch.dtype, sizes: tuple, where: str):
    """The tensor a record written by ``torch.save`` holds, known to be a contiguous ``dtype``
    tensor of ``sizes``: its storage bytes copied into a new tensor, nothing unpickled."""
    entries = record_entries(record, where)
    storages = [name for name in entries if name.startswith("data/")]
    if storages != ["data/0"]:
        raise CheckpointError(f"{where}: its record holds {len(storages)} storages, not one")
    need = torch.Size(sizes).numel() * dtype.itemsize
    start, length = stored_range(record, entries["data/0"], where)
    if length != need:
        shape = " x ".join(map(str, sizes)) or "scalar"
        raise CheckpointError(
            f"{where}: its storage holds {length:,} bytes; a {shape} {dtype} chunk is {need:,}"
        )
    if small_entry(record, entries, "data.pkl", where) != described(dtype, sizes):
        raise CheckpointError(
            f"{where}: its record does not describe a contiguous {dtype} tensor of {list(sizes)}"
        )
    order = small_entry(record, entries, "byteorder", where).decode("ascii", "replace")
    if order not in BYTE_ORDERS:
        raise CheckpointError(f"{where}: its record's byte order is {order[:20]!r}")
    tensor = torch.empty(sizes, dtype=dtype)
    if need:
        raw = torch.frombuffer(record, dtype=torch.uint8, count=length, offset=start)
        if order != sys.byteorder and dtype.itemsize > 1:
            raw = raw.view(-1, dtype.itemsize).flip(-1).reshape(-1)
        if dtype is torch.bool and bool((raw > 1).any()):
            raise CheckpointError(f"{where}: a bool tensor with bytes other than 0 and 1")
        tensor.reshape(-1).view(torch.uint8).copy_(raw)
    return tensor


def record_entries(record: bytearray, where: str) -> dict[str, zipfile.ZipInfo]:
    """{name below the archive's one top folder: entry} of a record's zip, every entry
    stored as it is (no compression, no encryption)."""
    try:
        listed = zipfile.ZipFile(io.BytesIO(record)).infolist()
    except NOT_A_ZIP as error:
        why = f"its record is not a torch.save archive ({error})"
        raise CheckpointError(f"{where}: {why}") from None
    if not 0 < len(listed) <= RECORD_ENTRIES:
        raise CheckpointError(f"{where}: its record holds {len(listed)} entries")
    top = listed[0].filename.split("/", 1)[0]
    entries = {}
    for info in listed:
        folder, _, name = info.filename.partition("/")
        if folder != top or not name or name in entries:
            raise CheckpointError(f"{where}: its record's entries are not one archive's")
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
            raise CheckpointError(f"{where}: its record's {name[:40]} is compressed or encrypted")
        entries[name] = info
    return entries


def stored_range(record: bytearray, info: zipfile.ZipInfo, where: str) -> tuple[int, int]:
    """(start, length) of a stored entry's bytes in the record, read from its local header
    and checked against its CRC-32."""
    at = info.header_offset
    if at < 0 or at + LOCAL_HEADER.size > len(record):
        raise CheckpointError(f"{where}: its record is cut short")
    signature, name_length, extra_length = LOCAL_HEADER.unpack_from(record, at)
    start = at + LOCAL_HEADER.size + name_length + extra_length
    name = bytes(record[at + LOCAL_HEADER.size : at + LOCAL_HEADER.size + name_length])
    length = info.file_size
    if signature != LOCAL_SIGNATURE or name != info.filename.encode():
        raise CheckpointError(f"{where}: its record's {info.filename[:60]} has no local header")
    if length != info.compress_size or start + length > len(record):
        raise CheckpointError(f"{where}: its record is cut short")
    if zlib.crc32(memoryview(record)[start : start + length]) != info.CRC:
        raise CheckpointError(f"{where}: its record's {info.filename[:60]} fails its CRC-32")
    return start, length


def small_entry(record: bytearray, entries: dict, name: str, where: str) -> bytes:
    """The bytes of the record's entry ``name`` (a few hundred at most)."""
    if name not in entries or entries[name].file_size > 4096:
        raise CheckpointError(f"{where}: its record holds no {name}")
    start, length = stored_range(record, entries[name], where)
    return bytes(record[start : start + length])


@functools.lru_cache(maxsize=256)
def described(dtype: torch.dtype, sizes: tuple) -> bytes:
    """The ``data.pkl`` that ``torch.save`` writes for a contiguous ``dtype`` tensor of
    ``sizes``, as DCP saves a chunk: made by saving an empty tensor of that shape into memory
    with its storage bytes skipped (the allocation is never touched)."""
    buffer = io.BytesIO()
    with torch.serialization.skip_data():
        torch.save(torch.empty(sizes, dtype=dtype), buffer)
    archive = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    (pickled,) = [name for name in archive.namelist() if name.endswith("/data.pkl")]
    return archive.read(pickled)
