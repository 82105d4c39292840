"""bench/train_peers.py: the peers are our model (same parameters, same fp32 loss with our
weights copied in), the benchmark runs end to end, and its paired ratios are per round."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import peer_models  # noqa: E402
import train_peers  # noqa: E402

from shared.config import ModelConfig  # noqa: E402
from shared.model import Transformer  # noqa: E402
from shared.objective import build_objective  # noqa: E402
from shared.training.presets import get_preset  # noqa: E402

PAD = 299


def tiny_model(tie: bool) -> Transformer:
    shape = get_preset("tiny")["model"]  # grouped queries: 4 heads, 2 KV heads
    torch.manual_seed(0)
    return Transformer(ModelConfig(**shape, vocab_size=300, tie_embeddings=tie)).train()


def rows() -> torch.Tensor:
    tokens = torch.randint(0, PAD, (4, 32), generator=torch.Generator().manual_seed(1))
    tokens[:, 0] = 0  # BOS
    tokens[1, 20:] = PAD  # padding is not scored, by anyone
    return tokens


def our_loss(model: Transformer, tokens: torch.Tensor) -> float:
    out = build_objective("ar", pad_id=PAD).loss(model, tokens, {})
    return float(out.nats / out.n_tokens)


@pytest.mark.parametrize("tie", [False, True])
def test_hf_llama_is_our_model(tie):
    pytest.importorskip("transformers")
    model = tiny_model(tie)
    hf = peer_models.hf_llama(model)
    assert hf.config._attn_implementation == "sdpa"
    assert peer_models.parameter_count(hf) == model.num_parameters()
    with torch.no_grad():
        theirs = float(peer_models.hf_loss(PAD)(hf, rows()))
        assert abs(theirs - our_loss(model, rows())) < 1e-5


@pytest.mark.parametrize("tie", [False, True])
def test_litgpt_is_our_model_when_installed(tie):
    if peer_models.litgpt_modules()[0] is None:
        pytest.skip(peer_models.litgpt_modules()[1])
    model = tiny_model(tie)
    gpt = peer_models.litgpt_gpt(model)
    assert peer_models.parameter_count(gpt) == model.num_parameters()
    with torch.no_grad():
        theirs = float(peer_models.litgpt_loss(PAD)(gpt, rows()))
        assert abs(theirs - our_loss(model, rows())) < 1e-5


def test_benchmark_runs_end_to_end_and_writes_its_json(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DUOLM_PEAK_TFLOPS", raising=False)  # the bench measures its own peak
    out = tmp_path / "peers.json"
    args = ["--preset", "tiny", "--rounds", "1", "--warmup", "0", "--threads", "1"]
    assert train_peers.main([*args, "--precision", "both", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) == {"machine", "settings", "peak", "guard", "configurations", "ratios"}
    assert {"cpu", "cores", "threads", "torch", "transformers", "litgpt"} <= set(report["machine"])
    assert set(report["peak"]) == {"fp32", "bf16"} and report["peak"]["fp32"]["source"]
    configurations = report["configurations"]
    assert set(configurations) == {"ar", "mdm", "hf", "litgpt"}
    assert report["guard"]["hf"]["passed"]
    measured = {n: c for n, c in configurations.items() if c["status"] == "measured"}
    assert {"ar", "mdm", "hf"} <= set(measured)
    if "litgpt" not in measured:
        assert configurations["litgpt"]["status"] == "skipped"
        assert configurations["litgpt"]["reason"]
    tokens = {c["loss_tokens"] for c in measured.values()}
    assert len(tokens) == 1  # every configuration scores the same positions
    for entry in measured.values():
        for precision in ("fp32", "bf16"):
            result = entry["results"][precision]
            assert result["tokens_per_s_median"] > 0 and 0 < result["mfu_median"]
            assert len(result["step_seconds"]) == 1
    assert {"ar/hf", "mdm/hf", "mdm/ar"} <= set(report["ratios"]["bf16"])
    printed = capsys.readouterr().out
    assert "guard hf:" in printed and "measured matmul" in printed


def test_block_diffusion_is_timed_when_asked_with_two_streams_of_flops(tmp_path):
    out = tmp_path / "peers.json"
    args = ["--preset", "tiny", "--rounds", "1", "--warmup", "0", "--threads", "1"]
    assert train_peers.main([*args, "--only", "ar,bd", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    configurations = report["configurations"]
    assert set(configurations) == {"ar", "bd"}
    assert configurations["bd"]["status"] == "measured"
    # the noisy and the clean stream: twice the rows through the network, over twice the context
    assert configurations["bd"]["flops_per_token"] > 2 * configurations["ar"]["flops_per_token"]
    assert set(report["ratios"]["bf16"]) == {"bd/ar"}


def test_litgpt_that_cannot_be_imported_is_skipped_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(train_peers, "litgpt_modules", lambda: (None, "no litgpt here"))
    out = tmp_path / "peers.json"
    args = ["--preset", "tiny", "--rounds", "1", "--warmup", "0", "--threads", "1"]
    only = ["--precision", "fp32", "--only", "ar,litgpt"]
    assert train_peers.main([*args, *only, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    litgpt = report["configurations"]["litgpt"]
    assert litgpt == {"label": "litgpt GPT", "status": "skipped", "reason": "no litgpt here"}
    assert report["machine"]["litgpt"] == "absent"
    assert report["ratios"]["fp32"] == {}  # nothing to pair the AR with


def test_paired_ratios_are_taken_round_by_round():
    ours = [100.0, 50.0, 300.0]
    peer = [50.0, 100.0, 100.0]
    ratios = train_peers.paired_ratios(ours, peer)
    assert ratios["per_round"] == [2.0, 0.5, 3.0]
    assert (ratios["median"], ratios["min"], ratios["max"]) == (2.0, 0.5, 3.0)
    # the ratio of medians (100 / 100 = 1) is not what is reported
    with pytest.raises(ValueError):
        train_peers.paired_ratios([1.0], [1.0, 2.0])


def test_summary_arithmetic():
    summary = train_peers.summarise([0.5, 0.25, 1.0], tokens=100, flops=10.0, peak=1000.0)
    assert summary["tokens_per_s_per_round"] == [200.0, 400.0, 100.0]
    assert summary["tokens_per_s_median"] == 200.0 and summary["tokens_per_s_min"] == 100.0
    assert summary["mfu_median"] == pytest.approx(200.0 * 10.0 / 1000.0)
