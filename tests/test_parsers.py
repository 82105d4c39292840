"""Every command line takes its flags whole: no parser abbreviates (``--seed`` taken for
``--seeds`` once trained one seed where two were asked for)."""

import ast
from pathlib import Path

import pytest

from eval.experiments.compare import build_parser

ROOT = Path(__file__).resolve().parent.parent


def test_a_flag_is_never_taken_for_a_longer_one(capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["--seeds", "0,1", "--seed", "2"])
    assert stop.value.code == 2
    assert "unrecognized flag --seed" in capsys.readouterr().err


def test_every_parser_refuses_abbreviations():
    """Parsers are the project's CommandParser (allow_abbrev=False) or say allow_abbrev=False."""
    plain = []
    for folder in ("arlm", "dllm", "shared", "eval", "bench"):
        for file in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and ast.unparse(node.func).endswith("ArgumentParser")
                    and not any(
                        k.arg == "allow_abbrev" and ast.unparse(k.value) == "False"
                        for k in node.keywords
                    )
                ):
                    plain.append(f"{file.relative_to(ROOT)}:{node.lineno}")
    assert not plain, plain
