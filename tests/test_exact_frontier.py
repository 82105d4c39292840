"""The exact frontier: the report runs end to end at the smoke scale with its positive controls at
0, its three distances consistent (TV's triangle inequality) and strict JSON; the headline rule
names a family only when its interval is separated from every other family's, and is read only
on the full-support language."""

import json

import pytest

from eval.experiments import exact_frontier
from eval.experiments.exact_frontier import (
    PositiveControlFailed,
    check_positive_controls,
    main,
)
from eval.experiments.exact_frontier_correctors import VERDICTS
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
        "to_exact": spread_of([v / 2 for v in values]),
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
    text = result["text"]
    assert "the same sampler with the exact denoiser is at TV 0.05 from the language" in text
    assert "at TV 0.055 [95% t-interval" in text and "from that exact-denoiser output" in text
    # three distances side by side, none worded as a part of another
    assert "of which" not in text and "share" not in text


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
    assert {s.family for s in controls} == {"ar", "mdm", "bd", "eso"}
    zero = {"kl_qp": 0.0, "kl_pq": 0.0, "tv": 0.0}
    errors = {s.name: {"uniform": dict(zero), "prefix": dict(zero)} for s in controls}
    assert len(check_positive_controls(errors)) == 2 * len(controls)
    errors[controls[1].name]["prefix"]["tv"] = 1e-6
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
    text = (out / "report.json").read_text()
    report = json.loads(text, parse_constant=refuse_constant)["results"]  # strict JSON
    assert (out / "report.md").read_text().count("**Headline") == 1
    assert (out / "exact_frontier.png").exists()
    assert report["headline"]["language"] == "fixed"
    for measured in report["languages"].values():
        assert all(abs(c["max_divergence"]) < 1e-9 for c in measured["controls"])
        for r in measured["rows"]:
            for oracle, exact in r["exact_denoiser"].items():
                to_exact = r["to_exact_by_oracle"][oracle]["values"]
                # TV is a metric: the three distances obey the triangle inequality
                for trained, between in zip(r["total_tv"], to_exact):
                    assert abs(trained - exact["tv"]) <= between + 1e-12
                    assert between <= trained + exact["tv"] + 1e-12
    fixed = report["languages"]["fixed"]["rows"]
    assert all(e["impossible"] in (0, None) for r in fixed for e in r["exact_denoiser"].values())
    assert report["headline"]["text"].startswith(f"At NFE per token <= {HEADLINE_NFE:g}")
    assert {v["verdict"] for v in report["correctors"]["verdicts"]} <= set(VERDICTS)
    assert {r["family"] for r in fixed} == {"ar", "mdm", "bd", "udm", "eso"}


def refuse_constant(word: str) -> None:
    raise AssertionError(f"report.json holds {word}, which strict JSON has no spelling for")


def test_a_language_beyond_exact_mode_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    """The exact package's refusal reaches the command line as one line, exit 2."""
    monkeypatch.setenv("HOME", str(tmp_path))
    big = HMMLanguage(states=3, vocab=3, max_len=10)
    monkeypatch.setattr(exact_frontier, "language", lambda name: big)
    assert main(["--out", str(tmp_path / "out"), "--scale", "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot hold the longest string" in err
