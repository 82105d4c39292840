"""Each run records the code that trained it (shared/training/provenance.py), and a report reading
runs calls itself clean only when they and it share one committed code (eval/report_clean.py): a
run under another code key, one edited during training, one resumed under other code and one
trained before runs kept a record each make the report say so in its first lines."""

import json
import shutil
from pathlib import Path

import pytest

from eval.report import Report
from eval.report_clean import refuse_unless_clean
from shared.code_state import code_key, file_hash, git_state
from shared.errors import ConfigError
from shared.training import cli
from shared.training import provenance as run_provenance
from shared.training.provenance import RECORD, UNKNOWN, why_not_reproducible

ROOT = Path(__file__).resolve().parent.parent


def tiny(out: Path, cache: Path, *extra: str) -> list[str]:
    return ["--preset", "tiny", "--out", str(out), "--cache-dir", str(cache), *extra]


@pytest.fixture(scope="module")
def provenance_run(tmp_path_factory, cache_dir) -> Path:
    """A tiny MDM run of two steps (each test changes a copy)."""
    out = tmp_path_factory.mktemp("provenance") / "run"
    cli.train_from_argv(tiny(out, cache_dir, "--objective", "mdm", "--max-steps", "2"))
    return out


def copy_of(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "job" / "run"
    shutil.copytree(run, target)
    return target


def record_of(run: Path) -> dict:
    return json.loads((run / RECORD).read_text())


def rewrite(run: Path, change) -> None:
    record = record_of(run)
    change(record)
    (run / RECORD).write_text(json.dumps(record))


def report_of(run_or_job: Path, out: Path) -> tuple[dict, str]:
    paths = Report("Runs read", out, runs=[run_or_job]).write()
    return json.loads(paths["json"].read_text()), paths["markdown"].read_text()


def test_a_run_records_the_commit_dirty_flag_and_code_key_it_trained_under(provenance_run):
    record = record_of(provenance_run)
    [segment] = record["segments"]
    assert (segment["from_step"], segment["to_step"], segment["checked_at"]) == (0, 2, "end")
    state = git_state()
    assert segment["git_commit"] == state["git_commit"] and len(segment["git_commit"]) == 40
    assert segment["git_dirty"] is state["git_dirty"]
    code = segment["code"]
    # the training code it ran, keyed as the stage cache keys a stage; not the evaluation's
    assert code["shared/training/trainer.py"] == file_hash(ROOT / "shared/training/trainer.py")
    assert "dllm/masked/objective.py" in code and not any(p.startswith("eval/") for p in code)
    assert segment["code_key"] == code_key(code)
    assert segment["edited_during_training"] == [] and record["mixed"] is False


def test_the_same_code_at_the_same_clean_commit_is_reproducible(provenance_run):
    record = record_of(provenance_run)
    record["segments"][0]["git_dirty"] = False  # as a clean checkout records it
    assert why_not_reproducible(record, record["segments"][0]["git_commit"]) == []
    assert why_not_reproducible(record, "0" * 40) == [
        f"trained at commit {record['segments'][0]['git_commit'][:7]}, the report's is 0000000"
    ]


def test_a_run_under_another_code_key_makes_the_report_not_clean_naming_the_run(
    provenance_run, tmp_path
):
    run = copy_of(provenance_run, tmp_path)
    rewrite(run, lambda r: r["segments"][0]["code"].update({"shared/model.py": "0" * 16}))
    data, markdown = report_of(tmp_path / "job", tmp_path / "report")
    assert data["clean"] is False and data["reproducible"] is False
    [entry] = data["runs_provenance"]
    assert entry["run"] == "job/run" and entry["recorded"] is True
    why = "trained under another code key (shared/model.py differ from the report's)"
    assert why in entry["not_reproducible_because"]
    assert any(
        line.startswith("run job/run: ") and why in line for line in data["not_clean_because"]
    )
    # said before anything else, in one line naming the run and why
    first = markdown.splitlines()[2]
    assert first.startswith("**Not clean") and "1 of 1 runs were trained under other code" in first
    assert "`job/run` (" in first and why in first
    assert "- run `job/run`: trained steps 0-2 at" in markdown


def test_a_file_edited_during_training_makes_the_run_dirty(tmp_path, cache_dir, monkeypatch):
    on_disk = run_provenance.files_on_disk

    def edited_model(paths):  # the backbone's file changed on disk while the run trained
        return on_disk(paths) | {"shared/model.py": "edited"}

    monkeypatch.setattr(run_provenance, "files_on_disk", edited_model)
    out = tmp_path / "run"
    cli.train_from_argv(tiny(out, cache_dir, "--objective", "ar", "--max-steps", "2"))
    [segment] = record_of(out)["segments"]
    assert segment["edited_during_training"] == ["shared/model.py"]
    reasons = why_not_reproducible(record_of(out), segment["git_commit"])
    assert "edited during training: shared/model.py" in reasons


def test_a_resume_under_other_code_records_both_and_is_mixed(provenance_run, tmp_path, cache_dir):
    run = copy_of(provenance_run, tmp_path)
    rewrite(run, lambda r: r["segments"][0].update({"code_key": "another-key"}))
    checkpoint = run / "checkpoints" / "step_000002"
    cli.train_from_argv(
        ["--resume", str(checkpoint), "--max-steps", "4", "--cache-dir", str(cache_dir)]
    )
    record = record_of(run)
    first, second = record["segments"]
    assert (first["to_step"], second["from_step"], second["to_step"]) == (2, 2, 4)
    assert first["code_key"] == "another-key" and second["code_key"] != "another-key"
    assert record["mixed"] is True
    reasons = why_not_reproducible(record, second["git_commit"])
    assert "resumed under other code than it started with" in reasons


def test_a_run_without_a_record_is_unknown_provenance(provenance_run, tmp_path):
    run = copy_of(provenance_run, tmp_path)
    (run / RECORD).unlink()
    # a job's report, in the job's folder: the runs below it are the ones it read
    paths = Report("Runs read", tmp_path / "job").write()
    data, markdown = json.loads(paths["json"].read_text()), paths["markdown"].read_text()
    [entry] = data["runs_provenance"]
    assert entry["run"] == "run" and entry["recorded"] is False
    assert entry["not_reproducible_because"] == [UNKNOWN] and data["clean"] is False
    assert f"`run` ({UNKNOWN})" in markdown.splitlines()[2]


def test_a_report_that_must_be_clean_refuses_in_one_line(provenance_run, tmp_path):
    run = copy_of(provenance_run, tmp_path)
    (run / RECORD).unlink()
    paths = Report("Must be clean", tmp_path / "job").write()
    with pytest.raises(ConfigError, match=f"report.json is not clean: .*{UNKNOWN}") as error:
        refuse_unless_clean(paths["json"])
    assert "\n" not in str(error.value)
    stored = json.loads(paths["json"].read_text())
    # a report written before the rule has no clean flag to trust
    paths["json"].write_text(json.dumps({k: v for k, v in stored.items() if k != "clean"}))
    with pytest.raises(ConfigError, match="records no clean flag"):
        refuse_unless_clean(paths["json"])
    # one that is clean passes
    paths["json"].write_text(json.dumps(stored | {"clean": True, "not_clean_because": []}))
    refuse_unless_clean(paths["json"])


def test_the_exact_frontier_with_require_clean_writes_its_report_then_refuses(
    provenance_run, tmp_path, monkeypatch, capsys
):
    from eval.experiments import exact_frontier

    def frontier_of_an_old_run(out, *args):  # its one network trained before the record
        shutil.copytree(provenance_run, out / "mdm")
        (out / "mdm" / RECORD).unlink()
        return Report("Frontier", out).write()

    monkeypatch.setattr(exact_frontier, "run_frontier", frontier_of_an_old_run)
    out = tmp_path / "frontier"
    assert exact_frontier.main(["--out", str(out), "--scale", "smoke", "--require-clean"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and "is not clean: " in line and f"run mdm: {UNKNOWN}" in line
    assert json.loads((out / "report.json").read_text())["clean"] is False
    assert exact_frontier.main(["--out", str(out), "--scale", "smoke", "--force"]) == 0


def test_checkpoints_and_runs_moved_aside_are_not_runs_a_report_read(provenance_run, tmp_path):
    run = copy_of(provenance_run, tmp_path)
    shutil.copytree(run, tmp_path / "job" / "run.replaced-1")
    data, _ = report_of(tmp_path / "job", tmp_path / "report")
    assert [entry["run"] for entry in data["runs_provenance"]] == ["job/run"]


def test_a_branch_keeps_the_provenance_of_the_steps_it_continues(
    provenance_run, tmp_path, cache_dir
):
    source = copy_of(provenance_run, tmp_path)
    (source / RECORD).unlink()  # its two steps were trained before runs kept a record
    branch = tmp_path / "branch"
    checkpoint = source / "checkpoints" / "step_000002"
    cli.train_from_argv(
        ["--resume", str(checkpoint), "--out", str(branch), "--max-steps", "4"]
        + ["--cache-dir", str(cache_dir)]
    )
    record = record_of(branch)
    inherited, own = record["segments"]
    assert inherited == {"from_step": 0, "to_step": 2, "unknown": True}
    assert (own["from_step"], own["to_step"], own["checked_at"]) == (2, 4, "end")
    assert record["mixed"] is True
    reasons = why_not_reproducible(record, own["git_commit"])
    assert f"its steps before 2 were {UNKNOWN}" in reasons


def test_a_run_started_from_another_runs_weights_is_judged_with_that_run(
    provenance_run, tmp_path, cache_dir
):
    source = copy_of(provenance_run, tmp_path)
    (source / RECORD).unlink()
    checkpoint = source / "checkpoints" / "step_000002"
    out = tmp_path / "warm"
    cli.train_from_argv(
        tiny(
            out, cache_dir, "--objective", "mdm", "--max-steps", "2", "--init-from", str(checkpoint)
        )
    )
    record = record_of(out)
    assert record["init_from"] == {"checkpoint": str(checkpoint), "imported": False, "record": None}
    [own] = record["segments"]
    reasons = why_not_reproducible(record | {"mixed": False}, own["git_commit"])
    assert f"its --init-from run: {UNKNOWN}" in reasons
    # with its source's record the same rule applies to it, and a clean source adds nothing
    clean_source = record_of(provenance_run)
    clean_source["segments"][0]["git_dirty"] = own["git_dirty"] = False
    record["init_from"]["record"] = clean_source
    assert why_not_reproducible(record, own["git_commit"]) == []


def test_a_damaged_record_is_a_reason_and_the_report_is_still_written(provenance_run, tmp_path):
    run = copy_of(provenance_run, tmp_path)
    (run / RECORD).write_text('{"segments": ')
    data, markdown = report_of(tmp_path / "job", tmp_path / "report")
    [entry] = data["runs_provenance"]
    assert entry["not_reproducible_because"][0].startswith("its record cannot be read (")
    assert data["clean"] is False and "its record cannot be read" in markdown.splitlines()[2]


def test_a_distilled_student_records_its_code_and_its_teacher(udm_run, tmp_path):
    from dllm.uniform import distill

    out = tmp_path / "student"
    fast = ["--rounds", "1", "--steps-per-round", "1", "--base-steps", "8"]
    cache = ["--cache-dir", str(udm_run.parent / "cache")]
    assert distill.main([str(udm_run), str(out), *fast, *cache]) == 0
    record = record_of(out)
    [segment] = record["segments"]
    assert (segment["from_step"], segment["to_step"], segment["checked_at"]) == (0, 1, "end")
    assert "dllm/uniform/distill.py" in segment["code"]
    assert record["init_from"]["record"] == record_of(udm_run)
    assert record["init_from"]["checkpoint"].endswith("step_000002")
