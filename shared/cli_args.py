"""Checks every command line applies to what the user typed, so a bad value is one clear line
(naming the flag) instead of a traceback from deep inside."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import torch

from shared import door
from shared.door import check_output_file
from shared.errors import ConfigError


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to a flag's help only where the help does not already say what
    the default is, and not for flags without one (None) or switches (False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` as every command line here uses it: an unknown flag is named
    even when its value would otherwise be taken for a missing positional argument
    (``--bogus 3``), under a launcher only the first process prints a usage error, and a flag
    is never taken for the longer one it begins (``--seed`` is not ``--seeds``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else list(args)
        for token in argv:
            if token == "--":
                break
            if token.startswith("-") and not re.match(r"^-\d", token):
                name = token.split("=", 1)[0]
                if name not in self._option_string_actions:
                    self.error(f"unrecognized flag {name} (see {self.prog} --help)")
        return super().parse_args(argv, namespace)

    def error(self, message: str):
        if os.environ.get("RANK", "0") == "0":
            self.print_usage(sys.stderr)
            sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def utf8_argument(value: str, flag: str) -> str:
    """``value`` as typed; command-line bytes that are not UTF-8 reach Python as lone
    surrogates, which fail later in a tokenizer with a message that names nothing."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{flag} must be UTF-8 text; the value given is not") from None
    return value


def read_text_file(path: str | Path, flag: str) -> str:
    """The UTF-8 text of the file ``flag`` names."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a text file")
    if not path.exists():
        raise FileNotFoundError(f"{flag} {path} does not exist")
    try:
        return door.read_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{flag} {path} is not UTF-8 text") from None


def writable_file(path: str | Path, flag: str) -> Path:
    """Check, before any work, that the output file ``flag`` names can be written: a regular
    file or a new path (never a device, FIFO, socket, folder or symbolic link) in a folder
    that exists and takes files."""
    path = check_output_file(Path(path), flag)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {folder} does not exist")
    # Try it: permission bits say little to root, and nothing about read-only mounts.
    try:
        if path.exists():
            door.open_lock_file(path, create=False).close()  # opened for writing, not changed
        else:
            fd, probe = door.make_temp_file(folder, f".{path.name}.", ".probe")
            os.close(fd)
            door.remove_file(probe)
    except OSError as error:
        raise ConfigError(f"{flag} {path} cannot be written: {error.strerror or error}") from None
    return path


def device_argument(name: str, flag: str = "--device") -> torch.device:
    """A torch device this build and machine can run on."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{flag} {name!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        why = "has no CUDA support" if torch.version.cuda is None else "sees no GPU"
        raise ConfigError(f"{flag} {name}: this torch build {why}; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"{flag} {name!r}: only cpu and cuda devices are supported")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(
            f"{flag} {name}: this machine has {torch.cuda.device_count()} GPU(s), numbered from 0"
        )
    return device


SEED_END = 2**63  # torch's generators take a signed 64-bit seed


def seed_argument(text: str) -> int:
    """argparse type of a generator seed (``--seed``): a whole number from 0 to 2**63 - 1.
    argparse names the flag in its error, which is one line instead of an overflow deep in
    torch (or a seed some commands take and others refuse)."""
    shown = text if len(text) <= 30 else f"{text[:27]}... ({len(text)} characters)"
    digits = text.strip().removeprefix("-").removeprefix("+")
    if not digits.isdecimal():
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not a whole number (a seed is from 0 to 2**63 - 1)"
        )
    # compare lengths first: int() refuses texts of over 4300 digits
    value = int(text) if len(digits) <= 19 else SEED_END
    if not 0 <= value < SEED_END:
        raise argparse.ArgumentTypeError(f"{shown} is outside 0 to 2**63 - 1 (a seed's range)")
    return value


def positive_argument(value: int, flag: str) -> int:
    if value < 1:
        raise ConfigError(f"{flag}={value} must be >= 1")
    return value


# The sampling commands allocate for these counts before the first forward pass: a schedule
# table of one float per step, and one batch that holds every sample. A count past them was a
# MemoryError or an allocator's traceback, never a sample.
# (Steps past the generated positions only repeat: a masked sampler stops once nothing is
# masked, and ReMDM's loop corrects a few hundred times at most.)
MAX_SAMPLING_STEPS = 1 << 20
STEPS_WHY = "steps past the generated positions only repeat; each is one entry of a schedule"
MAX_SAMPLES = 1 << 12
SAMPLES_WHY = "all samples are drawn in one batch; for more, run again with another --seed"


def at_most(value: int, flag: str, most: int, why: str) -> int:
    """``value`` of a count flag, refused above ``most``; ``why`` says what the bound protects."""
    if value > most:
        raise ConfigError(f"{flag}={value} is more than {most:,}, the most it takes ({why})")
    return value


# torch takes a thread count as a C int; more threads than cores only slow a command down.
MAX_THREADS = 1 << 12


def set_threads(threads: int) -> None:
    """``--threads``: torch CPU threads (0 leaves torch's default)."""
    if threads < 0:
        raise ConfigError(f"--threads={threads} must be >= 0 (0 = torch's default)")
    at_most(threads, "--threads", MAX_THREADS, f"this machine has {os.cpu_count()} cores")
    if threads:
        torch.set_num_threads(threads)


DEFAULT_GENERATED_TOKENS = 64


def fitting_length(requested: int | None, context: int, fixed_tokens: int, flag: str) -> int:
    """``requested`` generated tokens, or by default 64 or fewer so that BOS + the longest prompt
    (and suffix: ``fixed_tokens``) + the generated tokens fit the model's context."""
    if requested is not None:
        return requested
    room = context - 1 - fixed_tokens
    if room < 1:
        raise ConfigError(
            f"the prompt ({fixed_tokens} tokens + BOS) fills the model's context of "
            f"max_seq_len={context}: nothing is left to generate; shorten the prompt"
        )
    return min(DEFAULT_GENERATED_TOKENS, room)


def export_parser(description: str) -> CommandParser:
    """The flags every export command takes: a checkpoint, a new folder, ``--overwrite``."""
    parser = CommandParser(description=description)
    parser.add_argument("checkpoint", help="checkpoint directory or run directory")
    parser.add_argument("out", help="folder to write (new or empty)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="export into a folder that holds files, moving them aside first (not deleted)",
    )
    return parser
