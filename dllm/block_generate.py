"""Moved to ``dllm.block.sampler``; this path keeps working, with a DeprecationWarning,
for one release."""

import warnings

from dllm.block.sampler import *  # noqa: F403

warnings.warn(
    "dllm.block_generate moved to dllm.block.sampler; import from there",
    DeprecationWarning,
    stacklevel=2,
)
