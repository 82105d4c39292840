"""Synthetic languages whose string probabilities are known exactly.

On such a language the gap between a model's NLL and the true entropy, and the quality of its
samples, can be measured exactly rather than judged. Five families, one module each, on the
``Language`` base of ``base``:

* ``hmm.HMMLanguage``: a random hidden Markov model with per-state stop probabilities and a hard
  length cap (the string always ends at ``max_len``), so the support is finite and probabilities
  sum to exactly 1. ``P(string)`` by the forward algorithm.
* ``pcfg.PCFGLanguage``: nested typed brackets (a branching process with a depth and a children
  cap). The grammar is unambiguous, so ``P(string)`` is the probability of its unique derivation,
  and the entropy follows exactly from a recursion over depths.
* ``facts.FactsLanguage``: ``pairs`` random one-to-one facts ``a_i b_i`` (two symbols, forward
  direction only), uniform: the ground truth of the reversal probe.
* ``pathstar.PathStarLanguage``: the path-star planning task (shuffled edges of a star graph,
  start, goal, then the path), uniform over its strings, with an exact solver and checker.
* ``teacher.TeacherLanguage``: fixed-length strings drawn from a small random causal
  ``Transformer`` with a fixed seed; ``P(string)`` by the chain rule.

Every symbol is one printable ASCII character, so the byte tokenizer gives one token per symbol
and a string is one document. Every string has at least one symbol (empty documents are dropped by
the data pipeline). ``specs`` turns a dataset spec (``synthetic:hmm?seed=1``) into a language and
its train/validation strings.
"""
