"""Discrete diffusion language models: one folder per family over a shared core.

The core (this folder): the family registry (``families``), the generator (``generator``),
canvases, noise schedules and times, the sampling loop and its reveal rules and predictors,
the command line (``sample``) and export. The families: ``masked`` (absorbing state, "mdm"),
``block`` (block diffusion, "bd"), ``uniform`` (uniform state, "udm") and ``eso`` (Eso-LM, a
masked phase then an autoregressive one, "eso"). Importing the package
registers every family's objective and sampler.
"""

# Each import registers one family; the order is the order messages list them in.
# isort: off
from dllm import masked  # noqa: F401
from dllm import block  # noqa: F401
from dllm import uniform  # noqa: F401
from dllm import eso  # noqa: F401

# isort: on
