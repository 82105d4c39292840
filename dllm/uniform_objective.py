"""Moved to ``dllm.uniform.objective``; this path keeps working, with a DeprecationWarning,
for one release."""

import warnings

from dllm.uniform.objective import *  # noqa: F403

warnings.warn(
    "dllm.uniform_objective moved to dllm.uniform.objective; import from there",
    DeprecationWarning,
    stacklevel=2,
)
