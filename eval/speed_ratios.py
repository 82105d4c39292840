"""Moved to ``eval.speed.ratios`` (this path re-exports it for one release)."""

from eval.moved import warn_moved
from eval.speed.ratios import *  # noqa: F403

warn_moved("eval.speed_ratios", "eval.speed.ratios")
