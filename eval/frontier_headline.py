"""Moved to ``eval.speed.frontier_headline`` (this path re-exports it for one release)."""

from eval.moved import warn_moved
from eval.speed.frontier_headline import *  # noqa: F403

warn_moved("eval.frontier_headline", "eval.speed.frontier_headline")
