"""The index of a sharded checkpoint (which slice of which tensor lies where), as strict JSON.

DCP (``torch.distributed.checkpoint``) keeps its index as a pickle, ``shards/.metadata``; this
project writes the same index a second time as strict JSON of plain names and numbers,
``shards/index.json``, and reads only that:

    {"format": 1,
     "tensors": {"model/norm.weight": {"dtype": "float32", "size": [64],
                 "chunks": [{"offsets": [0], "sizes": [64],
                             "file": "__0_0.distcp", "offset": 0, "length": 1187}]}}}

Every field is checked (``checked_index``): the exact JSON type of each value; known dtype
names; whole numbers from 0 to 2**63 - 1; chunks inside their tensor that tile it exactly
(checked by sorting, never pair by pair); plain file names inside ``shards/`` that the manifest
lists; byte ranges inside those files, long enough for their chunk; at most ``MAX_CHUNKS``
chunks in all. A failure is one line naming the file and the field. DCP's ``Metadata`` is then
built here, in code, from the checked values, and handed to DCP's reader in place of the
pickle, which is never read on this path: a pickle's BUILD on one of the classes DCP's index
needs (``_MEM_FORMAT_ENCODING``) would change that class for the whole process.

A checkpoint written before the JSON index has only the pickle; it is refused with the command
that writes the JSON for it, ``duolm convert-checkpoint PATH --trust``
(``shared.training.convert``), the one place that unpickles an index.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from shared import checkpoint as ckpt
from shared import door
from shared.errors import CheckpointError


def _dcp_classes():
    """DCP's ``filesystem`` and ``metadata`` modules, imported when an index is read (half a
    second that a process which never reads one does not pay)."""
    from torch.distributed.checkpoint import filesystem, metadata

    return filesystem, metadata


SHARDS = ckpt.SHARDS
METADATA = f"{SHARDS}/.metadata"  # DCP's pickled index: read only by convert-checkpoint --trust
INDEX = f"{SHARDS}/index.json"
INDEX_FORMAT = 1
INDEX_LIMIT = 256 << 20  # bytes: a million chunks take about 120 MB of JSON
# Bounds on an index that no checkpoint of this project comes near (a million chunks is a
# thousand tensors over a thousand processes); a crafted one is refused before DCP sees it.
MAX_DIMS = 8
MAX_CHUNKS_PER_TENSOR = 1 << 17
MAX_CHUNKS = 1_000_000
MAX_NAME = 1000  # characters of a tensor's name
WHOLE_NUMBER_END = 1 << 63  # sizes, offsets and lengths fit a signed 64-bit integer
# The dtypes an index may name: those safetensors holds (a converted checkpoint is safetensors).
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
TENSOR_FIELDS = ("dtype", "size", "chunks")
CHUNK_FIELDS = ("offsets", "sizes", "file", "offset", "length")


# ------------------------------------------------------------------------ writing


def index_record(index: Any) -> dict[str, Any]:
    """The JSON form of DCP's index ``index`` (a ``Metadata``): every tensor's dtype, size and
    chunks, each chunk with the file, offset and length DCP stored it at. Anything but a dense
    tensor of a known dtype, stored without transforms, is a ValueError: this project's
    checkpoints hold nothing else."""
    _, metadata = _dcp_classes()
    stored = {(key.fqn, tuple(key.offset)): info for key, info in index.storage_data.items()}
    names = {dtype: name for name, dtype in DTYPES.items()}
    tensors = {}
    for fqn, meta in index.state_dict_metadata.items():
        if type(meta) is not metadata.TensorStorageMetadata:
            raise ValueError(f"{fqn} is not a tensor; a sharded checkpoint holds tensors only")
        properties = meta.properties
        if properties.dtype not in names or properties.layout is not torch.strided:
            raise ValueError(f"{fqn} is a {properties.dtype} {properties.layout} tensor")
        chunks = []
        for chunk in meta.chunks:
            info = stored.get((fqn, tuple(chunk.offsets)))
            if info is None:
                raise ValueError(f"a chunk of {fqn} is stored nowhere")
            if info.transform_descriptors:
                raise ValueError(f"{fqn} is stored through transforms")
            chunks.append(
                {
                    "offsets": list(chunk.offsets),
                    "sizes": list(chunk.sizes),
                    "file": info.relative_path,
                    "offset": info.offset,
                    "length": info.length,
                }
            )
        tensors[fqn] = {"dtype": names[properties.dtype], "size": list(meta.size), "chunks": chunks}
    return {"format": INDEX_FORMAT, "tensors": tensors}


def index_text(record: dict[str, Any]) -> str:
    """The record as the file holds it (compact: an index of a big run has a million chunks)."""
    return json.dumps(record, separators=(",", ":"))


# ------------------------------------------------------------------------ reading


def read_index(path: Path) -> Any:
    """DCP's index of the sharded checkpoint ``path``, built from its checked
    ``shards/index.json`` (``checked_index``); the pickled ``.metadata`` is never read."""
    path = Path(path)
    listed = ckpt.read_manifest(path)
    if INDEX not in listed:
        if METADATA in listed:
            raise CheckpointError(
                f"{path}: its shard index is only DCP's pickled {METADATA} (written by an "
                "earlier version), which is never unpickled when a checkpoint is read; if you "
                f"trust where it came from, run duolm convert-checkpoint {path} --trust "
                f"(it writes {INDEX})"
            )
        raise CheckpointError(
            f"{path}: its {ckpt.MANIFEST} lists no {INDEX} (not a sharded checkpoint)"
        )
    file = path / INDEX
    try:
        record = door.read_json_object(file, CheckpointError, path, limit=INDEX_LIMIT)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing file {INDEX}") from None
    return checked_index(record, file, shard_sizes(path, listed))


def shard_sizes(path: Path, listed: dict[str, str]) -> dict[str, int]:
    """{file name inside shards/: size in bytes} of the shard files the manifest lists."""
    sizes = {}
    for name in listed:
        if name.startswith(f"{SHARDS}/") and name not in (METADATA, INDEX):
            try:
                sizes[name[len(SHARDS) + 1 :]] = os.lstat(path / name).st_size
            except OSError:
                raise CheckpointError(f"{path}: missing file {name}") from None
    return sizes


def checked_index(record: Any, file: Path, sizes: dict[str, int]) -> Any:
    """DCP's ``Metadata`` built from ``record`` (an index.json's value) once every field of it
    is checked; ``sizes`` are the shard files the manifest lists. A bad field is one line."""
    try:
        tensors = checked_tensors(record, sizes)
    except ValueError as error:
        raise CheckpointError(f"{file}: {error}") from None
    return dcp_index(tensors)


def checked_tensors(record: Any, sizes: dict[str, int]) -> dict[str, tuple]:
    """{name: (dtype, size, [(offsets, sizes, file, offset, length) per chunk])} of a checked
    record: no more chunks than ``MAX_CHUNKS``, and no more tensor bytes than the shard files
    hold (a few KB of index can not ask for gigabytes)."""
    _fields(record, ("format", "tensors"), "the index")
    if type(record["format"]) is not int or record["format"] != INDEX_FORMAT:
        raise ValueError(f"format is {_shown(record['format'])}; this version reads format 1")
    entries = record["tensors"]
    if type(entries) is not dict:
        raise ValueError(f"tensors is {_shown(entries)}; it must be an object")
    tensors, chunks, need = {}, 0, 0
    for fqn, entry in entries.items():
        if not 0 < len(fqn) <= MAX_NAME:
            raise ValueError(f"a tensor's name is {len(fqn)} characters (1 to {MAX_NAME})")
        chunks += len(entry["chunks"]) if _is_entry(entry) else 0
        if chunks > MAX_CHUNKS:
            raise ValueError(f"it lists more than {MAX_CHUNKS:,} chunks (damaged or crafted)")
        tensors[fqn] = check_tensor(fqn, entry, sizes)
        dtype, _, stored = tensors[fqn]
        need += sum(_volume(extent) * dtype.itemsize for _, extent, *_ in stored)
    if need > sum(sizes.values()):
        raise ValueError(f"its tensors need {need:,} bytes; the shard files hold fewer")
    return tensors


def check_tensor(fqn: str, entry: Any, sizes: dict[str, int]) -> tuple:
    """(dtype, size, chunks) of one tensor's entry: a known dtype, a size of whole numbers, and
    chunks that lie inside it, each stored once, tiling it exactly."""
    where = f"tensors[{fqn[:80]!r}]"
    _fields(entry, TENSOR_FIELDS, where)
    name = entry["dtype"]
    if type(name) is not str or name not in DTYPES:
        raise ValueError(f"{where}.dtype is {_shown(name)}; it must be one of {', '.join(DTYPES)}")
    dtype = DTYPES[name]
    size = _extents(entry["size"], f"{where}.size")
    if _volume(size) * dtype.itemsize >= WHOLE_NUMBER_END:
        raise ValueError(f"{where}.size asks for more than 2**63 bytes")
    listed = entry["chunks"]
    if type(listed) is not list or not 0 < len(listed) <= MAX_CHUNKS_PER_TENSOR:
        raise ValueError(
            f"{where}.chunks is {_shown(listed)}; it must be a list of 1 to "
            f"{MAX_CHUNKS_PER_TENSOR:,} chunks"
        )
    chunks = [
        check_chunk(chunk, f"{where}.chunks[{i}]", size, dtype.itemsize, sizes)
        for i, chunk in enumerate(listed)
    ]
    starts = {at for at, *_ in chunks}
    if len(starts) != len(chunks):
        raise ValueError(f"{where}: two chunks start at the same offsets")
    check_tiling(where, size, [(at, extent) for at, extent, *_ in chunks])
    return dtype, size, chunks


def check_chunk(chunk: Any, where: str, size: tuple, itemsize: int, sizes: dict) -> tuple:
    """(offsets, sizes, file, offset, length) of one chunk: inside its tensor, stored in a
    listed shard file, in a byte range inside that file long enough for its elements."""
    _fields(chunk, CHUNK_FIELDS, where)
    at = _extents(chunk["offsets"], f"{where}.offsets", len(size))
    extent = _extents(chunk["sizes"], f"{where}.sizes", len(size))
    for dim, (start, length, whole) in enumerate(zip(at, extent, size)):
        if start + length > whole:
            raise ValueError(
                f"{where} reaches {start + length} along dimension {dim}, beyond the tensor's "
                f"{whole}"
            )
    file = chunk["file"]
    if type(file) is not str or file in ("", ".", "..") or "/" in file or "\0" in file:
        raise ValueError(f"{where}.file is {_shown(file)}, not a plain file name in {SHARDS}/")
    if file not in sizes:
        raise ValueError(f"{where}.file is {SHARDS}/{file[:80]}, which the manifest does not list")
    offset = _whole(chunk["offset"], f"{where}.offset")
    length = _whole(chunk["length"], f"{where}.length")
    if offset + length > sizes[file]:
        raise ValueError(
            f"{where}: bytes {offset:,} to {offset + length:,} lie beyond the end of "
            f"{SHARDS}/{file} ({sizes[file]:,} bytes)"
        )
    need = _volume(extent) * itemsize
    if need > length:
        raise ValueError(f"{where}: {need:,} bytes of data in a {length:,}-byte record")
    return at, extent, file, offset, length


def check_tiling(where: str, size: tuple, boxes: list[tuple]) -> None:
    """The chunks that hold elements cover every element of the tensor exactly once. Chunks of
    no elements are left out; a scalar is one chunk."""
    boxes = [box for box in boxes if _volume(box[1])]
    if not _volume(size):
        return
    if not size and len(boxes) != 1:
        raise ValueError(f"{where}: a scalar stored in {len(boxes)} chunks")
    if size:
        _tile(where, boxes, 0, size)


def _tile(where: str, boxes: list[tuple], dim: int, size: tuple) -> None:
    """``boxes`` (offsets, sizes), all sharing their extents along the dimensions before
    ``dim``, tile the rest of the tensor: grouped by their extent along ``dim`` and sorted, the
    groups follow one another from 0 to the tensor's size with no gap and no overlap, and each
    group tiles the dimensions after ``dim`` the same way. That is the layout DCP writes (FSDP's
    slabs along dimension 0, a grid of them under 2-D sharding), checked in O(n log n); a
    tiling that is not such nested slabs, which no writer of this project makes, is refused as
    an overlap."""
    groups: dict[tuple[int, int], list[tuple]] = {}
    for box in boxes:
        start = box[0][dim]
        groups.setdefault((start, start + box[1][dim]), []).append(box)
    end = 0
    for (start, stop), group in sorted(groups.items()):
        if start < end:
            raise ValueError(
                f"{where}: chunks overlap along dimension {dim} (one ends at {end}, another "
                f"starts at {start})"
            )
        if start > end:
            raise ValueError(f"{where}: no chunk covers {end} to {start} along dimension {dim}")
        end = stop
        if dim + 1 < len(size):
            _tile(where, group, dim + 1, size)
        elif len(group) > 1:
            raise ValueError(f"{where}: {len(group)} chunks cover the same elements")
    if end != size[dim]:
        raise ValueError(f"{where}: no chunk covers {end} to {size[dim]} along dimension {dim}")


def dcp_index(tensors: dict[str, tuple]) -> Any:
    """DCP's ``Metadata`` of checked tensors, built here from plain names and numbers."""
    filesystem, metadata = _dcp_classes()
    return metadata.Metadata(
        state_dict_metadata={
            fqn: metadata.TensorStorageMetadata(
                properties=metadata.TensorProperties(dtype=dtype),
                size=torch.Size(size),
                chunks=[
                    metadata.ChunkStorageMetadata(offsets=torch.Size(at), sizes=torch.Size(extent))
                    for at, extent, *_ in chunks
                ],
            )
            for fqn, (dtype, size, chunks) in tensors.items()
        },
        storage_data={
            metadata.MetadataIndex(fqn, torch.Size(at)): filesystem._StorageInfo(file, offset, n)
            for fqn, (_, _, chunks) in tensors.items()
            for at, _, file, offset, n in chunks
        },
        storage_meta=metadata.StorageMeta(),
    )


