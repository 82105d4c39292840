"""Reproductions of published AR-vs-diffusion findings, each with a verdict computed by a rule
stated in its report (``python -m eval.findings``; see ``__main__``)."""
