"""Moved to ``eval.speed.throughput_runs`` (this path re-exports it for one release)."""

import sys

from eval.moved import warn_moved
from eval.speed.throughput_runs import *  # noqa: F403

warn_moved("eval.throughput_runs", "eval.speed.throughput_runs")

if __name__ == "__main__":
    sys.exit(main())  # noqa: F405
