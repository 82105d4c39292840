"""Moved: the sampling loop and its settings to ``dllm.sampler``, the masked sampler
(``sample``) to ``dllm.masked.sampler``; this path keeps working, with a DeprecationWarning,
for one release."""

import warnings

from dllm.masked.sampler import *  # noqa: F403
from dllm.sampler import *  # noqa: F403

warnings.warn(
    "dllm.generate moved to dllm.sampler (SamplerConfig, SampleResult, row_generators, run) "
    "and dllm.masked.sampler (sample); import from there",
    DeprecationWarning,
    stacklevel=2,
)
