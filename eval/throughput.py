"""Moved to ``eval.speed.throughput`` (this path re-exports it for one release)."""

from eval.moved import warn_moved
from eval.speed.throughput import *  # noqa: F403

warn_moved("eval.throughput", "eval.speed.throughput")
