"""Writing tensors to a safetensors file, with the errors of a full disk named by the file's
path (a module of its own: it imports torch, which the rest of ``shared.files`` does not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import safetensors.torch
from safetensors import SafetensorError

from shared.errors import with_path


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
