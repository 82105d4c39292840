"""A runtime audit of file events: every open, folder made, rename, removal, mode change and
link of a process, checked against where it may happen and who may do it.

``sitecustomize.py`` beside this file installs it in every Python process started with
``DUOLM_AUDIT_DIR`` set (a command and every process it starts); ``tests/test_file_audit.py``
runs each command that way on a sandbox of three folders:

- ``SANDBOX/work``: the user's folders (runs, jobs, exports, shards, caches typed with
  ``--cache-dir``). Every event here must be performed by ``shared.door`` (inside
  ``shared.door_walk.performing``); any other is a violation, a read included.
- ``SANDBOX/home`` (``HOME``) and ``SANDBOX/tmp`` (``TMPDIR``): the caches and temporary files
  of the libraries (Hugging Face, matplotlib, torch, a staging folder). Allowed, except duolm's
  own cache (``HOME/.cache/duolm``), which is the door's like a user's folder.
- Everywhere else: reads of the installed packages, the interpreter, the project's own source
  and the running system (``/proc``, ``/sys``, ``/dev``, ``/etc``, ``/usr``) only; any write or
  other read is a violation.

Each violation is appended at once to ``DUOLM_AUDIT_DIR/<pid>.jsonl`` through a descriptor
opened before the hook (a write to an open descriptor is not itself an event), so a process
that ends with ``os._exit`` loses none.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import traceback

_FILE_EVENTS = {
    "open": ((0,), "open"),
    "os.mkdir": ((0,), "write"),
    "os.rename": ((0, 1), "write"),
    "os.replace": ((0, 1), "write"),
    "os.remove": ((0,), "write"),
    "os.rmdir": ((0,), "write"),
    "os.chmod": ((0,), "write"),
    "os.chown": ((0,), "write"),
    "os.link": ((0, 1), "link"),  # (existing file: read, new name: written)
    "os.symlink": ((1,), "write"),  # (target, link): only the link is made
    "os.truncate": ((0,), "write"),
    "os.utime": ((0,), "write"),
    "shutil.copyfile": ((0, 1), "write"),
    "shutil.copymode": ((0, 1), "write"),
    "shutil.copystat": ((0, 1), "write"),
    "shutil.copytree": ((0, 1), "write"),
    "shutil.rmtree": ((0,), "write"),
    "shutil.move": ((0, 1), "write"),
    "tempfile.mkstemp": ((0,), "write"),
    "tempfile.mkdtemp": ((0,), "write"),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _is_write(event: str, args: tuple) -> bool:
    if event != "open":
        return True
    mode, flags = (args[1], args[2]) if len(args) >= 3 else (args[1] if len(args) > 1 else "r", 0)
    if isinstance(mode, str) and any(letter in mode for letter in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _flags_say_folder(flags) -> bool:
    return isinstance(flags, int) and bool(flags & os.O_DIRECTORY)


def _as_path(value) -> str | None:
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        return None  # a descriptor (os.fdopen, a dir_fd's name): the door's or not a path
    return os.path.abspath(value)


class Audit:
    def __init__(self, sandbox: str, report_fd: int):
        self.sandbox = os.path.realpath(sandbox)
        self.work = os.path.join(self.sandbox, "work")
        self.duolm_cache = os.path.join(self.sandbox, "home", ".cache", "duolm")
        self.report_fd = report_fd
        self.readable = _readable_prefixes()
        self.door = None  # shared.door_walk, once the project is imported

    def __call__(self, event: str, args: tuple) -> None:
        spec = _FILE_EVENTS.get(event)
        if spec is None:
            return
        indices = spec[0]
        paths = [p for i in indices if i < len(args) and (p := _as_path(args[i])) is not None]
        if not paths:
            return
        write = _is_write(event, args)
        folder = event == "open" and len(args) >= 3 and _flags_say_folder(args[2])
        for number, path in enumerate(paths):
            if spec[1] == "link":
                write = number == 1
            why = self.judge(path, write, folder)
            if why:
                self.report(event, path, write, why)

    def judge(self, path: str, write: bool, folder: bool = False) -> str | None:
        """Why this event at ``path`` is a violation, or None."""
        # the folder resolved, the last name not: a link a library is handed (a staged name for
        # a descriptor the door opened) is judged where it lies, not where it points
        real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        if _under(real, self.work) or _under(real, self.duolm_cache):
            if self._door_performing() or self._in_staging(real):
                return None
            return "not performed by the door"
        if _under(real, self.sandbox):
            return None  # the libraries' caches and temporary files
        if write:
            return None if _under(real, "/dev") else "a write outside the sandbox"
        if folder:
            return None  # a folder opened to walk from (a root's parent, named by the user)
        if any(_under(real, prefix) for prefix in self.readable):
            return None
        return "a read outside the sandbox, the packages and the system"

    def _in_staging(self, path: str) -> bool:
        """Whether ``path`` lies in a staging folder the door made and holds only what it put
        there (``shared.door_staging.LIVE_STAGING``): what a library does there is its own."""
        staging = sys.modules.get("shared.door_staging")
        live = getattr(staging, "LIVE_STAGING", ())
        return any(_under(path, os.path.realpath(folder)) for folder in live)

    def _door_performing(self) -> bool:
        if self.door is None:
            self.door = sys.modules.get("shared.door_walk")
        return self.door is not None and self.door.door_is_performing()

    def report(self, event: str, path: str, write: bool, why: str) -> None:
        stack = [
            f"{frame.filename}:{frame.lineno} {frame.name}"
            for frame in traceback.extract_stack()[-8:-3]
        ]
        record = {"event": event, "path": path, "write": write, "why": why, "stack": stack}
        os.write(self.report_fd, (json.dumps(record) + "\n").encode())


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def _readable_prefixes() -> list[str]:
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    found |= {p for p in sysconfig.get_paths().values() if p}
    found |= {os.path.realpath(p) for p in found}
    project = os.environ.get("DUOLM_AUDIT_PROJECT")
    if project:
        found.add(os.path.realpath(project))
    return sorted(found | {"/proc", "/sys", "/dev", "/etc", "/usr", "/lib", "/lib64", "/bin"})


def install() -> None:
    """Install the audit in this process when ``DUOLM_AUDIT_DIR`` names a report folder."""
    folder = os.environ["DUOLM_AUDIT_DIR"]
    report = os.path.join(folder, f"{os.getpid()}.jsonl")
    fd = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    sys.addaudithook(Audit(os.environ["DUOLM_AUDIT_SANDBOX"], fd))
