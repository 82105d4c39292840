"""The Eso-LM family (a masked-diffusion phase, then an autoregressive one), objective "eso":
its objective (``objective``), its sampler with a KV cache in both phases (``sampler``) and its
registration (``family``)."""

from dllm.eso import family  # noqa: F401  (registers the "eso" objective and family)
