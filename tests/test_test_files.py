"""The test suite is found by subject: no test file is named after the review that asked for it,
and each fixture has one definition (in ``conftest.py`` when several modules use it), so a
reader who finds a fixture's name has found the fixture."""

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def is_fixture(decorator: ast.expr) -> bool:
    """``@pytest.fixture`` and ``@pytest.fixture(...)``."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute | ast.Name) and (
        getattr(target, "attr", None) == "fixture" or getattr(target, "id", None) == "fixture"
    )


def fixture_definitions() -> dict[str, list[str]]:
    """Each fixture name with the test files that define it at their top level."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            if isinstance(node, ast.FunctionDef) and any(map(is_fixture, node.decorator_list)):
                found[node.name].append(str(path.relative_to(TESTS)))
    return found


def test_no_test_file_is_named_after_a_review_round():
    rounds = [path.name for path in TESTS.rglob("*.py") if "round" in path.name]
    assert not rounds, f"name these by what they test: {rounds}"


def test_no_fixture_is_defined_in_two_files():
    twice = {name: files for name, files in fixture_definitions().items() if len(files) > 1}
    assert not twice, "\n".join(f"{name}: {', '.join(files)}" for name, files in twice.items())
