"""Starting a run from another run's weights (``--init-from``), e.g. adapting a trained AR model
into a masked diffusion model (DiffuLLaMA, Dream): the weights are copied, while the optimizer,
the step, the data order and the RNG start fresh.

The source (a run folder, whose newest valid checkpoint is used, as ``--resume`` does, or a
checkpoint folder) must have this run's backbone shape in every field and its tokenizer
setting; the run then uses the source's own tokenizer, the one its weights were trained with.
Vocabularies may differ only by the diffusion ``[MASK]`` row (the last one): AR -> MDM adds it,
MDM -> AR drops it, AR -> AR and MDM -> MDM copy every tensor exactly.

The new ``[MASK]`` row of the input embedding is the mean of the source's embedding rows: the
pretrained network then sees an input of a token's typical scale and direction, not one it never
met (a zero row becomes a zero vector after RMSNorm; a random row is noise of another scale).
An untied output row starts at zero: SUBS drops the ``[MASK]`` column before every softmax, so
it is never a prediction and gets no gradient, and zero is the neutral value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from shared import checkpoint as ckpt
from shared import door
from shared.config import ModelConfig
from shared.errors import CheckpointError, ConfigError
from shared.objective import objective_class
from shared.training.config import TrainConfig
from shared.training.resume import config_differences
from shared.training.setup import training_flops_per_token

# The tensors with one row per vocabulary id (the [MASK] row, if any, is the last).
VOCAB_ROWS = ("tok_embeddings.weight", "output.weight")


@dataclass(frozen=True)
class InitSource:
    checkpoint: Path  # the checkpoint folder the weights come from
    state: dict[str, Any]  # its state.json
    record: dict[str, Any]  # what the run records about its source (config, checkpoints, summary)


def check_start(
    model_cfg: ModelConfig, cfg: TrainConfig, out: Path, resuming: bool
) -> InitSource | None:
    """The source of a new run's weights, checked against this run (None without
    ``init_from`` and when resuming, which continues from the run's own checkpoint); refuses
    settings that cannot start. Reads only, before the run touches its folder."""
    if resuming or not cfg.init_from:
        return None
    where = f"--init-from {cfg.init_from}"
    try:
        checkpoint = ckpt.resolve_checkpoint(Path(cfg.init_from))
    except CheckpointError as error:
        raise CheckpointError(f"{where}: {error}") from None
    if Path(out).resolve() in checkpoint.resolve().parents:
        raise ConfigError(f"{where}: the source is inside this run's own folder {out}")
    state = ckpt.read_state(checkpoint)
    check_compatible(state, model_cfg, cfg, where)
    return InitSource(checkpoint, state, source_record(cfg.init_from, checkpoint, state))


def check_compatible(
    state: dict[str, Any], model_cfg: ModelConfig, cfg: TrainConfig, where: str
) -> None:
    """Refuse a source whose backbone shape (every field but the vocabulary, which the
    tokenizer and objective decide, and the logit shift) or tokenizer setting differs, naming
    every difference."""
    # every field, those to_dict leaves out at their off values included
    source = dataclasses.asdict(ModelConfig.from_dict(state["model_config"]))
    source |= state["train_config"]
    # shift_logits is how the objective reads the head, not a shape: an AR source keeps its
    # alignment in a shifted MDM (the DiffuLLaMA / Dream recipe). A time embedding may be added
    # (it starts at zero); a source that has one passes it on (``run.inherited_from_source``).
    free = ("vocab_size", "shift_logits", "time_conditioning")
    shape = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in free)
    tokens = ("tokenizer",) + (("tokenizer_vocab_size",) if cfg.tokenizer == "bpe" else ())
    wrong = config_differences(
        source,
        dataclasses.asdict(model_cfg) | dataclasses.asdict(cfg),
        shape + tokens,
        describe=lambda name, theirs, ours: (
            f"{name}={theirs!r} in the source, {ours!r} in this run"
        ),
    )
    if wrong:
        raise ConfigError(f"{where}: " + "; ".join(wrong))


def source_record(init_from: str, checkpoint: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The source as a report needs it: where, which step and objective, the sha256 of its
    weights, and its training compute (tokens and FLOPs at that step, and ``total_*`` adding
    what its own source had, when it was initialised from another run too). An imported
    checkpoint's pretraining is not recorded anywhere: its compute is unknown, so null (with
    ``compute_unknown`` saying why), never 0, and so is every total that includes it."""
    train_cfg = state["train_config"]
    model_cfg = ModelConfig.from_dict(state["model_config"])
    manifest = ckpt.read_manifest(checkpoint)
    record = {
        "path": init_from,
        "checkpoint": str(checkpoint.resolve()),
        "step": state["step"],
        "objective": state["objective"],
        "weights_sha256": manifest.get("model.safetensors"),
    }
    imported = state.get("imported_from")
    if imported:
        unknown = dict.fromkeys(("tokens_seen", "flops", "total_tokens_seen", "total_flops"))
        why = (
            f"imported from {imported.get('source', '?')}: its pretraining compute is not "
            "recorded, so tokens and FLOPs are unknown (null), not 0"
        )
        return record | unknown | {"compute_unknown": why}
    tokens = state["step"] * train_cfg["batch_size"] * train_cfg["seq_len"]
    objective = objective_class(state["objective"])
    flops = tokens * training_flops_per_token(objective, model_cfg, train_cfg["seq_len"])
    record |= {"tokens_seen": tokens, "flops": flops}
    earlier = state.get("init_from") or {}
    if earlier.get("compute_unknown"):  # the source started from an import: no total is known
        return record | {
            "total_tokens_seen": None,
            "total_flops": None,
            "compute_unknown": earlier["compute_unknown"],
        }
    return record | {
        "total_tokens_seen": tokens + earlier.get("total_tokens_seen", 0),
        "total_flops": flops + earlier.get("total_flops", 0.0),
    }


