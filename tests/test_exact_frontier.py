"""The exact frontier: the report runs end to end at the smoke scale with its positive controls at
0, total = sampler + model share, and the headline rule names a family only when its interval is
separated from every other family's."""

import json

import pytest

from eval.experiments import exact_frontier
from eval.experiments.exact_frontier import (
    PositiveControlFailed,
    check_positive_controls,
    main,
)
from eval.experiments.exact_frontier_setup import (
    HEADLINE_NFE,
    headline,
    is_positive_control,
    sampler_settings,
    spread_of,
)
from shared.data.synthetic.hmm import HMMLanguage


def row(family: str, values: list[float], nfe: float = HEADLINE_NFE, sampler: float = 0.1):
    return {
        "family": family,
        "setting": f"{family} setting",
        "nfe_per_token": nfe,
        "trained": spread_of(values),
        "sampler": {"mean": sampler},
    }


def test_headline_names_a_separated_family() -> None:
    rows = [
        row("mdm", [0.10, 0.11, 0.12], sampler=0.05),
        row("bd", [0.30, 0.31, 0.32]),
        row("udm", [0.50, 0.52, 0.51]),
        row("ar", [0.01, 0.01, 0.01], nfe=1.0),  # over the budget: not a candidate
    ]
    result = headline(rows)
    assert result["separated"] and result["family"] == "mdm"
    assert "closest family to the truth is MDM" in result["text"]
    assert "sampler's own TV (exact denoiser, same setting) is 0.05" in result["text"]


def test_headline_says_none_separated_when_intervals_overlap() -> None:
    rows = [row("mdm", [0.1, 0.3, 0.2]), row("bd", [0.25, 0.15, 0.35])]
    result = headline(rows)
    assert not result["separated"] and result["family"] is None
    assert "no family is separated" in result["text"]
    # one seed has no interval: never separated, however far apart the means
    single = headline([row("mdm", [0.01]), row("bd", [0.9])])
    assert not single["separated"]


def test_a_failed_positive_control_fails_loudly() -> None:
    controls = [s for s in sampler_settings() if is_positive_control(s)]
    assert {s.family for s in controls} == {"ar", "mdm", "bd"}
    errors = {s.name: {"kl_qp": 0.0, "kl_pq": 0.0, "tv": 0.0} for s in controls}
    assert len(check_positive_controls(errors)) == len(controls)
    errors[controls[1].name]["tv"] = 1e-6
    with pytest.raises(PositiveControlFailed, match="positive control failed"):
        check_positive_controls(errors)


def test_unknown_scale_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["--out", str(tmp_path / "out"), "--scale", "huge"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "scale='huge' is unknown" in err


@pytest.mark.slow
def test_smoke_report_end_to_end(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    out = tmp_path / "frontier"
    assert main(["--out", str(out), "--scale", "smoke"]) == 0
    report = json.loads((out / "report.json").read_text())["results"]
    assert (out / "report.md").read_text().count("**Headline.**") == 1
    assert (out / "exact_frontier.png").exists()
    assert all(abs(c["max_divergence"]) < 1e-9 for c in report["controls"])
    for r in report["rows"]:
        for metric in ("tv", "kl_pq"):
            sampler = r["sampler_error"][metric]
            for total, share in zip(r[f"total_{metric}"], r[f"model_share_{metric}"]):
                assert total == pytest.approx(sampler + share, abs=1e-12)
    assert report["headline"]["text"].startswith(f"At NFE per token <= {HEADLINE_NFE:g}")


def test_a_language_beyond_exact_mode_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    """The exact package's refusal reaches the command line as one line, exit 2."""
    monkeypatch.setenv("HOME", str(tmp_path))
    big = HMMLanguage(states=3, vocab=3, max_len=10)
    monkeypatch.setattr(exact_frontier, "language", lambda: big)
    assert main(["--out", str(tmp_path / "out"), "--scale", "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot hold the longest string" in err
