"""The uniform-state diffusion family, objective "udm": its objective (``objective``), its
sampler (``sampler``), the Gaussian-relaxation curriculum (``curriculum``), consistency
distillation (``distill``, ``python -m dllm.uniform.distill``) and its registration
(``family``)."""

from dllm.uniform import family  # noqa: F401  (registers the "udm" objective and family)
