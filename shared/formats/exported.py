"""What every export of this project records beside the weights (``duolm_export.json``), and
what ``duolm export`` writes for each objective."""

from __future__ import annotations

from pathlib import Path
from typing import Any

EXPORT_INFO = "duolm_export.json"

# said wherever an export refuses a checkpoint of another objective
EXPORTS_BY_OBJECTIVE = (
    "duolm export writes an 'ar' checkpoint as Llama and an 'mdm' one as LLaDA; 'bd' (block "
    "diffusion) has no public format to export to"
)


def export_record(checkpoint: str | Path, state: dict[str, Any]) -> dict[str, Any]:
    """What an export records of its source: the checkpoint, its step, and the row length its
    run trained and scored on (``duolm import`` of the export reads it back, so the round trip
    scores the same rows)."""
    return {
        "source_checkpoint": str(checkpoint),
        "step": state.get("step"),
        "seq_len": state.get("train_config", {}).get("seq_len"),
    }
