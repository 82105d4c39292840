"""Writing tensors to a safetensors file, with the errors of a full disk named by the file's
path (a module of its own: it imports torch, which the rest of ``shared.files`` does not), and
reading a safetensors file's header alone: what tensors it declares, checked against its size,
before a model of that shape is allocated."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
from safetensors import SafetensorError

from shared import door
from shared.errors import ConfigError, with_path
from shared.strict_json import parse_json


def save_tensors(tensors: dict[str, Any], path: Path) -> None:
    """safetensors' ``save_file`` (with the ``{"format": "pt"}`` metadata torch readers expect);
    an OS error it meets (a full disk) is raised as an ``OSError`` naming ``path`` rather than
    as a ``SafetensorError`` naming its temporary file."""
    try:
        safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as error:
        named = with_path(error, path)
        if named is error:
            raise
        raise named from error


# ------------------------------------------------------------------------------ reading a header

HEADER_LIMIT = 100 << 20  # safetensors refuses a larger header itself
ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1}
ITEM_BYTES |= {"U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT_TYPES = ("F64", "F32", "F16", "BF16")  # what a model's weights may be stored as


@dataclass(frozen=True)
class StoredTensor:
    """One tensor as a safetensors header declares it."""

    dtype: str
    shape: tuple[int, ...]


def read_tensor_header(path: Path, root: Path | None = None, *, error=ConfigError) -> dict:
    """{name: StoredTensor} of the safetensors file ``path``, read through the door without
    reading any tensor: an 8-byte little-endian length, then that many bytes of JSON. Every
    entry must be a known dtype and a shape whose bytes are exactly its ``data_offsets``, all
    inside the file, so that a few-KB file cannot declare gigabytes of weights."""
    with door.open_read(path, root, error=error) as handle:
        size = os.fstat(handle.fileno()).st_size
        prefix = handle.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else None
        if length is None or length > min(HEADER_LIMIT, size - 8):
            raise error(f"{path}: not a safetensors file (its header length does not fit it)")
        text = handle.read(length)
    try:
        header = parse_json(text.decode("utf-8"), str(path), error)
    except UnicodeDecodeError:
        raise error(f"{path}: not a safetensors file (its header is not UTF-8)") from None
    if not isinstance(header, dict):
        raise error(f"{path}: not a safetensors file (its header is not a JSON object)")
    data_bytes = size - 8 - length
    return {
        name: _stored_tensor(path, name, entry, data_bytes, error)
        for name, entry in header.items()
        if name != "__metadata__"
    }


def _stored_tensor(path: Path, name: str, entry: Any, data_bytes: int, error) -> StoredTensor:
    """One header entry, checked: its dtype, its shape, and its bytes inside the file."""
    dtype = entry.get("dtype") if isinstance(entry, dict) else None
    shape = entry.get("shape") if isinstance(entry, dict) else None
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    plain = (
        dtype in ITEM_BYTES
        and isinstance(shape, list)
        and all(type(n) is int and n >= 0 for n in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(n) is int for n in offsets)
    )
    if not plain:
        raise error(f"{path}: tensor {name} is not a safetensors entry (dtype, shape, offsets)")
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes or end - begin != math.prod(shape) * ITEM_BYTES[dtype]:
        raise error(
            f"{path}: tensor {name} declares {shape} {dtype} at bytes {begin}..{end}, which "
            f"the file's {data_bytes:,} data bytes do not hold (truncated or crafted)"
        )
    return StoredTensor(dtype, tuple(shape))
