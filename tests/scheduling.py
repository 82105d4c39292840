"""How the suite's tests are shared between the two pytest-xdist workers.

Three rules keep the parallel run as reliable as a serial one and as short as the two cores allow:

- ``serial`` tests (two-process training, signal and lock timing, memory guards) must not run
  beside one another: they form one work unit, run by one worker one after another;
- the tests of a module that share a module-scoped fixture defined in it (a tiny trained run, the
  imported SmolLM2) form one work unit, so that the fixture is built once;
- every other test is a unit of its own, handed to whichever worker is free.

Units are handed out in the collection order that ``order`` gives: the serial unit first, then
every unit holding a ``slow`` test (so no worker is left with a long test at the end), then the
rest in file order.

pytest-xdist's own ``--dist loadgroup`` cannot carry this since pytest 9.2 (it renames the items'
node ids through an attribute pytest no longer reads), so the workers write each test's unit to a
file that the scheduler in the main process reads (``GroupScheduling``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

UNITS_FOLDER = "DUOLM_TEST_UNITS"  # environment variable: where the workers write the units


def module_unit(item) -> str | None:
    """The unit of an item that shares a module-scoped fixture defined in its own module."""
    module = item.nodeid.split("::")[0]
    fixtures = getattr(item, "_fixtureinfo", None)
    for definitions in fixtures.name2fixturedefs.values() if fixtures else ():
        for definition in definitions:
            defined_here = definition.baseid.split("::")[0] == module
            if defined_here and definition.scope in ("module", "class"):
                return module
    return None


def unit_of(item) -> str:
    if item.get_closest_marker("serial"):
        return "serial"
    return module_unit(item) or item.nodeid


def order(items: list) -> None:
    """Sort ``items`` in place: the serial unit, then units with a slow test, then the rest; the
    sort is stable, so a unit's tests keep their order and stay together."""
    units = {item: unit_of(item) for item in items}
    slow = {units[item] for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        unit = units[item]
        return 0 if unit == "serial" else 1 if unit in slow else 2

    items.sort(key=rank)


def write_units(items: list) -> None:
    """In a worker: record each collected test's unit for the scheduler (both workers collect the
    same tests, so either file will do)."""
    folder, worker = os.environ.get(UNITS_FOLDER), os.environ.get("PYTEST_XDIST_WORKER")
    if not folder or not worker:
        return
    target = Path(folder) / f"{worker}.json"
    staging = target.with_suffix(".tmp")
    staging.write_text(json.dumps({item.nodeid: unit_of(item) for item in items}))
    staging.replace(target)


class GroupScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling with the units above as scopes, in collection order."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        config.option.loadscopereorder = False  # collection order already puts long units first
        self.units: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self.units is None:
            written = sorted(Path(os.environ[UNITS_FOLDER]).glob("*.json"))
            self.units = json.loads(written[0].read_text()) if written else {}
        return self.units.get(nodeid, nodeid)
