"""Moved: the masked diffusion objective to ``dllm.masked.objective``, what the diffusion
objectives share (``stratified_times``, ``MaskRow``, ...) to ``dllm.noise``; this path keeps
working, with a DeprecationWarning, for one release."""

import warnings

from dllm.masked.objective import *  # noqa: F403
from dllm.noise import *  # noqa: F403

warnings.warn(
    "dllm.objective moved to dllm.masked.objective (MaskedDiffusionObjective) and dllm.noise "
    "(stratified_times, check_time_range, diffusion_options, MaskRow); import from there",
    DeprecationWarning,
    stacklevel=2,
)
