"""JSON as the project reads it: one line naming where, for anything no project file holds.

The door (``shared.door``) reads every file; this module only turns text into a value. Bad
syntax, non-UTF-8 bytes, nesting deep enough to exhaust the recursion limit, an integer of
thousands of digits and a float beyond float range each become one line naming the file.
"""

from __future__ import annotations

import json
import math
from typing import Any

from shared.errors import ConfigError

# No number the project writes needs more digits (steps, token counts, seeds below 2**64); a
# longer one is damage or a probe, and would overflow the float arithmetic that reads it.
MAX_INTEGER_DIGITS = 40


class _NumberOutOfRange(ValueError):
    pass


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _NumberOutOfRange(f"an integer of {len(digits.lstrip('-'))} digits")
    return int(digits)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400 reads as infinity; NaN and Infinity are spelled as words
        raise _NumberOutOfRange(f"the number {text[:20]} is beyond a float's range")
    return value


def parse_json(text: str | bytes, where: str, error: type[Exception] = ConfigError) -> Any:
    """The JSON value of ``text`` (from ``where``: a file, a line of one); what is not JSON is
    ``error``, one line naming ``where``, and so is a number no file of the project holds (an
    integer of more than ``MAX_INTEGER_DIGITS`` digits, a float beyond float range)."""
    try:
        return json.loads(text, parse_int=_bounded_int, parse_float=_finite_float)
    except _NumberOutOfRange as reason:
        raise error(f"{where}: {reason} (damaged or crafted)") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to read (damaged or crafted)") from None
    except ValueError as reason:  # JSONDecodeError, UnicodeDecodeError, an over-long integer
        first_line = str(reason).splitlines()[0] if str(reason) else type(reason).__name__
        raise error(f"{where}: not JSON ({first_line})") from None
