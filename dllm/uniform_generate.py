"""Moved to ``dllm.uniform.sampler``; this path keeps working, with a DeprecationWarning,
for one release."""

import warnings

from dllm.uniform.sampler import *  # noqa: F403

warnings.warn(
    "dllm.uniform_generate moved to dllm.uniform.sampler; import from there",
    DeprecationWarning,
    stacklevel=2,
)
