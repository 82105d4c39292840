"""The block diffusion family, objective "bd": its objective (``objective``), its sampler
(``sampler``) and its registration (``family``)."""

from dllm.block import family  # noqa: F401  (registers the "bd" objective and family)
