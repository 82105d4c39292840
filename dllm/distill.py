"""Moved to ``dllm.uniform.distill``; this path (and ``python -m dllm.distill``) keeps working,
with a DeprecationWarning, for one release."""

import sys
import warnings

from dllm.uniform.distill import *  # noqa: F403
from dllm.uniform.distill import main

warnings.warn(
    "dllm.distill moved to dllm.uniform.distill; import from there "
    "(the command: python -m dllm.uniform.distill)",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    sys.exit(main())
