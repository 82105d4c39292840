"""The index of a sharded checkpoint (DCP's pickled ``shards/.metadata``), read and checked.

The index is written at pickle protocol 2 with no path in it (``shared.sharded_checkpoint``)
and read here through the door by torch's own weights-only unpickler (the pure-Python one
behind ``torch.load(weights_only=True)``), allowing DCP's index classes and nothing else: no
path object (a pickle's BUILD can set a path object's parts so that it prints one name and
opens another), no BUILD on a class (torch's unpickler builds instances of allowed classes
only). Then the whole index is checked (``checked_index``): exact types; file names that are
plain names the manifest lists; integer byte ranges inside each file; chunks that tile every
tensor exactly; no more tensor bytes than the files hold; no transforms. DCP is handed an index
rebuilt from the checked values.
"""

from __future__ import annotations

import io
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import _weights_only_unpickler

from shared import checkpoint as ckpt
from shared import door
from shared.errors import CheckpointError


def _dcp_classes():
    """DCP's ``filesystem`` and ``metadata`` modules, imported when an index is read (half a
    second that a process which never reads one does not pay)."""
    from torch.distributed.checkpoint import filesystem, metadata

    return filesystem, metadata


SHARDS = ckpt.SHARDS
METADATA = f"{SHARDS}/.metadata"
# Bounds on an index that no checkpoint of this project comes near; a crafted one is refused
# before anything is allocated for it.
MAX_DIMS = 8
MAX_CHUNKS_PER_TENSOR = 1 << 14
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


def _index_globals() -> list[Any]:
    """What torch's weights-only unpickler may make beyond tensors, sizes and dtypes: the
    classes of DCP's index (BUILD on their instances only, never on a class). No path: the
    index this project writes records none (``IndexWriter``), and a path object is what a
    crafted pickle would use to name one file while opening another."""
    filesystem, metadata = _dcp_classes()
    return [
        metadata.Metadata,
        metadata.TensorStorageMetadata,
        metadata.TensorProperties,
        metadata.ChunkStorageMetadata,
        metadata.MetadataIndex,
        metadata.StorageMeta,
        metadata._MEM_FORMAT_ENCODING,
        filesystem._StorageInfo,
    ]


def unpickle_index(data: bytes, file: Path) -> Any:
    """DCP's pickled index through torch's own pure-Python weights-only unpickler (the one
    ``torch.load(weights_only=True)`` uses), allowing only ``_index_globals``."""
    if data[:1] == b"\x80" and len(data) > 1 and data[1] > 2:
        raise CheckpointError(
            f"{file}: pickled at protocol {data[1]}; this version writes and reads indexes at "
            "protocol 2 (torch's weights-only unpickler): save the checkpoint with this version"
        )
    try:
        with torch.serialization.safe_globals(_index_globals()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's note on the protocol, said above instead
            return _weights_only_unpickler.Unpickler(io.BytesIO(data), encoding="ASCII").load()
    except Exception as error:  # noqa: BLE001 - any failure of a crafted pickle is a refusal
        reason = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        asked = re.search(r"GLOBAL (\S+)", reason)
        what = f"it asks for {asked.group(1)}" if asked else reason[:200]
        raise CheckpointError(
            f"{file}: refused to unpickle: {what}, which no index of a sharded checkpoint holds"
        ) from None


def read_index(path: Path) -> Any:
    """The DCP index (``shards/.metadata``) of the checkpoint ``path``, read through the door,
    unpickled by torch's weights-only unpickler, then checked whole and rebuilt from the
    checked values (``checked_index``): what DCP is given holds nothing the pickle chose but
    plain names, numbers and sizes."""
    file = Path(path) / METADATA
    try:
        data = door.read_bytes(file, Path(path), error=CheckpointError, limit=INDEX_LIMIT)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no {METADATA} (not a sharded checkpoint)") from None
    listed = ckpt.read_manifest(path)
    sizes = {}
    for name in listed:
        if name.startswith(f"{SHARDS}/") and name != METADATA:
            try:
                sizes[name[len(SHARDS) + 1 :]] = os.lstat(Path(path) / name).st_size
            except OSError:
                raise CheckpointError(f"{path}: missing file {name}") from None
    return checked_index(unpickle_index(data, file), file, sizes)


INDEX_LIMIT = 256 << 20  # bytes: an index of a model far beyond a trillion parameters fits


def _size(value: Any, where: str) -> tuple[int, ...]:
    if type(value) is not torch.Size or len(value) > MAX_DIMS:
        raise ValueError(f"{where} is not a size of at most {MAX_DIMS} dimensions")
    if any(type(n) is not int or n < 0 for n in value):
        raise ValueError(f"{where} holds a negative or non-integer extent")
    return tuple(value)


def _count(value: Any, where: str) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{where} is {str(value)[:40]}, not a non-negative integer")
    return value


def _volume(extents: tuple[int, ...]) -> int:
    volume = 1
    for n in extents:
        volume *= n
    return volume


def _overlap(a: tuple, b: tuple) -> bool:
    """Whether two boxes (offsets, sizes) share an element."""
    (a_at, a_size), (b_at, b_size) = a, b
    return all(max(x, y) < min(x + m, y + n) for x, m, y, n in zip(a_at, a_size, b_at, b_size))


def check_tensor(fqn: str, meta: Any) -> tuple[torch.dtype, tuple[int, ...], list[tuple]]:
    """(dtype, size, chunks) of one tensor's entry: a dense tensor of a type safetensors holds,
    whose chunks lie inside it, overlap nowhere and cover every element exactly once."""
    filesystem, metadata = _dcp_classes()
    if type(meta) is not metadata.TensorStorageMetadata:
        raise ValueError(f"{fqn} is not a tensor (its reading would unpickle it)")
    properties = meta.properties
    if type(properties) is not metadata.TensorProperties:
        raise ValueError(f"{fqn} has no tensor properties")
    if properties.dtype not in _SAFETENSORS_DTYPES or properties.layout is not torch.strided:
        raise ValueError(f"{fqn} is a {properties.dtype} {properties.layout} tensor")
    size = _size(meta.size, f"{fqn} size")
    if type(meta.chunks) is not list or not 0 < len(meta.chunks) <= MAX_CHUNKS_PER_TENSOR:
        raise ValueError(f"{fqn} lists no chunks (or too many)")
    chunks = []
    for chunk in meta.chunks:
        if type(chunk) is not metadata.ChunkStorageMetadata:
            raise ValueError(f"{fqn} has a chunk that is not a chunk")
        at, extent = _size(chunk.offsets, f"{fqn} chunk"), _size(chunk.sizes, f"{fqn} chunk")
        if len(at) != len(size) or len(extent) != len(size):
            raise ValueError(f"{fqn} has a chunk of another rank than the tensor")
        if any(o + n > whole for o, n, whole in zip(at, extent, size)):
            raise ValueError(f"{fqn} has a chunk that reaches beyond the tensor")
        chunks.append((at, extent))
    if sum(_volume(extent) for _, extent in chunks) != _volume(size):
        raise ValueError(f"{fqn}: its chunks do not cover the tensor exactly (gaps or overlaps)")
    for i, first in enumerate(chunks):
        if any(_overlap(first, other) for other in chunks[i + 1 :]):
            raise ValueError(f"{fqn}: two of its chunks overlap")
    return properties.dtype, size, chunks


def check_storage(key: Any, info: Any, sizes: dict[str, int]) -> tuple[str, tuple, str, int, int]:
    """(fqn, chunk offset, file, offset, length) of one storage entry: a plain file name the
    manifest lists, and a byte range inside that file, with no transforms."""
    filesystem, metadata = _dcp_classes()
    if type(key) is not metadata.MetadataIndex or type(info) is not filesystem._StorageInfo:
        raise ValueError("a storage entry is not DCP's")
    if type(key.fqn) is not str:
        raise ValueError("a storage entry names no tensor")
    at = _size(key.offset, f"{key.fqn} storage offset")
    name = info.relative_path
    if type(name) is not str or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"a storage entry names {str(name)[:80]!r}, not a plain file name")
    if name not in sizes:
        raise ValueError(f"points at {SHARDS}/{name}, which the manifest does not list")
    offset = _count(info.offset, f"{name} offset")
    length = _count(info.length, f"{name} length")
    if offset + length > sizes[name]:
        raise ValueError(f"{key.fqn} lies beyond the end of {SHARDS}/{name}")
    if info.transform_descriptors:
        raise ValueError(f"{key.fqn} asks for transforms ({info.transform_descriptors!r:.60})")
    return key.fqn, at, name, offset, length


