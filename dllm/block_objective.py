"""Moved to ``dllm.block.objective``; this path keeps working, with a DeprecationWarning,
for one release."""

import warnings

from dllm.block.objective import *  # noqa: F403

warnings.warn(
    "dllm.block_objective moved to dllm.block.objective; import from there",
    DeprecationWarning,
    stacklevel=2,
)
