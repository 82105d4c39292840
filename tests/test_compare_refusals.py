"""The comparison and findings commands: refused seed lists write nothing and name their flag,
another seed on a folder of three refuses naming ``--out`` and ``--force``, the wall-time line
names every run an earlier invocation trained, the budget prose prints no Python values and says
when M(L) is read nowhere, and ``--table`` of a bad index is one line."""

from pathlib import Path

import pytest

from eval.experiments import compare
from eval.experiments.compare_budgets import earlier_steps, earlier_work, multiplier_analysis
from eval.experiments.compare_curves import budgets_section
from eval.experiments.compare_settings import CompareSettings
from eval.findings import __main__ as findings
from eval.report import Report
from shared.training.run_folder import mark_folder


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def smoke(out: Path, *extra: str) -> list[str]:
    return ["--preset", "smoke", "--out", str(out), "--no-mauve", "--max-steps", "2", *extra]


def test_refused_seeds_name_their_flag_and_leave_no_folder(tmp_path, capsys):
    out = tmp_path / "job"
    for flags, flag in (
        (["--seeds", "0,0"], "--seeds"),
        (["--seeds", str(2**32)], "--seeds"),
        (["--seed", str(2**32)], "--seed"),
    ):
        assert compare.main(smoke(out, *flags)) == 2
        assert flag in error_line(capsys)
        assert not out.exists()


def test_another_seed_on_a_three_seed_folder_refuses_naming_out_and_force(tmp_path, capsys):
    out = tmp_path / "job"
    for seed in (0, 1, 2):
        (out / f"seed-{seed}").mkdir(parents=True)
    (out / "report.md").write_text("three seeds")
    mark_folder(out, "compare job")
    assert compare.main(smoke(out, "--seed", "5")) == 2
    line = error_line(capsys)
    assert "seeds 0,1,2" in line and "--out" in line and "--force" in line
    listed = sorted(p.name for p in out.iterdir())
    assert listed == [".duolm", "report.md", "seed-0", "seed-1", "seed-2"]


def test_the_wall_time_names_every_run_and_step_an_earlier_invocation_trained():
    def point(steps, reused=False, earlier=0):
        return {"steps": steps, "reused": reused, "earlier_steps": earlier}

    runs = {
        0: {"points": {"ar": [point(12, reused=True), point(20, earlier=5)]}},
        1: {"points": {"ar": [point(12, earlier=2), point(20, reused=True)]}},
    }
    assert earlier_work(runs) == [
        "train seed 0 ar 12-step branch",
        "5 steps of train seed 0 ar",
        "2 steps of train seed 1 ar 12-step branch",
        "train seed 1 ar",
    ]
    assert earlier_steps({"start_step": 14, "branched_from": "r/checkpoints/step_000010"}) == 4
    assert earlier_steps({"start_step": 7, "branched_from": None}) == 7
    assert earlier_steps({}) == 0


def test_findings_table_of_a_missing_or_broken_index_is_one_line(tmp_path, capsys):
    bad, other = tmp_path / "bad.json", tmp_path / "other.json"
    bad.write_text("{not json")
    other.write_text("[1, 2]")
    for path, said in (
        (tmp_path / "none.json", "no such file"),
        (bad, "not JSON"),
        (other, "not a findings index"),
    ):
        assert findings.main(["--table", str(path), "reports"]) == 2
        assert said in error_line(capsys)


def budget_run(ar: list[tuple[float, float]], mdm: list[tuple[float, float]]) -> dict:
    def points(frontier):
        return [
            {"flops": c, "loss": loss, "loss_se": None, "bpb": loss / 5, "steps": 10 * (i + 1)}
            for i, (c, loss) in enumerate(frontier)
        ]

    return {"points": {"ar": points(ar), "mdm": points(mdm)}}


def test_the_budget_prose_has_no_python_dicts_and_an_empty_m_of_l_table_is_said(tmp_path):
    pytest.importorskip("matplotlib")
    ar = [(1e10, 4.0), (2e10, 3.6), (4e10, 3.3), (8e10, 3.1)]
    stuck = [(1e11, 5.15), (2e11, 5.14), (4e11, 5.12), (8e11, 5.0)]
    runs = {0: budget_run(ar, stuck), 1: budget_run(ar, stuck)}
    settings = CompareSettings(seeds=(0, 1))
    analysis = multiplier_analysis(runs, 5.2, settings)
    report = Report("budgets", tmp_path)
    budgets_section(report, runs, analysis, 5.2, False, "")
    prose = " ".join(block for kind, block in report.blocks if kind == "text")
    assert "seed 0: AR 4, MDM 1; seed 1: AR 4, MDM 1" in prose
    assert "not measured at seed(s) 0, 1" in prose and "{" not in prose and "[0, 1]" not in prose
    titles = [block.title for kind, block in report.blocks if kind == "table"]
    assert not any(title.startswith("M(L) per seed") for title in titles)
    assert "M(L) is read nowhere" in prose
