"""The door's private staging folders, for libraries that open files by name.

transformers' ``save_pretrained`` writes a folder by name, and ``datasets`` opens the files it
is given by name (and probes beside them): handed a user's folder, either would read or write
there without the door. They are handed instead a private folder under the system's temporary
folder that this command made (``library_folder``), holding only what the door put there: the
descriptors it opened, linked by ``/proc/self/fd/N`` (``staged_for_library``); what a library
wrote there is brought into the user's folder through the door (``copy_folder_into``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from shared.door import (
    copy_file,
    make_folders,
    make_temp_folder,
    open_fd,
    open_read,
    remove_tree,
    write_atomic,
)
from shared.door_walk import door_operation


def _has_proc() -> bool:
    return os.path.isdir("/proc/self/fd")


@contextlib.contextmanager
def library_folder(prefix: str = "duolm-") -> Iterator[Path]:
    """A new private folder under the system's temporary folder, removed when the block ends:
    where a library that writes by name (``save_pretrained``) or reads a whole folder is sent,
    so that it never touches a user's folder; ``copy_folder_into`` brings its files across."""
    folder = make_temp_folder(Path(tempfile.gettempdir()), prefix)
    try:
        yield folder
    finally:
        remove_tree(folder)


@contextlib.contextmanager
def staged_for_library(files: list[Path], root: Path | None = None) -> Iterator[list[Path]]:
    """Names for a library that opens files by name (``datasets``): each file opened through
    the door and named in a private ``library_folder`` by a link to its open descriptor
    (``/proc/self/fd/N``; a copy where there is no /proc), so the library reads exactly the
    checked files and nothing beside them. The descriptors close when the block ends."""
    opened: list[int] = []
    with library_folder("duolm-data-") as staging:
        try:
            names = []
            for number, file in enumerate(files):
                name = staging / f"{number:06d}-{Path(file).name}"
                if _has_proc():
                    opened.append(open_fd(file, root))
                    _link_in_staging(f"/proc/self/fd/{opened[-1]}", name)
                else:
                    copy_file(file, name, root)
                names.append(name)
            yield names
        finally:
            for fd in opened:
                os.close(fd)


@door_operation
def _link_in_staging(target: str, name: Path) -> None:
    os.symlink(target, name)


def copy_folder_into(source: Path, target: Path, root: Path | None = None) -> None:
    """Every regular file below the folder ``source`` (one this command made) written into
    ``target`` at the same place, each atomically through the door (folders made as needed)."""
    for entry in sorted(Path(source).rglob("*")):
        if entry.is_symlink() or not entry.is_file():
            continue
        destination = Path(target) / entry.relative_to(source)
        make_folders(destination.parent, root)
        with open_read(entry) as reading:
            write_atomic(
                destination, lambda handle, r=reading: shutil.copyfileobj(r, handle), root=root
            )