# ------------------------------------------------------------------------ field checks


def _shown(value: Any) -> str:
    """A value as a message shows it: short, whatever its size."""
    if type(value) is dict:
        return "an object"
    if type(value) is list:
        return f"a list of {len(value)}"
    if type(value) is str:
        return f"{value[:40]!r} (text)"
    if value is None or type(value) is bool:
        return json.dumps(value)
    return repr(value)[:40]


def _fields(value: Any, keys: tuple[str, ...], where: str) -> None:
    if type(value) is not dict:
        raise ValueError(f"{where} is {_shown(value)}; it must be an object of {', '.join(keys)}")
    missing = [key for key in keys if key not in value]
    if missing:
        raise ValueError(f"{where} lacks {missing[0]!r}")
    extra = [key for key in value if key not in keys]
    if extra:
        raise ValueError(f"{where} holds {extra[0][:40]!r}, which no index holds")


def _is_entry(entry: Any) -> bool:
    return type(entry) is dict and type(entry.get("chunks")) is list


def _whole(value: Any, where: str) -> int:
    if type(value) is not int or not 0 <= value < WHOLE_NUMBER_END:
        raise ValueError(
            f"{where} is {_shown(value)}; it must be a whole number from 0 to 2**63 - 1"
        )
    return value


def _extents(value: Any, where: str, rank: int | None = None) -> tuple[int, ...]:
    if type(value) is not list or len(value) > MAX_DIMS:
        raise ValueError(
            f"{where} is {_shown(value)}; it must be a list of at most {MAX_DIMS} numbers"
        )
    if rank is not None and len(value) != rank:
        raise ValueError(f"{where} has {len(value)} dimensions; its tensor has {rank}")
    return tuple(_whole(n, f"{where}[{i}]") for i, n in enumerate(value))


def _volume(extents: tuple[int, ...]) -> int:
    volume = 1
    for n in extents:
        volume *= n
    return volume
