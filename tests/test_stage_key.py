"""The stage cache's key is the code that ran (eval/stage_key.py, eval/experiments/stages.py): a
stored stage is reused only under the same inputs, the same source of every project module the
stage executed and the same package versions, and is otherwise recomputed with one line saying
what changed. The code checks run the main job's own stage functions on a copy of the real
source tree in a fresh process, so a family reached only through a registry is in the key or the
test fails."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from eval.experiments.stages import Stages
from eval.stage_key import STAGE_FOLDERS, stage_packages

ROOT = Path(__file__).resolve().parent.parent

# The main job's likelihood stage (it scores the MDM) and generate stage (it samples it), as
# eval.experiments.compare runs them, over the runs in argv[1], stored under argv[2].
MAIN_JOB_STAGES = """
import sys
from pathlib import Path

from eval.experiments.compare import likelihood_stage
from eval.experiments.compare_samples import generation_stage
from eval.experiments.compare_settings import settings_for
from eval.experiments.stages import Stages, load

runs, out = Path(sys.argv[1]), Path(sys.argv[2])
settings = settings_for("smoke", load(runs, "ar")[2]["model_config"]["max_seq_len"])
stages = Stages(out, force=False)
stages.run("likelihood", {"runs": "tiny"}, lambda: likelihood_stage(runs, settings))
stages.run("generate", {"runs": "tiny"}, lambda: generation_stage(runs, settings))
"""


def source_copy(folder: Path) -> Path:
    """The project's source folders, train.py and the docs' pages, copied to ``folder``."""
    for name in STAGE_FOLDERS:
        shutil.copytree(ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "train.py", folder / "train.py")
    (folder / "docs").mkdir()
    for page in (ROOT / "docs").glob("*.md"):
        shutil.copy(page, folder / "docs" / page.name)
    return folder


def stage_lines(source: Path, runs: Path, out: Path) -> dict[str, str]:
    """Run the main job's stages with the copy's code: stage -> what it printed first."""
    done = subprocess.run(
        [sys.executable, "-c", MAIN_JOB_STAGES, str(runs), str(out)],
        cwd=source,
        env={**os.environ, "PYTHONPATH": str(source)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {}
    for line in done.stdout.splitlines():
        for stage in ("likelihood", "generate"):
            if line.startswith(f"[{stage}] "):
                lines.setdefault(stage, line.removeprefix(f"[{stage}] "))
    return lines


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_editing_the_masked_sampler_recomputes_the_stages_that_score_and_sample_the_mdm(
    tmp_path, tiny_runs
):
    source = source_copy(tmp_path / "source")
    runs = tmp_path / "runs"
    for name, folder in tiny_runs.items():
        shutil.copytree(folder, runs / name)
    out = tmp_path / "job"
    first = stage_lines(source, runs, out)
    assert all(line.startswith("done") for line in first.values()), first
    stored = json.loads((out / "stages" / "generate.json").read_text())
    # reached only through dllm/__init__'s registry, never named in an import statement
    assert "dllm/masked/sampler.py" in stored["code"]

    append(source / "docs" / "training.md", "\nAn edit to a page.\n")
    append(source / "bench" / "train_peers.py", "\n# an edit to a module the stages never ran\n")
    reused = stage_lines(source, runs, out)
    assert all(line.startswith("reusing the stored result") for line in reused.values()), reused

    append(source / "dllm" / "masked" / "sampler.py", "\n# an edit to the masked sampler\n")
    again = stage_lines(source, runs, out)
    assert set(again) == {"likelihood", "generate"}
    for line in again.values():
        assert line == "recomputing: the code it ran changed (dllm/masked/sampler.py)", again


def counted(calls: list[int]):
    def compute():
        calls.append(1)
        return {"value": len(calls)}

    return compute


def test_a_changed_package_version_recomputes_naming_it(tmp_path, monkeypatch, capsys):
    calls: list[int] = []
    assert Stages(tmp_path, False).run("s", {"k": 1}, counted(calls)) == {"value": 1}
    assert Stages(tmp_path, False).run("s", {"k": 1}, counted(calls)) == {"value": 1}
    # another numpy installed: its metadata, found first on the path, says so (nothing imports it)
    installed = tmp_path / "site" / "numpy-0.0.1.dist-info"
    installed.mkdir(parents=True)
    (installed / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 0.0.1\n")
    before = stage_packages()["numpy"]
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    capsys.readouterr()
    assert Stages(tmp_path, False).run("s", {"k": 1}, counted(calls)) == {"value": 2}
    assert f"[s] recomputing: packages changed (numpy {before} -> 0.0.1)" in capsys.readouterr().out


def test_changed_inputs_and_a_damaged_file_are_recomputed_saying_so(tmp_path, capsys):
    calls: list[int] = []
    Stages(tmp_path, False).run("s", {"data": "a", "steps": 5}, counted(calls))
    Stages(tmp_path, False).run("s", {"data": "b", "steps": 5}, counted(calls))
    assert "[s] recomputing: its inputs changed (data)" in capsys.readouterr().out
    (tmp_path / "stages" / "s.json").write_text("[" * 100_000)
    assert Stages(tmp_path, False).run("s", {"data": "b", "steps": 5}, counted(calls)) == {
        "value": 3
    }
    assert "[s] recomputing: the stored file is damaged" in capsys.readouterr().out
    assert calls == [1, 1, 1]


def test_a_stored_result_of_the_wrong_shape_or_an_overlong_number_is_recomputed(tmp_path, capsys):
    # a record whose key matches but whose result is no object or number, or which holds a
    # number no stage writes, is damage: recomputed with one line, never returned
    calls: list[int] = []
    key = {"data": "a"}
    Stages(tmp_path, False).run("s", key, counted(calls))
    path = tmp_path / "stages" / "s.json"
    good = json.loads(path.read_text())
    capsys.readouterr()
    for result, said in (([1, 2], "a JSON list"), ("x", "a JSON str"), (True, "a JSON bool")):
        path.write_text(json.dumps(good | {"result": result}))
        assert Stages(tmp_path, False).run("s", key, counted(calls)) == {"value": len(calls)}
        assert f"[s] recomputing: its stored result is {said}" in capsys.readouterr().out
    path.write_text(json.dumps(good | {"seconds": 9 * 10**400}))
    assert Stages(tmp_path, False).run("s", key, counted(calls)) == {"value": len(calls)}
    assert "[s] recomputing: the stored file is damaged" in capsys.readouterr().out
    # a number is a result too (the unigram entropy stages)
    assert Stages(tmp_path, False).run("n", key, lambda: 2.5) == 2.5
    assert Stages(tmp_path, False).run("n", key, lambda: 0.0) == 2.5
    assert len(calls) == 5


def test_a_file_edited_between_two_stages_of_one_process_keys_both_by_the_code_it_loaded(
    tmp_path, monkeypatch
):
    # the process imported the module before the edit, so both stages ran the first version:
    # the second stage must not be keyed by the edited file (and a new process sees the edit)
    from shared import code_state as stage_key

    module_file = tmp_path / "dllm" / "edited_module.py"
    module_file.parent.mkdir()
    module_file.write_text("VALUE = 1\n")
    monkeypatch.setitem(sys.modules, "edited_module_for_test", type(sys)("edited_module_for_test"))
    sys.modules["edited_module_for_test"].__file__ = str(module_file)
    monkeypatch.setattr(stage_key, "_FIRST_READ", {})
    first = stage_key.stage_code(root=tmp_path)
    module_file.write_text("VALUE = 2\n")
    second = stage_key.stage_code(root=tmp_path)
    assert first["dllm/edited_module.py"] == second["dllm/edited_module.py"]
    assert stage_key.file_hash(module_file) != first["dllm/edited_module.py"]
    monkeypatch.setattr(stage_key, "_FIRST_READ", {})  # a new process reads the edit
    assert (
        stage_key.stage_code(root=tmp_path)["dllm/edited_module.py"]
        != first["dllm/edited_module.py"]
    )
