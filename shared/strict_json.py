"""JSON as the project reads it: one line naming where, for anything no project file holds.

The door (``shared.door``) reads every file; this module only turns text into a value. Bad
syntax, bytes that are not UTF-8 (a byte-order mark of another encoding included), strings
holding a lone surrogate (``"\\ud800"``, which no UTF-8 text can carry), a key given twice in one
object (``{"kind": "nothing", "kind": "run"}`` would otherwise be a run), ``NaN`` and
``Infinity`` (unless the reader asks for the project's own measurements, which spell a missing
number so), nesting deep enough to exhaust the recursion limit, an integer of thousands of
digits, a float beyond float range and text longer than the bound each become one line naming
the file.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from shared.errors import ConfigError

# No number the project writes needs more digits (steps, token counts, seeds below 2**64); a
# longer one is damage or a probe, and would overflow the float arithmetic that reads it.
MAX_INTEGER_DIGITS = 40
MAX_JSON_CHARACTERS = 1 << 28  # no record of the project comes near; a reader may lower it
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _Refused(ValueError):
    pass


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _Refused(f"an integer of {len(digits.lstrip('-'))} digits")
    return int(digits)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400 reads as infinity; NaN and Infinity are spelled as words
        raise _Refused(f"the number {text[:20]} is beyond a float's range")
    return value


def _no_constant(word: str) -> float:
    raise _Refused(f"{word} is not a number a record holds")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _Refused(f"the key {key[:40]!r} appears twice in one object")
        found[key] = value
    return found


def _refuse_lone_surrogates(value: Any) -> None:
    """Every string in ``value`` (keys included) must be UTF-8 text: a lone surrogate is not."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise _Refused("a string holds a lone surrogate (not UTF-8 text)") from None
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _as_text(text: str | bytes) -> str:
    if isinstance(text, bytes):
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError as reason:
            raise _Refused(f"not JSON (not UTF-8 text: {reason})") from None
    return text


def parse_json(
    text: str | bytes,
    where: str,
    error: type[Exception] = ConfigError,
    *,
    allow_nan: bool = False,
    limit: int = MAX_JSON_CHARACTERS,
) -> Any:
    """The JSON value of ``text`` (from ``where``: a file, a line of one); what is not strict
    JSON is ``error``, one line naming ``where`` (see the module's docstring). ``allow_nan``
    admits NaN and Infinity, for the project's own measurement records."""
    try:
        text = _as_text(text)
        if len(text) > limit:
            raise _Refused(f"{len(text):,} characters, more than the {limit:,} a record may hold")
        value = json.loads(
            text,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            parse_constant=float if allow_nan else _no_constant,
            object_pairs_hook=_unique_keys,
        )
        if _SURROGATE_ESCAPE.search(text):
            _refuse_lone_surrogates(value)
        return value
    except _Refused as reason:
        said = str(reason)
        raise error(
            f"{where}: {said}" + ("" if said.startswith("not JSON") else " (damaged or crafted)")
        ) from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to read (damaged or crafted)") from None
    except ValueError as reason:  # JSONDecodeError, an over-long integer
        first_line = str(reason).splitlines()[0] if str(reason) else type(reason).__name__
        raise error(f"{where}: not JSON ({first_line})") from None
