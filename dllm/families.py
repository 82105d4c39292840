"""The registry of diffusion families: what ``dllm.generator.DiffusionGenerator`` asks of one.

A family is an objective (registered with ``shared.objective.register_objective``) plus the
sampler that generates from a model trained with it. Each family folder (``dllm/masked``,
``dllm/block``, ``dllm/uniform``) registers a ``Family`` under its objective's name when it is
imported, and ``import dllm`` imports them all, so the generator finds a family by the objective
saved in a checkpoint and never names a family's modules. Adding a family is adding a folder
and calling ``register_family`` (see docs/adding-a-family.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dllm.canvas import Canvas
from dllm.sampler import SampleResult
from shared.tokenizer import Tokenizer

Generators = torch.Generator | Sequence[torch.Generator] | None


@dataclass(frozen=True)
class SampleRequest:
    """One call of a family's sampler, as the generator hands it over.

    ``state``: the checkpoint's saved state (its "train_config" holds the noise schedule, the
        block size, ...). ``config``: the sampler settings, an instance of the family's
        ``config_type``. ``generator``: one CPU generator, one per row, or None.
    ``kv_cache``: False asks for the reference path of a family with an exact cache (a family
        without one refuses it). ``stop_id``: the EOS id after which a sampler that can stop
        early may stop (None: decode the whole canvas). ``pad_id``: the padding id, or None.
    """

    model: nn.Module
    state: Mapping[str, Any]
    canvas: Canvas
    config: Any
    generator: Generators
    kv_cache: bool
    stop_id: int | None
    pad_id: int | None


def region_length(canvas: Canvas, state: Mapping[str, Any]) -> int:
    """Positions a sampler decodes when it decodes the generation region and nothing else."""
    start, end = canvas.region
    return end - start


def no_blocks(state: Mapping[str, Any]) -> int | None:
    return None


@dataclass(frozen=True)
class Family:
    """What the generator needs from a diffusion family.

    ``name``: the objective it samples, as checkpoints record it ("mdm", "bd", "udm").
    ``config_type``: the sampler settings it takes (others are refused before sampling).
    ``sample``: fills the canvas of a ``SampleRequest`` and returns a ``SampleResult``.
    ``generation_id(model, tokenizer)``: the id that marks a canvas's positions to generate
        ([MASK] for the absorbing families).
    ``decoded_positions(canvas, state)``: how many positions the sampler decodes for ``canvas``
        (one step each is the most a sampler can need); default the generation region.
    ``block_size(state)``: the block size the model decodes with, None when it has none.
    """

    name: str
    config_type: type
    sample: Callable[[SampleRequest], SampleResult]
    generation_id: Callable[[nn.Module, Tokenizer | None], int]
    decoded_positions: Callable[[Canvas, Mapping[str, Any]], int] = region_length
    block_size: Callable[[Mapping[str, Any]], int | None] = no_blocks


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Make ``family`` the sampler of checkpoints trained with objective ``family.name``."""
    if _FAMILIES.get(family.name, family) != family:
        raise ValueError(f"diffusion family {family.name!r} is registered twice")
    _FAMILIES[family.name] = family
    return family


def family_names() -> list[str]:
    """The registered families, in the order they registered."""
    return list(_FAMILIES)


def family_of(name: str) -> Family:
    if name not in _FAMILIES:
        raise ValueError(f"no diffusion family samples objective {name!r}: {family_names()} do")
    return _FAMILIES[name]


def spoken_names() -> str:
    """The registered family names as a sentence part: "'mdm', 'bd' or 'udm'"."""
    quoted = [repr(name) for name in _FAMILIES]
    if len(quoted) < 2:
        return "".join(quoted)
    return f"{', '.join(quoted[:-1])} or {quoted[-1]}"
