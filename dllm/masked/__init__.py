"""The masked (absorbing-state) diffusion family, objective "mdm": its objective
(``objective``), its sampler (``sampler``) and its registration (``family``)."""

from dllm.masked import family  # noqa: F401  (registers the "mdm" objective and family)
