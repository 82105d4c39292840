"""Jobs claim their folders as runs do: every job command (compare, synthetic compare, block
sweep, exact frontier, findings) takes as ``--out`` only a new or empty folder or one its own
kind of job marked; ``--force`` moves aside only a folder some job marked, or an empty one; a
job folder holding a symbolic link anywhere below it is refused before anything in it is read;
job folders are made one component at a time, never through a link."""

import json
import os
import sys
from pathlib import Path

import pytest

from eval.experiments import block_sweep, compare, exact_frontier, job_folder, stages
from eval.findings import __main__ as findings
from shared import door
from shared.errors import ConfigError
from shared.training.run_folder import MARKER, folder_kind, mark_folder

# what each job command's folder is marked as, and a command line that trains little
COMMANDS = {
    "compare": ("compare job", compare.main, ["--preset", "smoke", "--no-mauve"]),
    "synthetic compare": ("synthetic compare job", compare.main, ["--preset", "synthetic-smoke"]),
    "sweep": ("sweep job", block_sweep.main, ["--preset", "smoke"]),
    "exact frontier": ("exact frontier job", exact_frontier.main, ["--scale", "smoke"]),
    "findings": ("findings", findings.main, ["--scale", "smoke", "--only", "reversal"]),
}


def run(command: str, out: Path, tmp_path: Path, *extra: str) -> int:
    _, main, flags = COMMANDS[command]
    cache = [] if command == "exact frontier" else ["--cache-dir", str(tmp_path / "cache")]
    steps = ["--max-steps", "2"] if command in ("compare", "sweep") else []
    return main([*flags, "--out", str(out), *steps, *cache, *extra])


def tree(folder: Path) -> list[tuple[str, bytes | str]]:
    """Every entry under ``folder`` (links not followed) with its bytes, to compare."""
    return sorted(
        (
            str(p.relative_to(folder)),
            f"-> {os.readlink(p)}" if p.is_symlink() else p.read_bytes() if p.is_file() else "/",
        )
        for p in folder.rglob("*")
    )


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def users_folder(path: Path) -> Path:
    """A folder of a user's own report and findings index."""
    path.mkdir(parents=True)
    (path / "report.md").write_text("# my own report\n")
    (path / "index.md").write_text("# my own index\n")
    (path / "index.json").write_text('{"mine": true}\n')
    return path


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_job_command_refuses_a_folder_of_user_files_with_or_without_force(
    command, tmp_path, capsys
):
    mine = users_folder(tmp_path / "mine")
    before = tree(mine)
    for force in ([], ["--force"]):
        assert run(command, mine, tmp_path, *force) == 2
        line = error_line(capsys)
        assert "holds files duolm did not make (index.json, index.md, report.md)" in line, line
        assert "choose another --out" in line
        assert tree(mine) == before
    assert not list(tmp_path.glob("mine.replaced-*"))


@pytest.mark.parametrize("command", list(COMMANDS))
def test_another_job_kinds_folder_is_refused_without_force(command, tmp_path, capsys):
    kind = COMMANDS[command][0]
    other = "findings" if kind != "findings" else "compare job"
    out = users_folder(tmp_path / "job")
    mark_folder(out, other)
    before = tree(out)
    assert run(command, out, tmp_path) == 2
    line = error_line(capsys)
    assert "not a" in line and "--force" in line and "another --out" in line, line
    assert tree(out) == before and folder_kind(out) == other


@pytest.mark.parametrize(
    "marker",
    [
        {"kind": "nothing", "made_by": "duolm"},  # a kind duolm never made: no marker
        {"kind": "run", "made_by": "duolm"},  # a run: no job's folder, not moved by --force
        "link",  # a marker that is a link is no marker
    ],
)
def test_findings_and_compare_force_never_move_or_write_into_a_forged_or_foreign_folder(
    marker, tmp_path, capsys
):
    real = tmp_path / "real-marker.json"
    real.write_text(json.dumps({"kind": "findings", "made_by": "duolm"}))
    for command in ("findings", "compare"):
        out = users_folder(tmp_path / command)
        if marker == "link":
            (out / MARKER).symlink_to(real)
        else:
            (out / MARKER).write_text(json.dumps(marker))
        before = tree(out)
        assert run(command, out, tmp_path, "--force") == 2
        line = error_line(capsys)
        said = {"link": ".duolm is a symbolic link", "run": "moves aside only a job's folder"}
        case = marker if isinstance(marker, str) else marker["kind"]
        assert said.get(case, "did not make") in line, line
        assert tree(out) == before
        assert not list(tmp_path.glob(f"{command}.replaced-*"))


def test_findings_refuses_a_finding_folder_that_is_not_a_findings_job(tmp_path, capsys):
    out = tmp_path / "findings"
    out.mkdir()
    mark_folder(out, "findings")
    finding = users_folder(out / "reversal")
    (finding / MARKER).write_text('{"kind": "forged"}')
    before = tree(out)
    for force in ([], ["--force"]):
        assert run("findings", out, tmp_path, *force) == 2
        assert "reversal holds files duolm did not make" in error_line(capsys)
        assert tree(out) == before


def test_an_earlier_versions_findings_folder_is_named_and_left_as_it_is(tmp_path, capsys):
    out = users_folder(tmp_path / "findings-cpu")
    (out / "reversal").mkdir()
    mark_folder(out / "reversal", "findings job")  # its findings were marked, the folder not
    before = tree(out)
    assert run("findings", out, tmp_path) == 2
    line = error_line(capsys)
    assert "holds findings' folders (reversal)" in line and f"mv {out} {out}.old" in line
    assert tree(out) == before


