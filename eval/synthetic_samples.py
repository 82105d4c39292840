"""Moved to ``eval.synthetic.samples`` (this path re-exports it for one release)."""

from eval.moved import warn_moved
from eval.synthetic.samples import *  # noqa: F403

warn_moved("eval.synthetic_samples", "eval.synthetic.samples")
