"""bench/cuda_checks.py: runs its checks, skips what needs CUDA with the reason, fails loudly."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import cuda_checks  # noqa: E402


def test_checks_run_here_and_cuda_only_ones_say_why_they_skip(tmp_path, capsys):
    code = cuda_checks.main(
        ["--quick", "--out", str(tmp_path), "--only", "bf16,flash,fsdp,train,decode"]
    )
    report = json.loads((tmp_path / "checks.json").read_text())
    checks = report["checks"]
    assert code == 0, checks
    assert checks["decode"]["status"] == "PASS"  # cached greedy == recomputed prefix
    assert checks["train"]["status"] == "PASS"
    assert checks["train"]["last_loss"] < checks["train"]["first_loss"]
    for name in ("bf16", "flash", "fsdp"):
        if torch.cuda.is_available():
            assert checks[name]["status"] == "PASS", checks[name]
        else:
            assert checks[name]["status"] == "SKIP" and checks[name]["reason"]
    assert report["machine"]["torch"] == torch.__version__
    printed = capsys.readouterr().out
    assert "PASS decode" in printed


def test_a_crashing_check_is_reported_as_failed(tmp_path, monkeypatch):
    def broken(device, quick, out):
        raise RuntimeError("deliberately broken")

    monkeypatch.setitem(cuda_checks.CHECKS, "decode", broken)
    assert cuda_checks.main(["--quick", "--out", str(tmp_path), "--only", "decode"]) == 1
    result = json.loads((tmp_path / "checks.json").read_text())["checks"]["decode"]
    assert result["status"] == "FAIL" and "deliberately broken" in result["error"]
    assert cuda_checks.main(["--only", "nonsense", "--out", str(tmp_path)]) == 2


def test_the_flex_and_peer_checks_run_in_quick_mode(tmp_path):
    """On a CPU the quick flex check compares the eager flex path with SDPA on a tiny model, for
    block diffusion and for a sliding window; the peer check runs the peer benchmark once (the
    GPU numbers come from a full run on CUDA)."""
    code = cuda_checks.main(["--quick", "--out", str(tmp_path), "--only", "flex,peers"])
    checks = json.loads((tmp_path / "checks.json").read_text())["checks"]
    assert code == 0, checks
    assert checks["flex"]["status"] == "PASS"
    for case in ("block_diffusion", "sliding_window"):
        losses = checks["flex"][case]["losses"]
        assert abs(losses["flex"] - losses["sdpa"]) < 1e-4 * abs(losses["sdpa"])
    assert checks["peers"]["status"] == "PASS" and "fp32" in checks["peers"]["results"]
