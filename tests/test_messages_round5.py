"""Messages that say the right thing: ``findings --table`` refuses REPORTS folders its links would
miss, ``duolm sample`` on a udm run names udm (not ``--sampler fixed``), a curriculum longer than
the run is refused, the help texts name udm, an unknown command suggests the closest one, each
export refusal speaks of its own objective, a conversion refusal says "not converted" once, and
``--resume`` never suggests an ``--overwrite`` that would refuse.

Every test works inside its tmp path with HOME pointed there."""

import json
from pathlib import Path

import pytest

from eval import cli as duolm
from eval.findings import __main__ as findings


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    return folder


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# ---- findings --table: every link of the table resolves ----------------------------------------


def findings_index(tmp_path: Path) -> Path:
    claim = {"title": "T", "statement": "S.", "source": "X 2024"}
    row = {"claim": claim, "measured": "1", "verdict": "reproduced", "wall_seconds": 60}
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"findings": [{"name": "a", **row}, {"name": "b", **row}]}))
    return index


def test_findings_table_refuses_a_reports_folder_its_links_would_miss(tmp_path, capsys):
    index = findings_index(tmp_path)
    reports = tmp_path / "reports"
    assert duolm.main(["findings", "--table", str(index), "/nonexistent"]) == 2
    line = error_line(capsys)
    assert line.startswith("error: --table REPORTS /nonexistent: no such folder"), line
    (reports / "a").mkdir(parents=True)
    (reports / "a" / "report.md").write_text("# a")
    assert findings.main(["--table", str(index), str(reports)]) == 2
    assert f"--table REPORTS {reports}: it has no b/report.md" in error_line(capsys)
    (tmp_path / "file").write_text("x")
    assert findings.main(["--table", str(index), str(tmp_path / "file")]) == 2
    assert "not a folder" in error_line(capsys)
    (reports / "b").mkdir()
    (reports / "b" / "report.md").write_text("# b")
    assert findings.main(["--table", str(index), str(reports)]) == 0
    assert f"[T]({reports}/b/report.md)" in capsys.readouterr().out


def test_the_committed_findings_table_resolves_from_the_project_root(monkeypatch, capsys):
    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(root)
    index = "docs/studies/findings-cpu/index.json"
    assert findings.main(["--table", index, "docs/studies/findings-cpu"]) == 0
    assert capsys.readouterr().out in (root / "README.md").read_text()
