"""Speed: one generation-throughput measurement (``throughput``: warm-up, alternating rounds,
median, host probes), the files it writes and two runs compared (``throughput_files``,
``throughput_runs``), each setting's speed as a ratio to the AR in the same rounds (``ratios``),
and the speed-quality frontier with its headline (``frontier``, ``frontier_headline``)."""
