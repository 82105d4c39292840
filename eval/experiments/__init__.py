"""Experiments built on the metrics of ``eval/``: the main comparison (``compare``), the block-size
sweep, the synthetic-language comparison and the side-by-side sampler. They share one
stage/cache/training module (``stages``). Entry points only: no library module imports these."""
