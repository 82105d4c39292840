"""The synthetic-language evaluation: models measured against a language whose distribution is
known exactly. ``report`` runs it all for an AR and an MDM checkpoint; ``likelihood`` (the gap to
the true entropy), ``samples`` (exact log-probability and validity of samples), ``probes``
(infilling, constrained completion, reversal) and ``pathstar_probe`` (planning on path-star
graphs) are its parts.
"""
