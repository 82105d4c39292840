"""The comparison jobs keep what they did not create and say what they did: one job per folder,
``--force`` sets the earlier job aside (moved, not deleted) and a stopped forced job resumes
without it, a run continued to a larger budget says so in the report, refusals name the flags
the job has, a signal during an evaluation stage stops that stage at once and says which, and
every preset's sample lengths fit its model."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eval.experiments import compare, stages
from eval.experiments.block_sweep import sweep_settings_for
from eval.experiments.compare_report import schedule_note
from eval.experiments.compare_settings import settings_for
from shared.errors import ConfigError
from shared.faults import StopRequest
from shared.training import resolve_config
from shared.training.run_folder import RunFolderLock, mark_folder

ROOT = Path(__file__).resolve().parent.parent


def compare_flags(out: Path, cache: Path, *extra: str) -> list[str]:
    return ["--preset", "smoke", "--out", str(out), "--no-mauve", "--cache-dir", str(cache), *extra]


@pytest.mark.serial
def test_force_sets_the_earlier_job_aside_and_a_stopped_forced_job_resumes_without_it(tmp_path):
    out, cache = tmp_path / "job", tmp_path / "cache"
    (out / "stages").mkdir(parents=True)  # what an earlier job leaves
    (out / "stages" / "quality.json").write_text("{}")
    mark_folder(out, "compare job")
    earlier_report = "# the earlier job's report\n"
    (out / "report.md").write_text(earlier_report)

    flags = compare_flags(out, cache, "--max-steps", "300", "--log-every", "1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "eval.experiments.compare", *flags, "--force"],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out / "seed-0" / "ar" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        moved = any(p.name.startswith("job.replaced-") for p in tmp_path.iterdir())
        if moved and metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stderr[-2000:]
    assert "moved the earlier job" in stdout and "without --force" in stdout
    # The earlier job, report included, is beside the folder; nothing of it is left inside.
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("job.replaced-")]
    assert len(aside) == 1 and (aside[0] / "report.md").read_text() == earlier_report
    assert not (out / "report.md").exists() and not (out / "stages").exists()
    stopped = json.loads((out / "seed-0" / "ar" / "final.json").read_text())
    assert stopped["stopped_by"] == "SIGTERM"

    # Without --force the job resumes where the forced one stopped (its training, here).
    resumed = stages.train_or_reuse(
        "ar", out / "seed-0" / "ar", "smoke", {"objective": "ar"}, {"max_steps": 300}, False
    )
    assert resumed["finished"] and resumed["step"] == 300
    metric_steps = [
        r["step"]
        for r in map(json.loads, (out / "seed-0" / "ar" / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ]
    assert metric_steps == list(range(1, 301))  # resumed, not retrained from step 0


def test_a_second_job_on_a_folder_in_use_exits_at_once_naming_the_first(tmp_path, capsys):
    out = tmp_path / "job"
    lock = RunFolderLock(out).acquire()
    try:
        assert compare.main(compare_flags(out, tmp_path / "cache")) == 2
    finally:
        lock.release()
    assert f"PID {os.getpid()}" in capsys.readouterr().err
    assert not (out / "seed-0" / "ar").exists()


def test_a_continued_run_is_said_to_be_continued(tmp_path):
    # Past a 2-step warmup the 4-step and 6-step cosines differ: the continued run is not the
    # run scheduled for 6 steps. (Runs whose rates agree up to the continuation keep one
    # schedule: tests/test_wsd.py.)
    common = {"cache_dir": str(tmp_path / "cache"), "eval_every": 1000, "warmup_steps": 2}
    stages.train_both("smoke", tmp_path, {"max_steps": 4, **common}, "tokens", False)
    longer = stages.train_both("smoke", tmp_path, {"max_steps": 6, **common}, "tokens", False)
    assert longer["ar"]["schedule_history"] == [
        {"from_step": 0, "total_steps": 4},
        {"from_step": 4, "total_steps": 6},
    ]
    note = schedule_note(longer)
    assert "not runs scheduled for this budget" in note
    assert "AR trained from step 0 under a 4-step schedule, then from step 4 under a 6-step" in note
    fresh = stages.train_both("smoke", tmp_path / "b", {"max_steps": 6, **common}, "tokens", False)
    assert schedule_note(fresh) == ""


@pytest.mark.parametrize(
    "change, said",
    [({"seed": 1}, "seed: checkpoint 0 vs now 1"), ({"max_steps": 2}, "past this run's budget")],
    ids=["another seed", "a smaller budget"],
)
def test_a_run_that_cannot_continue_names_out_and_force(change, said, tmp_path):
    common = {"cache_dir": str(tmp_path / "cache"), "eval_every": 1000}
    run = tmp_path / "ar"
    stages.train_or_reuse(
        "ar", run, "smoke", {"objective": "ar"}, {"max_steps": 4, **common}, False
    )
    with pytest.raises(ConfigError) as refused:
        stages.train_or_reuse(
            "ar", run, "smoke", {"objective": "ar"}, {"max_steps": 4, **common, **change}, False
        )
    text = str(refused.value)
    assert said in text and "another --out" in text and "--force" in text
    assert "--allow-config-change" not in text and "raise the budget" not in text


@pytest.mark.serial
def test_a_signal_during_an_evaluation_stage_stops_it_at_once_and_names_it(tmp_path):
    stop = StopRequest(on_stop="stopping at the end of the current stage")
    job_stages = stages.Stages(tmp_path, False, stop)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))

    def judge_forever() -> dict:
        deadline = time.time() + 120
        while time.time() < deadline:  # a stage that would not look at the stop request
            sum(range(1000))
        return {"done": True}

    try:
        timer.start()
        with pytest.raises(stages.JobStopped, match="SIGTERM during the quality stage"):
            job_stages.run("quality", {"k": 1}, judge_forever)
    finally:
        timer.cancel()
        stop.close()
    assert not (tmp_path / "stages" / "quality.json").exists()


@pytest.mark.parametrize("preset", ["tiny", "smoke", "demo"])
def test_every_presets_sample_lengths_fit_its_model(preset):
    context = resolve_config(preset, {})[0].max_seq_len
    fitted = settings_for(preset, context)
    assert 1 + fitted.prompt_tokens + fitted.gen_length <= context
    assert max(fitted.diffusion_steps) <= fitted.gen_length
    assert 1 + sweep_settings_for(preset, context).gen_length <= context
    if preset != "tiny":  # presets that already fit keep their settings
        assert fitted == settings_for(preset)
