"""bench/peer_samplers.py, bench/peer_cases.py and bench/peer_adapters.py: the pure helpers;
given a Fast-dLLM folder (DUOLM_FAST_DLLM), token identity of our masked-diffusion samplers with
Fast-dLLM's generate functions on the same weights; given a Duo clone (DUOLM_DUO), Duo's step
against ours."""

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import peer_adapters  # noqa: E402
import peer_cases  # noqa: E402
import peer_checks  # noqa: E402
import peer_samplers  # noqa: E402

from dllm.strategies import FixedCount, Threshold  # noqa: E402
from eval.speed.throughput import Record, Spread  # noqa: E402
from shared.config import ModelConfig  # noqa: E402
from shared.formats.diffusion import llada_config_fields  # noqa: E402
from shared.model import Transformer  # noqa: E402

FAST_DLLM = os.environ.get("DUOLM_FAST_DLLM")
NEEDS_FAST_DLLM = pytest.mark.skipif(
    not FAST_DLLM,
    reason="set DUOLM_FAST_DLLM to a folder holding Fast-dLLM's llada/ (NVlabs/Fast-dLLM: "
    "llada/generate.py and llada/model/) to compare its samplers with ours token for token",
)
BD3LMS = os.environ.get("DUOLM_BD3LMS")
NEEDS_BD3LMS = pytest.mark.skipif(
    not BD3LMS,
    reason="set DUOLM_BD3LMS to a clone of kuleshov-group/bd3lms (diffusion.py, "
    "noise_schedule.py) to compare its block sampler with ours",
)
DUO = os.environ.get("DUOLM_DUO")
NEEDS_DUO = pytest.mark.skipif(
    not DUO,
    reason="set DUOLM_DUO to a clone of s-sahoo/duo (trainer_base.py, algo.py) to compare its "
    "sampling step with ours",
)


def record(name: str, tokens: list[int], seconds: list[float]) -> Record:
    rates = [n / t for n, t in zip(tokens, seconds)]
    return Record(name, 1, len(tokens), 0, Spread.of(rates), Spread.of(seconds), seconds, tokens,
                  list(range(len(tokens))))  # fmt: skip


def test_paired_ratio_divides_round_by_round():
    ours = record("ours", [64, 64, 64], [1.0, 2.0, 4.0])
    theirs = record("theirs", [64, 64, 64], [2.0, 2.0, 2.0])
    ratio = peer_samplers.paired_ratio(ours, theirs)
    assert (ratio.median, ratio.low, ratio.high) == (1.0, 0.5, 2.0)
    with pytest.raises(ValueError, match="ran 3 rounds"):
        peer_samplers.paired_ratio(ours, record("short", [64], [1.0]))


def test_first_difference():
    a = torch.tensor([[1, 2, 3, 4]])
    assert peer_checks.first_difference(a, a.clone()) is None
    assert peer_checks.first_difference(a, torch.tensor([[1, 2, 9, 9]])) == 2
    with pytest.raises(ValueError, match="shapes differ"):
        peer_checks.first_difference(a, a[:, :3])


def test_cases_map_onto_the_same_rule_and_cache_on_both_sides():
    for case in peer_cases.CASES:
        ours = peer_cases.our_sampler(case, steps=8, block_length=4, threshold=0.5)
        theirs = peer_cases.fast_dllm_kwargs(case, 8, 16, 4, 0.5, mask_id=99)
        assert ours.cache == case.cache and ours.sampling.temperature == 0.0
        assert theirs["temperature"] == 0.0 and theirs["mask_id"] == 99
        if case.rule == "fixed":  # LLaDA's split, float64 confidence: Fast-dLLM's
            assert ours.strategy == FixedCount(8, split="front", confidence="float64")
            assert theirs["threshold"] is None
        else:
            assert ours.strategy == Threshold(0.5) and theirs["threshold"] == 0.5
    assert {c.cache for c in peer_cases.CASES} == set(peer_cases.FAST_DLLM_FUNCTIONS)


