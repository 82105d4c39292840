"""The side-by-side sampling script on tiny checkpoints."""

import pytest

from eval.experiments import side_by_side


@pytest.fixture
def tiny_runs_folder(tiny_runs):
    return tiny_runs["ar"].parent


def test_prints_both_models_for_prompts_and_infilling(tiny_runs_folder, capsys):
    code = side_by_side.main(
        [
            str(tiny_runs_folder / "ar"),
            str(tiny_runs_folder / "mdm"),
            "--prompt",
            "And God",
            "--infill",
            "In the",
            " earth.",
            "--gen-length",
            "8",
            "--steps",
            "4",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "prompt: 'And God'" in out and "infill: 'In the' ... ' earth.'" in out
    assert out.count("NFE") == 4  # two cells per request
    assert "[8 NFE" in out  # AR: one forward per generated token


def test_user_errors_exit_2(tiny_runs_folder, capsys):
    assert side_by_side.main([str(tiny_runs_folder / "ar"), str(tiny_runs_folder / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert (
        side_by_side.main([str(tiny_runs_folder / "mdm"), str(tiny_runs_folder / "ar")]) == 2
    )  # swapped objectives
    assert (
        side_by_side.main(
            [str(tiny_runs_folder / "ar"), str(tiny_runs_folder / "mdm"), "--gen-length", "500"]
        )
        == 2
    )


def test_a_udm_model_continues_and_infills_beside_the_ar(tiny_runs_folder, udm_run, capsys):
    argv = [str(tiny_runs_folder / "ar"), str(udm_run), "--prompt", "And God", "--gen-length", "8"]
    code = side_by_side.main([*argv, "--infill", "In the", " earth.", "--steps", "4"])
    out = capsys.readouterr().out
    assert code == 0
    assert "UDM (ancestral, 4 steps)" in out and "infill: 'In the' ... ' earth.'" in out
    assert out.count("[4 NFE") == 2  # one evaluation per udm step, both requests
    assert side_by_side.main([*argv, "--greedy-tail"]) == 0
    assert "UDM (ancestral + greedy tail" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--sampler", "fixed"], "--sampler fixed ranks [MASK] positions, which a udm"),
        (["--sampler", "threshold"], "--sampler threshold ranks [MASK] positions"),
    ],
)
def test_masked_samplers_are_refused_for_udm_in_one_line(
    tiny_runs_folder, udm_run, capsys, flags, message
):
    assert side_by_side.main([str(tiny_runs_folder / "ar"), str(udm_run), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_greedy_tail_is_refused_for_a_masked_model(tiny_runs_folder, capsys):
    assert (
        side_by_side.main(
            [str(tiny_runs_folder / "ar"), str(tiny_runs_folder / "mdm"), "--greedy-tail"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--greedy-tail is a udm sampler option; the checkpoint's objective is 'mdm'" in err


def test_a_block_diffusion_model_continues_but_refuses_to_infill(
    tiny_runs_folder, tmp_path, capsys
):
    from shared.training import cli

    cli.train_from_argv(
        [
            "--preset",
            "tiny",
            "--objective",
            "bd",
            "--block-size",
            "4",
            "--out",
            str(tmp_path / "bd"),
        ]
        + ["--max-steps", "2", "--eval-every", "100", "--cache-dir", str(tmp_path / "cache")]
    )
    argv = [str(tiny_runs_folder / "ar"), str(tmp_path / "bd"), "--gen-length", "8", "--steps", "8"]
    assert side_by_side.main([*argv, "--prompt", "And God"]) == 0
    assert "BD (ancestral, 8 steps)" in capsys.readouterr().out
    assert side_by_side.main([*argv, "--infill", "In the", " earth."]) == 2
    assert "cannot infill" in capsys.readouterr().err


def test_the_entropy_bounded_sampler_runs_beside_the_ar(tiny_runs_folder, capsys):
    argv = [str(tiny_runs_folder / "ar"), str(tiny_runs_folder / "mdm"), "--prompt", "And God"]
    assert side_by_side.main([*argv, "--gen-length", "8", "--sampler", "eb"]) == 0
    assert "MDM (eb, 48 steps)" in capsys.readouterr().out


def test_an_eso_model_runs_its_own_sampler_and_refuses_the_masked_ones(
    tiny_runs_folder, tmp_path, capsys
):
    from shared.training import cli

    eso = tmp_path / "eso"
    cli.train_from_argv(
        ["--preset", "tiny", "--objective", "eso", "--out", str(eso), "--max-steps", "2"]
        + ["--eval-every", "100", "--cache-dir", str(tmp_path / "cache")]
    )
    capsys.readouterr()
    argv = [str(tiny_runs_folder / "ar"), str(eso), "--prompt", "And God", "--gen-length", "8"]
    assert side_by_side.main([*argv, "--steps", "2", "--infill", "In the", " earth."]) == 0
    out = capsys.readouterr().out
    # alpha_0 = 0.5 of 8 positions, the continuation's and the middle's: 4 in 2 diffusion
    # steps, then 4 left to right
    assert "ESO (ancestral, 2 steps)" in out and out.count("[6 NFE") == 2
    assert side_by_side.main([*argv, "--sampler", "threshold"]) == 2
    assert "does not apply to an eso (Eso-LM) model" in capsys.readouterr().err
