"""Moved to ``dllm.uniform.curriculum``; this path keeps working, with a DeprecationWarning,
for one release."""

import warnings

from dllm.uniform.curriculum import *  # noqa: F403

warnings.warn(
    "dllm.uniform_curriculum moved to dllm.uniform.curriculum; import from there",
    DeprecationWarning,
    stacklevel=2,
)