def load_source_weights(source: InitSource, model: nn.Module, tokenizer_vocab: int) -> str:
    """Copy the source's weights into ``model`` (bare, before it is wrapped), adding or dropping
    the ``[MASK]`` row; returns a line saying what was done."""
    where = f"--init-from {source.record['path']}"
    ckpt.refuse_sharded(source.checkpoint)
    ckpt.refuse_unlisted_weights(source.checkpoint)
    weights = source.checkpoint / ckpt.WEIGHTS
    with door.opened_path(weights, source.checkpoint, error=CheckpointError) as name:
        saved = load_file(name)
    own = model.state_dict()
    source_vocab = source.state["model_config"]["vocab_size"]
    target_vocab = model.config.vocab_size
    extra = {"source": source_vocab - tokenizer_vocab, "this run": target_vocab - tokenizer_vocab}
    if any(rows not in (0, 1) for rows in extra.values()):
        raise ConfigError(
            f"{where}: vocab_size={source_vocab} in the source, {target_vocab} in this run; "
            f"only a [MASK] row may be added or dropped to the tokenizer's {tokenizer_vocab} ids"
        )
    new_time_embedding = {name for name in own if name.startswith("time_embedding.")} - set(saved)
    missing = sorted(set(own) - set(saved) - ckpt.tied_copies(model) - new_time_embedding)
    unexpected = sorted(set(saved) - set(own))
    if missing or unexpected:
        raise CheckpointError(
            f"{where}: weights do not fit the model (missing {missing}, unexpected {unexpected})"
        )
    with torch.no_grad():
        for name, tensor in saved.items():
            target = own[name]
            if name in VOCAB_ROWS and tensor.shape[0] != target.shape[0]:
                shared_rows = min(tensor.shape[0], target.shape[0])
                target[:shared_rows].copy_(tensor[:shared_rows])
                if target.shape[0] > shared_rows:  # the new [MASK] row
                    is_embedding = name == "tok_embeddings.weight" or model.config.tie_embeddings
                    fill = tensor[:tokenizer_vocab].mean(0) if is_embedding else 0.0
                    target[shared_rows:] = fill
            elif tensor.shape != target.shape:
                raise CheckpointError(
                    f"{where}: {name} is {tuple(tensor.shape)} in the source, "
                    f"{tuple(target.shape)} in this run"
                )
            else:
                target.copy_(tensor)
    change = {(0, 1): "added a [MASK] row", (1, 0): "dropped the [MASK] row"}
    rows = change.get((extra["source"], extra["this run"]), "copied exactly")
    if new_time_embedding:  # its output layer is zero, so the model starts as the source
        rows += "; added a time embedding that starts at zero"
    return (
        f"initialised from {source.checkpoint} (step {source.state['step']}, "
        f"{source.state['objective']}): {rows}"
    )
