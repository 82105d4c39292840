"""An output folder is written whole or not at all: when a writer (an export, an import) stops
half-way, by a full disk, a read-only one or Ctrl-C, what it added to the folder is removed, with
the folders it created, and what was there before stays."""

from __future__ import annotations

import contextlib
from pathlib import Path

from shared import door
from shared.errors import StoppedBySignal, with_path
from shared.faults import StageInterrupted, StopRequest
from shared.training.run_folder import contents, missing_folders


@contextlib.contextmanager
def removed_if_unfinished(out: Path):
    """Run the block that writes the output folder ``out``; when it raises (a full disk, a
    read-only one, Ctrl-C) or a signal stops it (SIGTERM, SIGUSR1: ``StoppedBySignal``, exit
    75), remove what it added there (entries that were not there before it) and the folders it
    created, so that no half-written output is left for a reader (or a rerun's refusal) to
    find. What was there before stays, and so does a lock file."""
    created = missing_folders(out)
    found = set(contents(out))
    # A signal leaves the block at the next Python bytecode; a second one ends the process.
    stop = StopRequest()
    try:
        with stop.interrupting(f"writing {out}"):
            stop.on_stop = f"removing what was written of {out}"
            yield
    except BaseException as error:
        remove_added(out, found, created)
        if isinstance(error, StageInterrupted):
            raise stopped(str(error), out) from None
        # a library's write (save_pretrained) may fail naming no file: name the folder
        named = with_path(error, out)
        if named is error:
            raise
        raise named from error
    finally:
        stop.close()


def stopped(signal_name: str, out: Path) -> BaseException:
    """What a signal that stopped the writing of ``out`` becomes once it is removed: Ctrl-C
    stays a KeyboardInterrupt (exit 130, as every command); a scheduler's stop is a
    ``StoppedBySignal`` (exit 75, so the same command runs again whole)."""
    if signal_name == "SIGINT":
        return KeyboardInterrupt()
    return StoppedBySignal(
        f"stopped by {signal_name} while writing {out}: nothing of it was left; run the same "
        "command again"
    )


def remove_added(out: Path, found: set[str], created: list[Path]) -> None:
    """Remove the entries of ``out`` not named in ``found`` (never its lock file), then the
    folders in ``created`` (deepest first) that are left empty."""
    for name in set(contents(out)) - found:
        entry = out / name
        if entry.is_dir() and not entry.is_symlink():
            door.remove_tree(entry)
        else:
            with contextlib.suppress(OSError):
                door.remove_file(entry)
    for folder in created:
        try:
            door.remove_empty_folder(folder)
        except OSError:  # something else is in it (a lock file held by this command)
            break
