"""Moved to ``eval.synthetic.pathstar_probe`` (this path re-exports it for one release)."""

from eval.moved import warn_moved
from eval.synthetic.pathstar_probe import *  # noqa: F403

warn_moved("eval.pathstar_probe", "eval.synthetic.pathstar_probe")