# (command, the subfolder a received job folder holds as a link)
LINKED = [
    ("compare", "seed-0"),
    ("compare", "stages"),
    ("compare", "gen-length-8"),
    ("synthetic compare", "hmm"),
    ("sweep", "stages"),
    ("exact frontier", "stages"),
    ("findings", "reversal"),
    ("findings", "reversal/seed-0"),
]


@pytest.fixture
def reads_under():
    """A recorder of the files this process opens below a folder (``sys.addaudithook``: a hook
    stays for the process, so it records only while a folder is being watched)."""
    watched: list[Path] = []
    opened: list[str] = []

    def hook(event, args):
        if watched and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path.startswith(str(watched[0])):
                opened.append(path)

    if not hasattr(sys, "_duolm_job_hook"):
        sys.addaudithook(lambda event, args: sys._duolm_job_hook(event, args))
    sys._duolm_job_hook = hook

    def watch(folder: Path) -> list[str]:
        watched[:] = [folder]
        return opened

    yield watch
    watched.clear()
    sys._duolm_job_hook = lambda event, args: None


@pytest.mark.parametrize(("command", "linked"), LINKED)
def test_a_job_folder_holding_a_link_is_refused_before_anything_is_read(
    command, linked, tmp_path, capsys, reads_under
):
    kind = COMMANDS[command][0]
    out = tmp_path / "job"
    out.mkdir()
    mark_folder(out, kind)
    if "/" in linked:  # a link below a finding's folder
        (out / linked).parent.mkdir(parents=True)
        mark_folder(out / linked.split("/")[0], "findings job")
    outside = tmp_path / "outside"
    (outside / "stages").mkdir(parents=True)
    (outside / "stages" / "likelihood.json").write_text('{"result": "planted"}')
    (outside / "report.md").write_text("# outside\n")
    (out / linked).symlink_to(outside, target_is_directory=True)
    before, inside = tree(outside), tree(out)
    opened = reads_under(outside)
    for force in ([], ["--force"]):
        assert run(command, out, tmp_path, *force) == 2
        line = error_line(capsys)
        assert f"{out / linked} is a symbolic link (to {outside})" in line, line
        assert "a job folder holds its own files, never links" in line
    assert opened == []
    assert tree(outside) == before and tree(out) == inside


def test_reindex_refuses_a_findings_folder_holding_a_link(tmp_path, capsys):
    out, outside = tmp_path / "findings", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (outside / "result.json").write_text("{}")
    (out / "reversal").symlink_to(outside)
    assert findings.main(["--reindex", str(out)]) == 2
    assert "is a symbolic link" in error_line(capsys)
    assert not (out / "index.md").exists() and sorted(os.listdir(outside)) == ["result.json"]


def test_make_folders_makes_each_component_and_never_follows_a_link(tmp_path):
    root = tmp_path / "job"
    made = door.make_folders(root / "seed-0" / "stages", root)
    assert made.is_dir() and (root / "seed-0").is_dir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "hmm").symlink_to(outside)
    with pytest.raises(ConfigError, match="hmm is a symbolic link"):
        door.make_folders(root / "hmm" / "ar", root)
    (root / "notes").write_text("mine")
    with pytest.raises(ConfigError, match="notes is a file, not a folder"):
        door.make_folders(root / "notes" / "stages", root)
    assert list(outside.iterdir()) == [] and (root / "notes").read_text() == "mine"


def test_stages_read_and_write_only_inside_the_job_folder(tmp_path):
    job, outside = tmp_path / "job", tmp_path / "outside"
    (job / "gen-length-8").mkdir(parents=True)
    outside.mkdir()
    (outside / "likelihood.json").write_text(json.dumps({"result": "planted"}))
    (job / "gen-length-8" / "stages").symlink_to(outside)
    with pytest.raises(ConfigError, match="stages is a symbolic link"):
        stages.Stages(job / "gen-length-8", False, job=job)
    (job / "gen-length-8" / "stages").unlink()
    kept = stages.Stages(job / "gen-length-8", False, job=job)
    (kept.root / "likelihood.json").symlink_to(outside / "likelihood.json")
    # a stage file that is a link is not read (it would be reused as planted) nor written through
    with pytest.raises(ConfigError, match="symbolic link"):
        kept.run("likelihood", {"k": 1}, lambda: "computed")
    assert json.loads((outside / "likelihood.json").read_text()) == {"result": "planted"}


def test_a_claimed_folder_is_marked_and_an_own_folder_continues(tmp_path):
    out = tmp_path / "job"
    lock = job_folder.claim_job_folder(out, False, "sweep job")
    lock.release()
    assert folder_kind(out) == "sweep job"
    (out / "report.md").write_text("# the sweep's report\n")
    job_folder.claim_job_folder(out, False, "sweep job").release()  # a rerun continues
    with pytest.raises(ConfigError, match="holds a block-size sweep job, not a compare job"):
        job_folder.claim_job_folder(out, False, "compare job")
    assert (out / "report.md").read_text() == "# the sweep's report\n"


def test_force_moves_any_jobs_folder_aside_but_findings_keeps_its_own(tmp_path, capsys):
    sweep = users_folder(tmp_path / "sweep")
    mark_folder(sweep, "sweep job")
    job_folder.claim_job_folder(sweep, True, "compare job").release()
    aside = list(tmp_path.glob("sweep.replaced-*"))
    assert len(aside) == 1 and (aside[0] / "report.md").read_text() == "# my own report\n"
    assert folder_kind(sweep) == "compare job" and sorted(os.listdir(sweep)) == [MARKER, ".lock"]
    own = users_folder(tmp_path / "findings")
    mark_folder(own, "findings")
    job_folder.claim_job_folder(own, True, "findings", keep_own=True).release()
    assert (own / "index.md").is_file() and not list(tmp_path.glob("findings.replaced-*"))
    assert "moved the earlier job in" in capsys.readouterr().out
