"""``compare --objectives``: which families a comparison trains. Refused lists (an unknown or
repeated family, no AR to measure M(L) against, no diffusion family) are one line, exit 2 and
write nothing; each family gets the samplers that fit it; the budget prose reads M(L) of every
diffusion family against AR. The three-family job itself runs in test_compare.py."""

from pathlib import Path

import pytest

from dllm.sampler import SamplerConfig
from dllm.uniform.sampler import UniformSamplerConfig
from eval.experiments import compare
from eval.experiments.compare_budgets import family_analyses
from eval.experiments.compare_curves import budgets_section
from eval.experiments.compare_samples import diffusion_sampler_configs
from eval.experiments.compare_settings import (
    CompareSettings,
    headline_sets,
    objectives_asked,
)
from eval.report import Report


def smoke(out: Path, *extra: str) -> list[str]:
    return ["--preset", "smoke", "--out", str(out), "--no-mauve", "--max-steps", "2", *extra]


@pytest.mark.parametrize(
    ("objectives", "said"),
    [
        ("ar,mdm,xdm", "unknown objective 'xdm'"),
        ("ar,mdm,mdm", "names mdm more than once"),
        ("mdm,udm", "has no ar"),
        ("ar", "no diffusion family"),
    ],
)
def test_a_refused_objectives_list_is_one_line_and_writes_nothing(
    tmp_path, capsys, objectives, said
):
    out = tmp_path / "job"
    assert compare.main(smoke(out, "--objectives", objectives)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert said in lines[0] and "--objectives" in lines[0]
    assert not out.exists()


def test_objectives_put_ar_first_and_keep_the_families_order():
    assert objectives_asked("udm,ar,mdm") == ("ar", "udm", "mdm")
    assert objectives_asked("ar,bd") == ("ar", "bd")
    settings = CompareSettings(diffusion_steps=(4, 8), objectives=("ar", "udm", "mdm"))
    assert headline_sets(settings) == ("ar T=1", "udm ancestral 8 steps", "mdm ancestral 8 steps")


def test_udm_gets_ancestral_and_greedy_tail_only_and_masked_families_keep_theirs():
    settings = CompareSettings(diffusion_steps=(4, 8, 16), temperatures=(0.7, 1.0))
    udm = diffusion_sampler_configs(settings, "udm")
    assert [name for name, *_ in udm] == [
        "udm ancestral 4 steps",
        "udm greedy-tail 4 steps",
        "udm ancestral 8 steps",
        "udm greedy-tail 8 steps",
        "udm ancestral 16 steps",
        "udm greedy-tail 16 steps",
        "udm ancestral 8 steps T=0.7",
    ]
    assert all(isinstance(config, UniformSamplerConfig) for _, config, *_ in udm)
    assert [config.greedy_tail for _, config, *_ in udm] == [False, True] * 3 + [False]
    assert udm[-1][1].sampling.temperature == 0.7 and udm[-1][2] == 0.7
    bd = diffusion_sampler_configs(settings, "bd")
    mdm = diffusion_sampler_configs(settings, "mdm")
    # the MDM alone adds Fast-dLLM's cached recipes (block diffusion has its own block cache)
    cached = [entry for entry in mdm if entry[1].cache != "none"]
    # and ReMDM's loop at every step count, beside its ancestral
    assert [name for name, *_ in bd] == [
        name.replace("mdm", "bd") for name, *_ in mdm if "cache" not in name and "remdm" not in name
    ]
    loops = [(name, config.strategy) for name, config, *_ in mdm if "remdm" in name]
    assert [name for name, _ in loops] == [f"mdm remdm loop {s} steps" for s in (4, 8, 16)]
    assert all(r.mode == "loop" and r.eta == 0.02 and r.t_on == 0.55 for _, r in loops)
    assert [(config.cache, config.block_length) for _, config, *_ in cached] == [
        ("approx_prefix", settings.gen_length // 4),
        ("approx_dual", settings.gen_length // 4),
        ("approx_dual", settings.gen_length // 4),
    ]
    assert all("(approx.)" in name and "approx." in label for name, _, _, label in cached)
    assert cached[-1][1].strategy.steps == settings.gen_length
    assert "bd threshold 0.9" in [name for name, *_ in bd]
    assert {"mdm eb 0.1", "bd eb 0.1"} <= {name for name, *_ in bd + mdm}
    assert "udm eb 0.1" not in [name for name, *_ in diffusion_sampler_configs(settings, "udm")]
    assert all(isinstance(config, SamplerConfig) for _, config, *_ in bd)


def budget_run(frontiers: dict[str, list[tuple[float, float]]]) -> dict:
    return {
        "points": {
            name: [
                {"flops": c, "loss": loss, "loss_se": None, "bpb": loss / 5, "steps": 10 * (i + 1)}
                for i, (c, loss) in enumerate(frontier)
            ]
            for name, frontier in frontiers.items()
        }
    }


def test_the_budget_prose_reads_m_of_l_of_every_family_against_ar(tmp_path):
    pytest.importorskip("matplotlib")
    ar = [(1e10, 4.0), (2e10, 3.6), (4e10, 3.3), (8e10, 3.1)]
    # the MDM needs 4x the AR's compute for each loss, the UDM 8x
    mdm = [(4 * c, loss) for c, loss in ar]
    udm = [(8 * c, loss) for c, loss in ar]
    runs = {0: budget_run({"ar": ar, "mdm": mdm, "udm": udm})}
    settings = CompareSettings(objectives=("ar", "mdm", "udm"))
    analyses = family_analyses(runs, 5.2, settings)
    assert analyses["mdm"]["seeds"][0]["multiplier"] == pytest.approx(4.0)
    assert analyses["udm"]["seeds"][0]["multiplier"] == pytest.approx(8.0)
    report = Report("budgets", tmp_path)
    kept = budgets_section(report, runs, analyses["mdm"], 5.2, False, "", analyses)
    prose = [block for kind, block in report.blocks if kind == "text"]
    assert prose[0].startswith("**Compute multiplier over budgets, MDM against AR.** Each")
    assert prose[1].startswith("**Compute multiplier over budgets, UDM against AR.** M(L)")
    assert "C_UDM(L) / C_AR(L)" in prose[1] and "the UDM's validation loss" in prose[1]
    assert "Published: none for the UDM" in prose[1] and "16x" in prose[0]
    titles = [block.title for kind, block in report.blocks if kind == "table"]
    assert titles[-2:] == [
        "M(L) per seed at evenly spaced losses of each seed's shared range (MDM against AR)",
        "M(L) per seed at evenly spaced losses of each seed's shared range (UDM against AR)",
    ]
    points = next(block for kind, block in report.blocks if kind == "table")
    assert [row[1] for row in points.rows] == ["AR"] * 4 + ["MDM"] * 4 + ["UDM"] * 4
    assert points.note.startswith("MDM, UDM: NELBO")
    assert (tmp_path / "multiplier_curve_udm.png").is_file()
    assert kept["analysis"] is analyses["mdm"] and kept["analyses"] is analyses
