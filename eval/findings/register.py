"""Register the findings' current settings and rules (``eval.findings.registration``)::

python -m eval.findings.register                                   # which entries are stale
python -m eval.findings.register --because "reason" [--only NAME]  # register them
"""

from __future__ import annotations

import sys

from eval.findings.registration import load_registry, register, stale_entries
from eval.findings.registry import FINDINGS
from shared.cli_args import CommandParser


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--because", help="register the stale entries, with this reason")
    parser.add_argument("--only", nargs="+", default=None, metavar="FINDING", help="a subset")
    args = parser.parse_args(argv)
    chosen = {name: FINDINGS[name] for name in args.only or FINDINGS}
    stale = stale_entries(chosen, load_registry())
    if not args.because:
        print("\n".join(f"stale: {n}/{s}" for n, s in stale) or "every entry is registered")
        return 1 if stale else 0
    changed = register(chosen, args.because)
    print("registered: " + (", ".join(changed) or "nothing (every entry was current)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
