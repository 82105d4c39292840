"""The sampling command's flags for the correctors and the entropy-bounded sampler: ReMDM for
the masked and block families (``--remdm``), the Psi-samplers for the uniform-state family
(``--psi``), their knobs, and ``--gamma`` of ``--sampler eb``.

Every refusal is one line naming the flag, its value and the valid range, made before the
checkpoint is loaded where the range does not depend on it (sigma's bound depends on the steps,
so it is checked once they are known, still before anything is sampled or printed).
"""

from __future__ import annotations

import argparse
import dataclasses

from dllm.remdm import RELEASED_ETA, RELEASED_LOOP_TIMES, REMDM_MODES, Remdm
from dllm.uniform.sampler import PSI_MODES, UniformSamplerConfig

# The knobs as the library names them and as the command line spells them.
KNOBS = {"sigma": "--sigma", "eta": "--eta", "t_on": "--t-on", "t_off": "--t-off"}
KNOBS |= {"alpha_on": "--alpha-on", "gamma": "--gamma", "psi": "--psi"}
DEFAULT_GAMMA = 0.01
# ReMDM's released settings where a flag is left out (its OWT scripts: eta 0.02, and the loop
# between t = 0.55 and 0.05 at alpha 0.9); the library's own default eta is 0, no correction.
DEFAULT_ETA = RELEASED_ETA
LOOP_TIMES = {key: RELEASED_LOOP_TIMES[key] for key in ("t_on", "t_off")}


def add_corrector_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the corrector and EB flags to the sampling command's ``parser``."""
    group = parser.add_argument_group("correctors and the entropy-bounded sampler")
    group.add_argument(
        "--gamma",
        type=float,
        default=None,
        help=f"mdm and bd eb sampler: the entropy budget per step (default {DEFAULT_GAMMA}; "
        "0 = one token per step)",
    )
    group.add_argument(
        "--remdm",
        choices=REMDM_MODES,
        default=None,
        help="mdm and bd: ReMDM, ancestral steps that may remask revealed tokens, with this "
        "sigma schedule (constant: --sigma; cap, rescale, loop: --eta)",
    )
    group.add_argument(
        "--psi",
        choices=PSI_MODES,
        default=None,
        help="udm: Psi-sampler kappa schedule (constant: --kappa; cap, rescale, loop: --eta)",
    )
    group.add_argument(
        "--kappa",
        dest="corrector",
        type=float,
        default=argparse.SUPPRESS,  # --corrector's default stands
        help="udm: the same as --corrector (kappa of --psi constant)",
    )
    group.add_argument("--sigma", type=float, default=None, help="--remdm constant: sigma")
    group.add_argument(
        "--eta",
        type=float,
        default=None,
        help=f"--remdm or --psi cap/rescale/loop: eta (default {DEFAULT_ETA})",
    )
    group.add_argument(
        "--t-on",
        type=float,
        default=None,
        help="the corrector acts at t <= t-on (default 1; loop: 0.55)",
    )
    group.add_argument(
        "--t-off",
        type=float,
        default=None,
        help="the corrector acts at t >= t-off (default 0; loop: 0.05)",
    )
    group.add_argument(
        "--alpha-on", type=float, default=None, help="loop: the alpha held (default 0.9)"
    )
    return parser


def given_knobs(args: argparse.Namespace) -> dict:
    """The corrector knobs given on the command line."""
    names = ("sigma", "eta", "t_on", "t_off", "alpha_on")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def knob_values(args: argparse.Namespace) -> dict:
    """The knobs of the command line's corrector: those given, then ``DEFAULT_ETA`` for the
    modes that take eta and ``LOOP_TIMES`` for the loop."""
    mode = args.remdm or args.psi
    defaults = {} if mode in (None, "constant", "conf") else {"eta": DEFAULT_ETA}
    if mode == "loop":
        defaults |= LOOP_TIMES
    return defaults | given_knobs(args)


def flag_message(error: ValueError) -> ValueError:
    """The library's message with its knob names spelled as the flags ("eta=-1 is out of range"
    becomes "--eta -1 is out of range")."""
    message = str(error)
    for knob, flag in KNOBS.items():
        message = message.replace(f"{knob}=", f"{flag} ")
    return ValueError(message)


def check_corrector_options(args: argparse.Namespace) -> None:
    """Refuse what does not fit before loading anything: a knob without its corrector, a
    corrector with a rule that is not ancestral, and knobs out of range."""
    knobs = knob_values(args)
    if given_knobs(args) and not (args.remdm or args.psi):
        flag = KNOBS[next(iter(knobs))]
        raise ValueError(f"{flag} applies to --remdm or --psi only (a corrector's knob)")
    if args.remdm and args.psi:
        raise ValueError("--remdm (mdm and bd) and --psi (udm) belong to different families")
    if args.remdm and args.sampler not in (None, "ancestral"):
        raise ValueError(
            f"--remdm applies to ancestral steps, not --sampler {args.sampler}: leave --sampler "
            "out or give --sampler ancestral"
        )
    if args.gamma is not None and not 0 <= args.gamma < float("inf"):
        raise ValueError(f"--gamma {args.gamma} is out of range: valid gamma >= 0 (finite)")
    try:
        if args.remdm:
            # the steps are not known yet: sigma's bound waits for them (remdm_from_args)
            Remdm(2, mode=args.remdm, **{**knobs, "sigma": 0.0}).validate()
        if args.psi:
            psi_config(args, UniformSamplerConfig(1)).validate()
    except ValueError as error:
        raise flag_message(error) from None


def remdm_from_args(args: argparse.Namespace, steps: int) -> Remdm:
    """The ReMDM rule of the command line with ``steps`` steps, validated (sigma's bound)."""
    try:
        return Remdm(steps, mode=args.remdm, schedule=args.schedule, **knob_values(args)).validate()
    except ValueError as error:
        raise flag_message(error) from None


def psi_config(args: argparse.Namespace, config: UniformSamplerConfig) -> UniformSamplerConfig:
    """``config`` with the command line's Psi schedule and knobs (unchanged without --psi)."""
    if not args.psi:
        return config
    knobs = {k: v for k, v in knob_values(args).items() if k != "sigma"}
    if "sigma" in given_knobs(args):
        raise ValueError("--sigma applies to --remdm constant; --psi takes --kappa or --eta")
    return dataclasses.replace(config, psi=args.psi, **knobs)


def udm_corrector_config(args: argparse.Namespace, config: UniformSamplerConfig):
    """``psi_config`` validated, its errors naming the flags."""
    try:
        return psi_config(args, config).validate()
    except ValueError as error:
        raise flag_message(error) from None
