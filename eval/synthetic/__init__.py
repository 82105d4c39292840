"""The synthetic-language evaluation: models measured against a language whose distribution is
known exactly. ``report`` runs it all for an AR and an MDM checkpoint; ``likelihood`` (the gap to
the true entropy), ``samples`` (exact log-probability and validity of samples), ``probes``
(infilling, constrained completion, reversal) and ``pathstar_probe`` (planning on path-star
graphs) are its parts.

This package was the module ``eval.synthetic`` (now ``eval.synthetic.report``): its names still
read from here for one release, with a DeprecationWarning.
"""

import importlib
from typing import Any

from eval.moved import warn_moved

SUBMODULES = {"report", "likelihood", "samples", "probes", "pathstar_probe"}


def __getattr__(name: str) -> Any:
    # Called only for a name the package does not have: the old module's public names. The
    # import system asks for a submodule's name here before it imports the submodule, so those
    # (and private names) are answered "no such attribute" without a warning.
    if name.startswith("_") or name in SUBMODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    report = importlib.import_module("eval.synthetic.report")
    if not hasattr(report, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_moved(f"{__name__}.{name}", f"eval.synthetic.report.{name}")
    return getattr(report, name)
