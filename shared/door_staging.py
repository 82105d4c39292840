"""The door's private staging folders, for libraries that open files by name.

transformers' ``save_pretrained`` writes a folder by name, and ``datasets`` opens the files it
is given by name (and probes beside them): handed a user's folder, either would read or write
there without the door. They are handed instead a private folder under the system's temporary
folder that this command made (``library_folder``, ``staged_files``), holding only what the door
put there: the files it opened, hard-linked in through their descriptors or copied
(``staged_files``); what a library wrote there is brought into the user's folder through the
door (``copy_folder_into``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from shared.door import (
    make_folders,
    make_temp_folder,
    open_fd,
    open_read,
    remove_tree,
    write_atomic,
    write_new_file,
)
from shared.door_walk import door_operation
from shared.errors import ConfigError

# The staging folders alive in this process: what a library does inside one is the library's,
# even where the folder lies in a user's folder (beside a cache, so large files link rather than
# copy); the audit of file events (tests/file_audit) reads this set.
LIVE_STAGING: set[str] = set()


@contextlib.contextmanager
def library_folder(prefix: str = "duolm-", parent: Path | None = None) -> Iterator[Path]:
    """A new private folder (mode 0700) under the system's temporary folder (or ``parent``),
    removed when the block ends: where a library that writes by name (``save_pretrained``) or
    reads a whole folder is sent, so that it never touches a user's folder;
    ``copy_folder_into`` brings its files across."""
    folder = make_temp_folder(Path(parent or tempfile.gettempdir()), prefix)
    LIVE_STAGING.add(os.path.abspath(folder))
    try:
        yield folder
    finally:
        LIVE_STAGING.discard(os.path.abspath(folder))
        remove_tree(folder)


@contextlib.contextmanager
def staged_files(
    files: dict[str, Path],
    root: Path | None = None,
    *,
    parent: Path | None = None,
    what: str = "duolm",
    error=ConfigError,
) -> Iterator[Path]:
    """A ``library_folder`` holding only ``files`` (staged name
    -> the file to stage), for a library that is handed a folder and reads whatever it finds
    there (transformers reads a ``tokenizer_config.json`` beside a GGUF file and offers to run
    the code its ``auto_map`` names; ``datasets`` reads its own files by name). Each file is
    opened through the door and hard-linked in through its descriptor, or copied where a link
    cannot be made (another file system); the folder is removed when the block ends, however.
    ``parent``: where the folder is made (the system's temporary folder unless given: a folder
    of duolm's own, on the files' file system, lets large files be linked, not copied)."""
    with library_folder("duolm-staging-", parent) as staging:
        for name, source in files.items():
            if not name or name in (".", "..") or "/" in name:
                raise ValueError(f"staged name {name!r} must be a plain file name")
            _stage_file(Path(source), staging / name, root, what, error)
        yield staging


def staged_folder_files(folder: Path, names, root: Path | None = None, **staging):
    """``staged_files`` of the files ``names`` of ``folder`` that are there (the others are
    left out, as a library meets a folder that lacks them)."""
    there = {name: Path(folder) / name for name in names if os.path.lexists(Path(folder) / name)}
    return staged_files(there, root if root is not None else Path(folder), **staging)


@door_operation
def _stage_file(source: Path, target: Path, root: Path | None, what: str, error) -> None:
    fd = open_fd(source, root, what=what, error=error)
    try:
        if not _linked(fd, source, target):
            with os.fdopen(os.dup(fd), "rb") as reading:
                write_new_file(target, lambda handle: shutil.copyfileobj(reading, handle))
    finally:
        os.close(fd)


def _linked(fd: int, source: Path, target: Path) -> bool:
    """Whether ``target`` was made a hard link to the file ``fd`` the door opened: through the
    descriptor where the kernel allows it, else by name and then kept only if it is that same
    file (a name swapped for another file meanwhile is unlinked again, and copied instead)."""
    with contextlib.suppress(OSError):  # not allowed here: the name, checked, below
        os.link(f"/proc/self/fd/{fd}", target, follow_symlinks=True)
        return True
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:  # another file system, or links not allowed: a copy
        return False
    opened, linked = os.fstat(fd), os.lstat(target)
    if (opened.st_dev, opened.st_ino) == (linked.st_dev, linked.st_ino):
        return True
    os.unlink(target)
    return False


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
