"""A comparison stopped by a signal stops as a whole and resumes; a report is never written from
runs whose budgets differ from the one it states."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval.experiments import compare, stages
from shared.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.serial
def test_sigterm_during_training_stops_the_job_and_the_rerun_reports_true_budgets(tmp_path):
    out = tmp_path / "job"
    flags = ["--preset", "smoke", "--out", str(out), "--no-mauve", "--max-steps", "300"]
    flags += ["--log-every", "1", "--eval-every", "1000", "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "eval.experiments.compare", *flags],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out / "seed-0" / "mdm" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stderr[-2000:]  # stopped after saving: run it again
    assert "stopped by SIGTERM while training mdm" in stdout
    assert not (out / "report.md").exists() and not (out / "stages" / "likelihood.json").exists()
    stopped = json.loads((out / "seed-0" / "mdm" / "final.json").read_text())
    assert stopped["stopped_by"] == "SIGTERM" and not stopped["finished"]

    assert compare.main(flags) == 0  # the rerun resumes the MDM where it stopped
    report = json.loads((out / "report.json").read_text())
    training = report["results"]["training"]
    assert training["mdm"]["finished"] and training["ar"]["finished"]
    assert training["mdm"]["tokens_seen"] == training["ar"]["tokens_seen"] == 300 * 16 * 64
    assert f"after {300 * 16 * 64:,} training tokens each" in (out / "report.md").read_text()


# compare with its generation stage held until a signal comes: the window a test's SIGTERM
# lands in, whatever the speed of the machine
SLOW_GENERATION = """
import sys, time
from eval.experiments import compare
real = compare.generation_stage
def held(*args, **kwargs):
    print("generation started", flush=True)
    time.sleep(600)
    return real(*args, **kwargs)
compare.generation_stage = held
sys.exit(compare.main(sys.argv[1:]))
"""


@pytest.mark.serial
def test_sigterm_during_a_stage_exits_75_keeps_the_stages_before_it_and_the_rerun_continues(
    tmp_path,
):
    out = tmp_path / "job"
    flags = ["--preset", "smoke", "--out", str(out), "--no-mauve", "--max-steps", "40"]
    flags += ["--warmup-steps", "2", "--eval-every", "1000", "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_GENERATION, *flags],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one pipe read line by line: neither fills up unread
        text=True,
    )
    lines = []
    while not lines or lines[-1] and "generation started" not in lines[-1]:
        lines.append(proc.stdout.readline())
    assert lines[-1], "".join(lines)[-2000:]
    proc.send_signal(signal.SIGTERM)
    stdout = proc.communicate(timeout=120)[0]
    assert proc.returncode == 75, stdout[-2000:]
    assert "stopped by SIGTERM during the generate stage" in stdout
    stored = sorted(p.name for p in (out / "stages").iterdir())
    assert stored == ["likelihood.json"]  # the stage cut short left nothing, not half a file
    assert not (out / "report.md").exists()

    rerun = subprocess.run(
        [sys.executable, "-m", "eval.experiments.compare", *flags],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "[likelihood] reusing the stored result" in rerun.stdout
    assert "[generate] done" in rerun.stdout and (out / "report.md").is_file()


@pytest.mark.serial
def test_every_job_exits_75_when_a_signal_stops_it_and_2_on_a_user_error(tmp_path, capsys):
    """``run_stoppable`` runs compare, the sweep, the exact frontier and findings: Ctrl-C (the
    first SIGINT) during a stage leaves no stage file and exits 75, as SIGTERM does."""

    def stopped_in_a_stage(stop) -> None:
        def judged() -> dict:
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.time() + 120
            while time.time() < deadline:  # a stage that would not look at the stop request
                sum(range(1000))
            return {}

        stages.Stages(tmp_path, False, stop).run("quality", {"k": 1}, judged)

    assert stages.run_stoppable(stopped_in_a_stage) == 75
    assert "stopped by SIGINT during the quality stage" in capsys.readouterr().out
    assert list((tmp_path / "stages").iterdir()) == []

    def refused(stop) -> None:
        raise ConfigError("a bad setting")

    assert stages.run_stoppable(refused) == 2
    assert capsys.readouterr().err == "error: a bad setting\n"


def summary(tokens: int, flops_per_token: float = 1.0, finished: bool = True) -> dict:
    return {
        "tokens_seen": tokens,
        "flops_per_token": flops_per_token,
        "finished": finished,
        "step": tokens,
        "total_steps": tokens if finished else tokens * 2,
    }


def test_a_report_from_runs_of_different_budgets_is_refused():
    stages.check_equal_budgets({"ar": summary(100), "mdm": summary(100)}, "tokens")
    with pytest.raises(ConfigError, match="tokens budgets differ"):
        stages.check_equal_budgets({"ar": summary(100), "mdm": summary(60)}, "tokens")
    with pytest.raises(ConfigError, match="did not finish: mdm"):
        stages.check_equal_budgets(
            {"ar": summary(100), "mdm": summary(50, finished=False)}, "tokens"
        )
    flops = {"ar": summary(100, 2.0), "mdm": summary(100, 2.01)}
    stages.check_equal_budgets(flops, "flops")  # within one percent
    with pytest.raises(ConfigError, match="flops budgets differ"):
        stages.check_equal_budgets({"ar": summary(100, 2.0), "mdm": summary(50, 2.0)}, "flops")


def test_a_finished_run_of_another_budget_is_continued_not_reused(tmp_path):
    common = {"cache_dir": str(tmp_path / "cache"), "eval_every": 1000}
    first = stages.train_both("smoke", tmp_path, {"max_steps": 4, **common}, "tokens", False)
    again = stages.train_both("smoke", tmp_path, {"max_steps": 6, **common}, "tokens", False)
    assert first["ar"]["step"] == 4 and again["ar"]["step"] == again["mdm"]["step"] == 6
    assert not again["ar"].get("reused")
    same = stages.train_both("smoke", tmp_path, {"max_steps": 6, **common}, "tokens", False)
    assert same["ar"]["reused"] and same["mdm"]["reused"]
