"""Moved to ``eval.speed.frontier`` (this path re-exports it for one release)."""

from eval.moved import warn_moved
from eval.speed.frontier import *  # noqa: F403

warn_moved("eval.frontier", "eval.speed.frontier")