def test_shapes_are_valid_and_export_to_llada():
    for name, shape in peer_cases.SHAPES.items():
        config = ModelConfig(**shape).validate()
        fields = llada_config_fields(config, config.vocab_size, 0, 0)  # raises if not LLaDA's
        assert fields["n_layers"] == config.n_layers, name
    small = ModelConfig(**peer_cases.SHAPES["135m"])
    assert (small.dim, small.n_layers, small.n_kv_heads, small.tie_embeddings) == (576, 30, 3, True)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch", "2", "--fast-dllm", "x"], "only --batch 1"),
        (["--batch", "2", "--bd3lms", "x"], "only --batch 1 compares with it"),
        (["--batch", "0"], "--batch 0 must be >= 1"),
        (["--duo", "x", "--steps", "1", "--block-length", "64"], "needs at least 2"),
        (["--gen-length", "20", "--block-length", "16"], "must divide --gen-length 20"),
        (["--steps", "6"], "multiple of the number of blocks (4)"),
        (["--threshold", "0"], "must be in (0, 1]"),
        (["--gen-length", "128"], "more than the demo shape's max_seq_len=128"),
        (["--rounds", "0"], "--rounds 0 must be >= 1"),
    ],
)
def test_bad_settings_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        peer_samplers.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_absent_peers_are_skipped_with_the_reason(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert peer_samplers.main(["--json", str(out)]) == 0
    text = capsys.readouterr().out
    for peer in ("fast-dllm", "duo", "bd3lms", "remdm"):
        assert f"- {peer}: skipped: no --{peer} PATH given" in text
    assert json.loads(out.read_text())["rows"] == []


@pytest.mark.parametrize("flag", ["--fast-dllm", "--duo", "--bd3lms"])
def test_a_peer_folder_without_its_files_is_named(flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        peer_samplers.main([flag, str(tmp_path), "--check-only"])
    assert exit_.value.code == 2
    assert f"{flag} {tmp_path}: expected" in capsys.readouterr().err


def test_peer_imports_leave_no_generic_module_names(tmp_path):
    (tmp_path / "utils.py").write_text("import dataloader\nVALUE = dataloader.__name__\n")
    stand_in = peer_adapters.stand_in("dataloader")
    with peer_adapters.peer_imports(tmp_path, {"dataloader": stand_in}):
        import utils

    assert utils.VALUE == "dataloader"
    assert "utils" not in sys.modules and "dataloader" not in sys.modules
    assert str(tmp_path) not in sys.path


def confident_mdm(tied: bool = False) -> Transformer:
    """A small random MDM with large weights (N(0, 0.5) matrices): its predictions are peaked, so
    several positions pass a 0.5 threshold in one step and the approximate caches change tokens
    (checked below), which a default-initialised model, predicting almost uniformly, never does."""
    return peer_checks.peaked_model(33, 64, tie_embeddings=tied)


SETTINGS = ["--gen-length", "18", "--block-length", "6", "--steps", "12", "--threshold", "0.5"]


def fast_dllm_checks(argv: list[str]) -> list[dict]:
    fast_dllm = peer_adapters.load_fast_dllm(FAST_DLLM)
    args = peer_samplers.parse_args(["--fast-dllm", FAST_DLLM, "--prompt-length", "5", *argv])
    pairs = peer_cases.fast_dllm_pairs(args, confident_mdm(), fast_dllm)
    return [{"case": pair.case, **pair.check()} for pair in pairs]


def test_the_identity_settings_exercise_parallel_reveals_and_stale_caches():
    model = confident_mdm()
    generator = peer_cases.DiffusionGenerator(model, eos_id=0)
    prompt = peer_cases.random_prompt(5, 32)
    canvas = generator.prompt_canvas([prompt], 18)
    results = {
        case: generator.fill(canvas, peer_cases.our_sampler(case, 12, 6, 0.5), eos="none").raw
        for case in peer_cases.CASES
    }
    exact = {c.rule: r.generated for c, r in results.items() if c.cache == "none"}
    assert any(r.revealed.max() >= 3 for c, r in results.items() if c.rule == "threshold")
    assert any(not torch.equal(r.generated, exact[c.rule]) for c, r in results.items())


@NEEDS_FAST_DLLM
@pytest.mark.numerics
def test_fast_dllm_gives_our_tokens_in_every_case():
    """Blocks of 6 in 4 steps (LLaDA's 2, 2, 1, 1 split), a threshold several positions pass at
    once, with and without the approximate caches (whose tokens differ from the exact ones)."""
    rows = fast_dllm_checks(SETTINGS)
    assert len(rows) == 6
    assert all(row["passed"] for row in rows), rows


@NEEDS_FAST_DLLM
@pytest.mark.numerics
def test_the_identity_check_sees_a_different_split(monkeypatch):
    """Our rounded split (2, 1, 2, 1) instead of LLaDA's: the fixed cases no longer match."""
    build = peer_cases.our_sampler

    def rounded(*args):
        config = build(*args)
        if isinstance(config.strategy, FixedCount):
            return dataclasses.replace(config, strategy=FixedCount(config.strategy.steps))
        return config

    monkeypatch.setattr(peer_cases, "our_sampler", rounded)
    rows = fast_dllm_checks(SETTINGS)
    assert not any(row["passed"] for row in rows if row["case"].startswith("fixed"))


@NEEDS_FAST_DLLM
@pytest.mark.numerics
def test_a_tied_model_loads_into_llada_with_our_logits():
    """The 135m shape ties its embeddings: LLaDA's tied head is its embedding."""
    model = confident_mdm(tied=True)
    fast_dllm = peer_adapters.load_fast_dllm(FAST_DLLM)
    peer = peer_adapters.llada_peer(fast_dllm, model, eos_id=0)
    tokens = torch.randint(0, 33, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(tokens, attention="bidirectional")
        theirs = peer(tokens).logits
    assert (ours - theirs).abs().max() < 1e-4


def tiny_udm() -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=17, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                         hidden_dim=64, max_seq_len=64, time_conditioning=True)  # fmt: skip
    return Transformer(config).eval()


@NEEDS_DUO
@pytest.mark.numerics
def test_duo_step_is_ours_and_the_check_sees_a_wrong_time(monkeypatch):
    model = tiny_udm()
    network = peer_adapters.DuoNetwork(model, pad_id=16)
    sampler = peer_adapters.duo_sampler(peer_adapters.load_duo(DUO), network, length=10)
    assert peer_checks.posterior_gap(sampler, network, 10, batch=2, steps=6) < 1e-12
    ours = peer_checks.posterior
    monkeypatch.setattr(peer_checks, "posterior", lambda x, z, t, s: ours(x, z, t, s / 2))
    assert peer_checks.posterior_gap(sampler, network, 10, batch=2, steps=6) > 1e-3


@NEEDS_DUO
def test_duo_sampler_runs_unchanged_on_our_model():
    """Its whole loop: the prior over the support, its ancestral steps, the greedy last step."""
    model = tiny_udm()
    network = peer_adapters.DuoNetwork(model, pad_id=16)
    sampler = peer_adapters.duo_sampler(peer_adapters.load_duo(DUO), network, length=10)
    tokens = sampler.generate_samples(3, num_steps=4)
    assert tokens.shape == (3, 10) and 0 <= int(tokens.min()) and int(tokens.max()) < 16


@NEEDS_FAST_DLLM
@NEEDS_DUO
@NEEDS_BD3LMS
def test_one_short_run_writes_every_peer_with_its_ratio(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(peer_checks, "FIRST_HITTING_SAMPLES", 200)
    out = tmp_path / "report.json"
    argv = ["--fast-dllm", FAST_DLLM, "--duo", DUO, "--bd3lms", BD3LMS, "--gen-length", "8",
            "--block-length", "8", "--steps", "4", "--prompt-length", "2", "--rounds", "1",
            "--warmup", "0", "--device", "cpu", "--json", str(out)]  # fmt: skip
    assert peer_samplers.main(argv) == 0
    report = json.loads(out.read_text())
    peers = ["fast-dllm"] * 6 + ["duo"] * 2 + ["bd3lms"] * 2  # Duo: ancestral, then Psi
    assert [row["peer"] for row in report["rows"]] == peers
    assert all(row["passed"] and row["ratio"]["median"] > 0 for row in report["rows"])
    assert report["rows"][0]["ours"]["round_tokens"] == [8]
    assert report["rows"][6]["theirs"]["round_tokens"] == [9]  # Duo generates BOS's slot too
    assert report["rows"][7]["theirs"]["round_tokens"] == [8]  # the Psi case counts only G
    assert report["rows"][-1]["ours"]["round_tokens"] == [7]  # bd3lms's BOS is in block 0
    assert report["rows"][-1]["theirs"]["round_tokens"] == [7]
    assert set(report["sources"]) == {"fast-dllm", "duo", "bd3lms"}
    assert "| duo | ancestral 4 NFE, greedy tail |" in capsys.readouterr().out


# ---------------------------------------------------------------- bd3lms


def left_to_right_distribution(model, row, block_size):
    """The distribution if positions were revealed left to right (not first hitting's order)."""
    mask_id = model.config.vocab_size - 1
    if mask_id not in row:
        return {tuple(row): 1.0}
    i = row.index(mask_id)
    with torch.no_grad():
        probs = peer_checks.block_probabilities(model, torch.tensor(row), block_size)[i]
    result = {}
    for token, p in enumerate(probs.tolist()):
        filled = row[:i] + [token] + row[i + 1 :]
        for final, q in left_to_right_distribution(model, filled, block_size).items():
            result[final] = result.get(final, 0.0) + p * q
    return result


def test_first_hitting_distribution_by_hand():
    model = peer_checks.tiny_bd_model()
    exact = peer_checks.first_hitting_distribution(model, [0, 4, 4, 4], 4)
    assert len(exact) == 4**3 and abs(sum(exact.values()) - 1) < 1e-12
    # one masked position: its p(x0)
    with torch.no_grad():
        p = peer_checks.block_probabilities(model, torch.tensor([0, 2, 4, 1]), 4)[2]
    one = peer_checks.first_hitting_distribution(model, [0, 2, 4, 1], 4)
    assert all(abs(one[(0, 2, t, 1)] - float(p[t])) < 1e-15 for t in range(4))
    # two masked positions: half each order
    with torch.no_grad():
        p1 = peer_checks.block_probabilities(model, torch.tensor([0, 4, 4, 1]), 4)
        p1_after = peer_checks.block_probabilities(model, torch.tensor([0, 3, 4, 1]), 4)[2]
        p2_after = peer_checks.block_probabilities(model, torch.tensor([0, 4, 0, 1]), 4)[1]
    want = 0.5 * p1[1, 3] * p1_after[0] + 0.5 * p1[2, 0] * p2_after[3]
    two = peer_checks.first_hitting_distribution(model, [0, 4, 4, 1], 4)
    assert abs(two[(0, 3, 0, 1)] - float(want)) < 1e-15
    # the order matters on this model, so the check can tell the orders apart
    wrong = left_to_right_distribution(model, [0, 4, 4, 4], 4)
    assert sum(abs(exact[k] - wrong[k]) for k in exact) / 2 > 0.3


def test_chi_square_p():
    exact = {("a",): 0.5, ("b",): 0.3, ("c",): 0.199, ("d",): 0.001}
    assert peer_checks.chi_square_p({("a",): 500, ("b",): 300, ("c",): 200}, exact) > 0.5
    assert peer_checks.chi_square_p({("a",): 1000}, exact) < 1e-9
    assert peer_checks.chi_square_p({("a",): 999, ("z",): 1}, exact) == 0.0


@NEEDS_BD3LMS
@pytest.mark.numerics
def test_bd3lms_sampler_runs_unchanged_and_fills_every_block():
    model = peer_checks.tiny_bd_model()
    sampler = peer_adapters.bd3lms_sampler(peer_adapters.load_bd3lms(BD3LMS), model, 4)
    with torch.no_grad():
        tokens, nfe = sampler._semi_ar_sampler(1, 4, 3, 12)
    assert tokens.shape == (1, 12) and tokens[0, 0] == 0 and not (tokens == 4).any()
    assert nfe == 11  # one network evaluation per token (first hitting)


@NEEDS_BD3LMS
@pytest.mark.numerics
def test_bd3lms_and_ours_draw_first_hitting_and_the_check_sees_another_order(monkeypatch):
    bd3lms = peer_adapters.load_bd3lms(BD3LMS)
    result = peer_checks.first_hitting_check(bd3lms)
    assert min(result["p_theirs"], result["p_ours"]) >= peer_checks.CHECK_P_VALUE
    monkeypatch.setattr(peer_checks, "first_hitting_distribution", left_to_right_distribution)
    result = peer_checks.first_hitting_check(bd3lms, samples=500)
    assert max(result["p_theirs"], result["p_ours"]) < 1e-6
