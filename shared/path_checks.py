"""How ``shared.door`` judges a path: what a file is by its mode, a symbolic link refused (a
received folder holds its own files), a path kept inside its root once every link is resolved,
and the one line that refuses an output path that is not a regular file. These look at paths
(``lstat``, ``readlink``, ``scandir``); they never open, read or write a file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from shared.errors import ConfigError

# What a path that is not a regular file is, by its lstat mode (a final link is not followed).
_SPECIAL_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def link_target(path: Path) -> str:
    return os.readlink(path) if os.path.islink(path) else "?"


def kind_of_mode(mode: int, path: Path | None = None) -> str:
    """What a file of this ``lstat`` mode is, in words."""
    if stat.S_ISREG(mode):
        return "a file"
    for test, kind in _SPECIAL_KINDS:
        if test(mode):
            if kind == "a symbolic link" and path is not None:
                return f"{kind} to {link_target(path)}"
            return kind
    return "not a regular file"


def not_a_regular_file(path: Path) -> str | None:
    """What ``path`` is when something other than a regular file is there (a device, a FIFO, a
    socket, a folder, a symbolic link), in words; None for a regular file or a new path."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return None if stat.S_ISREG(mode) else kind_of_mode(mode, Path(path))


def refuse_link(path: Path, what: str, error: type[Exception] = ConfigError) -> None:
    """Refuse ``path`` when it is a symbolic link (``what``: what holds it, in words)."""
    if os.path.islink(path):
        raise error(
            f"{path} is a symbolic link (to {link_target(path)}); {what} holds its own files, "
            "never links: copy the files in place of the link"
        )


def not_an_output_file(shown: Path | str, kind: str) -> ConfigError:
    """The refusal of an output path that is ``kind`` (a device, a FIFO, a link...): an atomic
    write renames a new file over it, which would replace that thing."""
    return ConfigError(
        f"{shown} is {kind}, not a regular file; outputs are written only to regular files or "
        "new paths: name a new file"
    )


def path_inside(path: Path, root: Path) -> bool:
    """Whether ``path``, with every link in it followed, lies in ``root`` (links followed too)."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def check_inside(path: Path, root: Path, what: str, error=ConfigError) -> Path:
    """``path`` when it lies in ``root`` once its links are followed; a name that climbs out
    (``../x``), an absolute path elsewhere or a link that leaves ``root`` is refused with one
    line naming it, before anything opens it."""
    if not path_inside(path, root):
        through = f" (a symbolic link to {link_target(path)})" if os.path.islink(path) else ""
        raise error(
            f"{path}{through} lies outside {root}; {what} reads only files inside its own folder"
        )
    return Path(path)


def refuse_links_within(folder: Path, what: str, error=ConfigError) -> None:
    """Refuse ``folder`` when it is a symbolic link or anything under it is one (links are not
    followed), or is not a regular file or folder (a FIFO would block a reader forever)."""
    refuse_link(folder, what, error)
    pending = [Path(folder)]
    while pending:
        current = pending.pop()
        try:
            entries = list(os.scandir(current))
        except (NotADirectoryError, FileNotFoundError):
            return  # the reader that expects a folder says so
        for entry in entries:
            path = Path(entry.path)
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                refuse_link(path, what, error)
            elif stat.S_ISDIR(mode):
                pending.append(path)
            elif not stat.S_ISREG(mode):
                raise error(
                    f"{path} is {kind_of_mode(mode)}, not a regular file; {what} holds regular "
                    "files and folders only"
                )
