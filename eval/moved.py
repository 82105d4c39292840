"""Old module paths kept for one release after a move. The module at the old path re-exports the
new one's public names and calls ``warn_moved`` once, when it is first imported."""

import warnings


def warn_moved(old: str, new: str) -> None:
    """A DeprecationWarning that module ``old`` is now ``new``. stacklevel 3 attributes it to the
    code that imported the old path (the warnings machinery skips the import system's frames), so
    Python's default filter shows it to a script run directly and pytest shows it to a test."""
    warnings.warn(
        f"{old} moved to {new}; import it from there (the old path goes in the next release)",
        DeprecationWarning,
        stacklevel=3,
    )
