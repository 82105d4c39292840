"""Where data comes from: corpora, rows, synthetic languages."""
