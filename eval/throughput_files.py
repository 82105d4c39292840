"""Moved to ``eval.speed.throughput_files`` (this path re-exports it for one release)."""

from eval.moved import warn_moved
from eval.speed.throughput_files import *  # noqa: F403

warn_moved("eval.throughput_files", "eval.speed.throughput_files")
