"""The main job end to end on the smoke preset: every report section, reuse, --force, budgets."""

import json
import math
import re
import shutil

import pytest

from eval.experiments import compare, stages
from eval.speed.ratios import ratio_estimate
from eval.speed.throughput import PROBE_DISPATCH, PROBE_MATMUL


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    out = root / "smoke"
    args = ["--preset", "smoke", "--out", str(out), "--cache-dir", str(root / "cache")]
    assert compare.main(args) == 0
    return out, args


def forced(args):
    """The smoke job redone from scratch, shorter: 60 steps of seed 5 (budget points 15, 30, 60)."""
    return [*args, "--force", "--max-steps", "60", "--no-mauve", "--seed", "5"]


def finite_numbers(value, path="report"):
    """Every number inside a JSON value, with where it sits."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int | float):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from finite_numbers(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from finite_numbers(item, f"{path}[{i}]")


def test_smoke_report_has_every_section_with_finite_numbers(smoke):
    out, _ = smoke
    data = json.loads((out / "report.json").read_text())
    results = data["results"]
    for section in (
        "likelihood",
        "likelihood_raw",
        "generation",
        "quality",
        "examples",
        "training",
        "mdm_ar_perplexity_ratio",
        "wall_seconds",
    ):
        assert results[section] not in (None, {}, []), section
    for where, number in finite_numbers(results):
        assert math.isfinite(number), where
    quality = results["quality"]["sets"]
    assert set(quality) == set(results["generation"])
    assert "mauve" in quality["ar T=1"]
    assert all(q["judge_ppl"] > 1 for q in quality.values())
    nelbo = results["likelihood_raw"]["mdm"]["estimates"]["nelbo"]
    assert (
        nelbo["nats_per_token_ci95"][0] < nelbo["nats_per_token"] < nelbo["nats_per_token_ci95"][1]
    )
    assert results["examples"]["infill"]["mdm_middle"]
    markdown = (out / "report.md").read_text()
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown):
        assert (out / image).stat().st_size > 1000, image
    assert "frontier_nfe.png" in markdown and "frontier_entropy.png" in markdown
    assert data["provenance"]["versions"]["torch"]


def test_smoke_report_has_the_speed_quality_frontier_at_both_batch_sizes(smoke):
    out, _ = smoke
    data = json.loads((out / "report.json").read_text())
    frontier = data["results"]["speed_frontier"]
    timed = {(r["name"], r["batch_size"]) for r in frontier["throughput"]["records"]}
    settings = set(data["results"]["generation"]) - {"unigram model"}
    assert timed == {(name, batch) for name in settings for batch in (1, 4)}
    for record in frontier["throughput"]["records"]:
        speed = record["tokens_per_s"]
        # frontier_rounds=2 over three processes: one round each, pooled
        assert speed["low"] <= speed["median"] <= speed["high"] and record["rounds"] == 3
        assert record["round_tokens"] == [record["batch_size"] * 24] * 3  # every position
    # each process's run is kept: a ratio to the AR per process and setting
    assert len(frontier["throughput"]["processes"]) == 3
    for batch in (1, 4):
        for p in frontier[f"batch {batch}"]["points"]:
            assert len(p["speed_ratios"]) == 1 and len(p["speed_ratios"][0]) == 3, p["setting"]
            if p["setting"] == "ar T=1":
                assert p["speed_ratios"] == [[1.0, 1.0, 1.0]]
    # the host probes ran in the same rounds beside each batch size (eval.speed.throughput_runs)
    probes = {(r["name"], r["batch_size"]) for r in frontier["throughput"]["probes"]}
    assert probes == {(name, batch) for name in (PROBE_MATMUL, PROBE_DISPATCH) for batch in (1, 4)}
    # what was measured, so that eval.speed.throughput_runs can refuse a rerun of something else
    setup = frontier["throughput"]["setup"]
    assert setup["preset"] == "smoke" and setup["gen_length"] == 24 and setup["processes"] == 3
    assert set(setup["models"]) == {"ar", "mdm"} and setup["models"]["mdm"]["objective"] == "mdm"
    # held-out text's own entropy, not a placeholder: what low-entropy points are measured by
    assert data["results"]["quality"]["reference"]["unigram_entropy"] > 1.0
    markdown = (out / "report.md").read_text()
    assert "## Speed-quality frontier" in markdown
    for batch in (1, 4):
        entry = frontier[f"batch {batch}"]
        assert entry["front"] and set(entry["front"]) <= settings
        assert f"**Batch {batch}.**" in markdown and f"frontier_batch{batch}.png" in markdown
        assert (out / f"frontier_batch{batch}.png").stat().st_size > 1000


def test_smoke_report_has_budget_points_the_attention_line_and_the_floors(smoke):
    out, _ = smoke
    data = json.loads((out / "report.json").read_text())
    budgets = data["results"]["budgets"]
    points = budgets["points"]["0"]
    # smoke: the main budget of 150 steps and branches at 1/4 and 1/2 of it, per objective
    for name in ("ar", "mdm"):
        assert [p["steps"] for p in points[name]] == [38, 75, 150]
        assert all(math.isfinite(p["loss"]) and p["flops"] > 0 for p in points[name])
        branch = json.loads((out / "seed-0" / "budgets" / f"{name}-75" / "final.json").read_text())
        assert branch["schedule_history"] == [{"from_step": 0, "total_steps": 75}]
        assert branch["branched_from"].endswith("step_000060")
    assert budgets["attention"] == {"ar": "causal, full", "mdm": "bidirectional, full"}
    assert budgets["published_comparable"]
    markdown = (out / "report.md").read_text()
    first_line = markdown.split("\n\n")[1]
    assert first_line.startswith("**Attention.** AR: causal, full; MDM: bidirectional, full.")
    for figure in ("budget_frontiers.png", "multiplier_curve.png"):
        assert figure in markdown and (out / figure).stat().st_size > 1000
    assert "### Budget points" in markdown and "Rule, fixed before the run" in markdown
    assert "unigram model" in data["results"]["quality"]["sets"]


def test_matched_budget_both_models_saw_the_same_tokens(smoke):
    out, _ = smoke
    ar = json.loads((out / "seed-0" / "ar" / "final.json").read_text())
    mdm = json.loads((out / "seed-0" / "mdm" / "final.json").read_text())
    assert ar["tokens_seen"] == mdm["tokens_seen"] > 0
    assert ar["data"]["corpus_fingerprint"] == mdm["data"]["corpus_fingerprint"]
    assert ar["data"]["tokenizer"] == mdm["data"]["tokenizer"]
    flops_ar = ar["tokens_seen"] * ar["flops_per_token"]
    flops_mdm = mdm["tokens_seen"] * mdm["flops_per_token"]
    assert abs(flops_mdm - flops_ar) / flops_ar < 0.01


def test_another_generation_length_evaluates_the_same_models_beside_them(smoke, capsys):
    out, args = smoke
    checkpoint = sorted((out / "seed-0" / "ar" / "checkpoints").glob("step_*"))[-1]
    before = checkpoint.stat().st_mtime_ns, (out / "report.json").read_bytes()
    assert compare.main([*args, "--gen-length", "40", "--no-mauve"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("reusing the finished run") == 2  # nothing retrained
    folder = out / "gen-length-40"
    report = json.loads((folder / "report.json").read_text())
    assert report["config"]["settings"]["gen_length"] == 40
    # diffusion step counts are cut to the length only where they exceed it (24 <= 40)
    assert report["config"]["settings"]["diffusion_steps"] == [4, 24]
    frontier = report["results"]["speed_frontier"]
    assert frontier["throughput"]["setup"]["gen_length"] == 40
    for record in frontier["throughput"]["records"]:
        assert record["round_tokens"] == [record["batch_size"] * 40] * 3
    # the preset's length keeps its own stages and report, untouched
    assert (checkpoint.stat().st_mtime_ns, (out / "report.json").read_bytes()) == before
    assert (folder / "stages" / "throughput.json").is_file()


def test_a_generation_length_beyond_the_models_positions_is_one_line(tmp_path, capsys):
    out = tmp_path / "long"
    args = ["--preset", "smoke", "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    assert compare.main([*args, "--gen-length", "64"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.endswith(
        "--gen-length 64 does not fit the model: it has 64 positions, BOS takes one, so a "
        "sample holds at most 63 generated tokens"
    )
    assert len(error.splitlines()) == 1 and not out.exists()
    assert compare.main([*args, "--gen-length", "0"]) == 2
    assert "give at least 1 generated token" in capsys.readouterr().err
    # the masked model's cached samplers split the canvas into 4 equal blocks
    assert compare.main([*args, "--gen-length", "63"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "--gen-length 63: the masked model's cached samplers decode the canvas in 4 blocks of "
            "equal length, so the length must be a multiple of 4 (at most 60 for this model)"
        )
    )
    assert not out.exists()


def check_a_moved_copy_reuses_its_runs_branches_and_stages(smoke, tmp_path, capsys, monkeypatch):
    """The same job under another absolute path, given relative to another working folder,
    reuses every run, branch and stage: identity by content, not by spelling."""
    out, args = smoke
    moved = tmp_path / "elsewhere" / "job"
    shutil.copytree(out, moved, symlinks=True)
    monkeypatch.chdir(moved.parent)
    relative = [("job" if flag == str(out) else flag) for flag in args]

    def written():
        return {p: p.stat().st_mtime_ns for p in moved.rglob("*") if p.is_file()}

    before = written()
    assert compare.main(relative) == 0
    printed = capsys.readouterr().out
    assert printed.count("reusing the finished run") == 2
    assert printed.count("reusing the finished branch") == 4
    assert "reusing the stored result" in printed
    after = written()
    changed = sorted(str(p.relative_to(moved)) for p in after if before.get(p) != after[p])
    # only the report and its figures at the job's top are written again: no run, branch,
    # checkpoint or stage
    assert changed and all("/" not in name for name in changed), changed
    monkeypatch.chdir(tmp_path)


def test_rerun_reuses_every_stage_and_force_redoes_them(smoke, tmp_path, capsys, monkeypatch):
    out, args = smoke
    checkpoint = sorted((out / "seed-0" / "ar" / "checkpoints").glob("step_*"))[-1]
    before = checkpoint.stat().st_mtime_ns
    stage_times = {p.name: p.stat().st_mtime_ns for p in (out / "stages").glob("*.json")}
    assert compare.main(args) == 0
    printed = capsys.readouterr().out
    assert printed.count("reusing the finished run") == 2
    assert printed.count("reusing the finished branch") == 4
    assert printed.count("reusing the stored result") == len(stage_times)
    assert checkpoint.stat().st_mtime_ns == before
    assert {p.name: p.stat().st_mtime_ns for p in (out / "stages").glob("*.json")} == stage_times
    # a copy elsewhere, before the forced run below changes the job's seeds
    check_a_moved_copy_reuses_its_runs_branches_and_stages(smoke, tmp_path, capsys, monkeypatch)

    assert compare.main(forced(args)) == 0
    printed = capsys.readouterr().out
    assert "reusing" not in printed
    ar = json.loads((out / "seed-5" / "ar" / "final.json").read_text())
    assert ar["step"] == 60 and ar["total_steps"] == 60
    # the report records the training seed the runs used (train.py's --seed passes through)
    report = json.loads((out / "report.json").read_text())
    assert report["provenance"]["seeds"] == {"train": 5, "sampling": 0, "budget_seeds": [5]}


def test_a_third_family_trains_at_the_same_budget_points_and_has_every_row(smoke, capsys):
    out, args = smoke
    if not (out / "seed-5").is_dir():  # run alone: build the forced job the rerun test leaves
        assert compare.main(forced(args)) == 0
    capsys.readouterr()
    three = [flag for flag in forced(args) if flag != "--force"]
    assert compare.main([*three, "--objectives", "ar,mdm,udm"]) == 0
    printed = capsys.readouterr().out
    # the AR and MDM runs (trunks and branches) are the forced job's: only the UDM trains
    assert printed.count("reusing the finished run") == 2
    assert printed.count("reusing the finished branch") == 4
    assert "UDM" in printed and "(NELBO)" in printed
    data = json.loads((out / "report.json").read_text())
    results = data["results"]
    for where, number in finite_numbers(results):
        assert math.isfinite(number), where
    assert data["config"]["settings"]["objectives"] == ["ar", "mdm", "udm"]
    points = results["budgets"]["points"]["5"]
    assert list(points) == ["ar", "mdm", "udm"]
    assert {name: [p["steps"] for p in points[name]] for name in points} == {
        name: [15, 30, 60] for name in ("ar", "mdm", "udm")
    }
    training = results["training"]
    assert training["udm"]["tokens_seen"] == training["ar"]["tokens_seen"]
    rows = results["likelihood"]["Validation likelihood (same rows, same protocol)"]
    assert rows["UDM"]["kind"].startswith("nelbo") and rows["AR"]["kind"].startswith("exact")
    assert rows["UDM"]["tokens"] == rows["AR"]["tokens"] and rows["UDM"]["bits_per_byte"] > 0
    assert set(results["perplexity_ratios"]) == {"mdm", "udm"}
    assert set(results["budgets"]["analyses"]) == {"mdm", "udm"}
    sets = results["generation"]
    udm = {name for name in sets if name.startswith("udm")}
    assert udm == {
        "udm ancestral 4 steps",
        "udm greedy-tail 4 steps",
        "udm ancestral 24 steps",
        "udm greedy-tail 24 steps",
        "udm ancestral 24 steps T=0.8",
    }
    assert set(results["quality"]["sets"]) == set(sets)
    assert all(results["quality"]["sets"][name]["judge_ppl"] > 1 for name in udm)
    examples = results["examples"]
    assert all(item["udm"] for item in examples["side_by_side"])
    assert examples["infill"]["udm_middle"] and examples["udm_nfe"] == 24
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# AR vs diffusion (MDM, UDM): preset `smoke`")
    assert "M(L) = C_UDM(L) / C_AR(L)" in markdown and "| 5 | UDM | 60 |" in markdown
    assert "| UDM | nelbo" in markdown and "**UDM middle**" in markdown
    assert (out / "multiplier_curve_udm.png").stat().st_size > 1000


def test_flops_budget_gives_the_mdm_the_ar_flops(tmp_path):
    out = tmp_path / "flops"
    summaries = stages.train_both(
        "smoke",
        out,
        {"max_steps": 12, "cache_dir": str(tmp_path / "cache")},
        "flops",
        force=False,
    )
    ar, mdm = summaries["ar"], summaries["mdm"]
    spent_ar = ar["tokens_seen"] * ar["flops_per_token"]
    spent_mdm = mdm["tokens_seen"] * mdm["flops_per_token"]
    assert spent_mdm >= spent_ar and (spent_mdm - spent_ar) / spent_ar < 0.01


def test_tune_lr_sweeps_each_objective_and_trains_each_with_its_choice(tmp_path):
    out = tmp_path / "tuned"
    args = ["--preset", "smoke", "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    # 60 steps: the smoke budget points (15 and 30 steps) cool down after the 10-step warmup
    assert compare.main([*args, "--tune-lr", "--max-steps", "60", "--no-mauve"]) == 0
    tuning = json.loads((out / "report.json").read_text())["results"]["tuning"]
    assert tuning["budget"] == {"max_steps": 15}
    for objective in ("ar", "mdm"):
        table = tuning[objective]["table"]
        assert len(table) == 3 and [row["lr"] for row in table] == sorted(r["lr"] for r in table)
        finite = [row for row in table if not row["diverged"]]
        assert tuning[objective]["chosen"] == min(finite, key=lambda r: r["loss"])["lr"]
        trained = json.loads((out / "seed-0" / objective / "config.json").read_text())[
            "train_config"
        ]
        assert trained["lr"] == tuning[objective]["chosen"]
    assert "Learning-rate sweep" in (out / "report.md").read_text()


def test_two_seeds_are_each_sampled_judged_and_timed(tmp_path):
    out = tmp_path / "two"
    args = ["--preset", "smoke", "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    assert compare.main([*args, "--seeds", "0,1", "--max-steps", "60", "--no-mauve"]) == 0
    names = {p.name for p in (out / "stages").glob("*.json")}
    for stage in ("generate", "quality", "throughput"):
        assert {f"{stage}.json", f"{stage}-seed1.json"} <= names
    frontier = json.loads((out / "report.json").read_text())["results"]["speed_frontier"]
    for batch in ("batch 1", "batch 4"):
        section = frontier[batch]
        per_seed = section["per_seed"]["points"]
        assert set(per_seed) == {"0", "1"}
        # the frontier's points are the means of the two seeds' points
        for mean in section["points"]:
            speeds = [
                p["tokens_per_s"] for seed in per_seed.values() for p in seed
                if p["setting"] == mean["setting"]
            ]  # fmt: skip
            assert len(speeds) == 2
            assert mean["tokens_per_s"] == pytest.approx(sum(speeds) / 2)
        ratios = section["per_seed"]["headline_ratios"]
        if section["per_seed"]["headline_setting"] is None:
            assert "no setting qualifies" in section["headline"] and ratios == []
        else:
            low, high = ratio_estimate(ratios).interval
            assert len(ratios) == 2 and all(len(seed) == 3 for seed in ratios)
            assert f"[{low:.3g}, {high:.3g}] over 2 seeds" in section["headline"]
