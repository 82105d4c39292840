"""Reading what a user may have received from someone else (a run folder, a checkpoint, a model
folder to import, a findings index): its JSON files, and the folders that must hold their own
files only.

Whoever crafts such a folder chooses every byte in it, so a reader here

- turns JSON that does not parse (bad syntax, bytes that are not UTF-8, integers of thousands of
  digits, nesting deep enough to exhaust Python's recursion limit) into one line naming the
  file, never a traceback;
- refuses a symbolic link before opening anything through it: a link in a checkpoint, or a
  shard named ``../other/x.safetensors``, would otherwise make a command read (and, for a
  resume, restore state from) a file of this machine that the folder's owner picked.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from shared.errors import ConfigError


def parse_json(text: str, where: str, error: type[Exception] = ConfigError) -> Any:
    """The JSON value of ``text`` (from ``where``: a file, a line of one); what is not JSON is
    ``error``, one line naming ``where``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to read (damaged or crafted)") from None
    except ValueError as reason:  # JSONDecodeError, UnicodeDecodeError, an over-long integer
        first_line = str(reason).splitlines()[0] if str(reason) else type(reason).__name__
        raise error(f"{where}: not JSON ({first_line})") from None


def read_json_file(path: Path, error: type[Exception] = ConfigError) -> Any:
    """The JSON value in ``path``; a file that is not JSON (or not UTF-8) is ``error``, one
    line naming it. A missing file raises FileNotFoundError as ``open`` does."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as reason:
        raise error(f"{path}: not JSON (not UTF-8 text: {reason})") from None
    return parse_json(text, str(path), error)


def read_json_object(path: Path, error: type[Exception] = ConfigError) -> dict[str, Any]:
    """``read_json_file`` of a file that must hold a JSON object."""
    value = read_json_file(path, error)
    if not isinstance(value, dict):
        raise error(f"{path}: holds a JSON {type(value).__name__}, not an object")
    return value


def link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def refuse_link(path: Path, what: str) -> None:
    """Refuse ``path`` when it is a symbolic link (``what``: what holds it, in words)."""
    if os.path.islink(path):
        raise ConfigError(
            f"{path} is a symbolic link (to {link_target(path)}); {what} holds its own files, "
            "never links: copy the files in place of the link"
        )


def refuse_links_within(folder: Path, what: str) -> None:
    """Refuse ``folder`` when it is a symbolic link or anything under it is one (links are not
    followed), or is not a regular file or folder (a FIFO would block a reader forever)."""
    refuse_link(folder, what)
    pending = [Path(folder)]
    while pending:
        current = pending.pop()
        try:
            entries = list(os.scandir(current))
        except NotADirectoryError:
            return  # the folder is a file: the reader that expects a folder says so
        except FileNotFoundError:
            return
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink():
                refuse_link(path, what)
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                pending.append(path)
            elif not stat.S_ISREG(mode):
                raise ConfigError(
                    f"{path} is not a regular file (a device, FIFO or socket); {what} holds "
                    "regular files and folders only"
                )


def path_inside(path: Path, root: Path) -> bool:
    """Whether ``path``, with every link in it followed, lies in ``root`` (links followed too)."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def check_inside(path: Path, root: Path, what: str) -> Path:
    """``path`` when it lies in ``root`` once its links are followed; a name that climbs out
    (``../x``), an absolute path elsewhere or a link that leaves ``root`` is refused with one
    line naming it, before anything opens it."""
    if not path_inside(path, root):
        through = f" (a symbolic link to {link_target(path)})" if os.path.islink(path) else ""
        raise ConfigError(
            f"{path}{through} lies outside {root}; {what} reads only files inside its own folder"
        )
    return path
