"""Moved to ``eval.synthetic.likelihood`` (this path re-exports it for one release)."""

from eval.moved import warn_moved
from eval.synthetic.likelihood import *  # noqa: F403

warn_moved("eval.synthetic_likelihood", "eval.synthetic.likelihood")
