"""The side-by-side sampling script on tiny checkpoints."""

import pytest

from eval.experiments import side_by_side


@pytest.fixture
def runs(tiny_runs):
    return tiny_runs["ar"].parent


def test_prints_both_models_for_prompts_and_infilling(runs, capsys):
    code = side_by_side.main(
        [
            str(runs / "ar"),
            str(runs / "mdm"),
            "--prompt",
            "And God",
            "--infill",
            "In the",
            " earth.",
            "--gen-length",
            "8",
            "--steps",
            "4",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "prompt: 'And God'" in out and "infill: 'In the' ... ' earth.'" in out
    assert out.count("NFE") == 4  # two cells per request
    assert "[8 NFE" in out  # AR: one forward per generated token


def test_user_errors_exit_2(runs, capsys):
    assert side_by_side.main([str(runs / "ar"), str(runs / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert side_by_side.main([str(runs / "mdm"), str(runs / "ar")]) == 2  # swapped objectives
    assert side_by_side.main([str(runs / "ar"), str(runs / "mdm"), "--gen-length", "500"]) == 2
