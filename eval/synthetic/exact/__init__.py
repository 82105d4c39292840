"""Exact measurements of samplers on an enumerable hidden Markov language: the exact
denoisers (``denoisers``, on the token-level chain of ``chain``) and the exact output
distribution of each family's sampler with its divergences to the language (``frontier``)."""
