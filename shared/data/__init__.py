"""Where data comes from: corpora (``corpus``), the token rows both objectives train on
(``rows``), the hub reachability check (``hub``), and synthetic languages with exact
probabilities (``synthetic``)."""