def checked_index(index: Any, file: Path, sizes: dict[str, int]) -> Any:
    """A fresh DCP index built from the checked fields of ``index`` (``check_tensor``,
    ``check_storage``): every chunk stored once, in a byte range at least as long as the
    chunk's data, and no more tensor bytes than the shard files hold (no size bombs)."""
    filesystem, metadata = _dcp_classes()
    try:
        if type(index) is not metadata.Metadata:
            raise ValueError("not an index of a sharded checkpoint")
        if type(index.state_dict_metadata) is not dict or type(index.storage_data) is not dict:
            raise ValueError("not an index of a sharded checkpoint")
        tensors = {}
        for fqn, meta in index.state_dict_metadata.items():
            if type(fqn) is not str:
                raise ValueError("a tensor name is not text")
            tensors[fqn] = check_tensor(fqn, meta)
        stored = {}
        for key, info in index.storage_data.items():
            fqn, at, name, offset, length = check_storage(key, info, sizes)
            if fqn not in tensors or (fqn, at) in stored:
                raise ValueError(f"a storage entry for {fqn} matches no chunk or repeats one")
            stored[(fqn, at)] = (name, offset, length)
        total = 0
        for fqn, (dtype, _, chunks) in tensors.items():
            for at, extent in chunks:
                if (fqn, at) not in stored:
                    raise ValueError(f"a chunk of {fqn} is stored nowhere")
                need, length = _volume(extent) * dtype.itemsize, stored[(fqn, at)][2]
                if need > length:
                    raise ValueError(f"{fqn}: {need:,} bytes of data in a {length:,}-byte record")
                total += need
        if total > sum(sizes.values()):
            raise ValueError(f"its tensors need {total:,} bytes; the shards hold fewer")
    except ValueError as error:
        raise CheckpointError(f"{file}: {error}") from None
    return metadata.Metadata(
        state_dict_metadata={
            fqn: metadata.TensorStorageMetadata(
                properties=metadata.TensorProperties(dtype=dtype),
                size=torch.Size(size),
                chunks=[
                    metadata.ChunkStorageMetadata(offsets=torch.Size(a), sizes=torch.Size(e))
                    for a, e in chunks
                ],
            )
            for fqn, (dtype, size, chunks) in tensors.items()
        },
        storage_data={
            metadata.MetadataIndex(fqn, torch.Size(at)): filesystem._StorageInfo(name, o, n)
            for (fqn, at), (name, o, n) in stored.items()
        },
        storage_meta=metadata.StorageMeta(),
    )
