"""The ``duolm`` console command: every subcommand reaches its module, and ``sample`` picks the
sampler from the checkpoint's objective."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eval import cli

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tiny_mdm_run"


def test_usage_lists_every_command(capsys):
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0
    usage = capsys.readouterr().out
    assert all(name in usage for name in cli.COMMANDS)
    assert cli.main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_command_has_its_help(command, capsys):
    try:
        code = cli.main([command, "--help"])
    except SystemExit as done:  # argparse's --help
        code = done.code
    assert code == 0
    assert "usage:" in capsys.readouterr().out


def test_sample_dispatches_on_the_checkpoint_objective(capsys):
    assert cli.main(["sample", str(FIXTURE), "--gen-length", "8", "--steps", "4"]) == 0
    assert cli.main(["sample", "/nonexistent/run"]) == 2
    assert "error:" in capsys.readouterr().err


def test_the_console_script_is_installed():
    script = shutil.which("duolm", path=str(Path(sys.executable).parent))
    assert script, "pip install -e . installs the duolm command"
    done = subprocess.run([script, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "compare" in done.stdout
