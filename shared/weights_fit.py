"""Whether a checkpoint's weights fit a model, judged from the weights' safetensors header
alone (``shared.tensor_files.read_tensor_header``) and a model that may be on the meta device:
names, shapes and dtypes, so that a config asking for more than the weights hold is refused
before a model of its size is allocated."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from shared.config import ModelConfig
from shared.errors import CheckpointError
from shared.tensor_files import FLOAT_TYPES, StoredTensor


def check_layer_count(path: Path, config: ModelConfig, header: dict[str, StoredTensor]) -> None:
    """Refuse a config whose layer count is not the weights' (``layers.N.`` names), before a
    model of a million meta layers is built."""
    layers = {name.split(".")[1] for name in header if name.startswith("layers.")}
    if config.n_layers != len(layers):
        raise CheckpointError(
            f"{path}: its state.json asks for n_layers={config.n_layers}, but its weights hold "
            f"{len(layers)} layers"
        )


def check_weights_fit(path: Path, model: nn.Module, header: dict[str, StoredTensor]) -> None:
    """Refuse, in one line naming the first tensors that differ, weights whose names, shapes or
    dtypes do not fit ``model`` (which may be on the meta device: nothing is read or made)."""
    own = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    wrong = [
        f"{n} {header[n].shape} vs {own[n]}"
        for n in sorted(own)
        if n in header and header[n].shape != own[n]
    ]
    if wrong:
        raise CheckpointError(
            f"{path}: {len(wrong)} tensors have another shape than this model's (checkpoint vs "
            f"model: {'; '.join(wrong[:3])}{'; ...' if len(wrong) > 3 else ''}); a model whose "
            "shape changed cannot continue from these weights"
        )
    stored = _stored_names(model, header)
    missing = sorted(set(own) - stored)
    unexpected = sorted(set(header) - set(own))
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not fit the model (missing {missing}, unexpected {unexpected})"
        )
    not_float = sorted(n for n, t in header.items() if t.dtype not in FLOAT_TYPES)
    if not_float:
        first = not_float[0]
        raise CheckpointError(
            f"{path}: tensor {first} is stored as {header[first].dtype}; a model's weights are "
            f"floating point ({', '.join(FLOAT_TYPES)})"
        )


def _stored_names(model: nn.Module, header: dict[str, StoredTensor]) -> set[str]:
    """The model's tensor names the header provides: a tied group (one tensor under several
    names, stored once) is provided when any one of its names is stored."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    provided = set(header)
    for names in groups.values():
        if provided.intersection(names):
            provided.update(names)
    return provided
