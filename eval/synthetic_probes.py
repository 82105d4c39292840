"""Moved to ``eval.synthetic.probes`` (this path re-exports it for one release)."""

from eval.moved import warn_moved
from eval.synthetic.probes import *  # noqa: F403

warn_moved("eval.synthetic_probes", "eval.synthetic.probes")
