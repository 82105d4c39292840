"""What every export of this project records beside the weights (``duolm_export.json``), and
what ``duolm export`` writes for each objective."""

from __future__ import annotations

from pathlib import Path
from typing import Any

EXPORT_INFO = "duolm_export.json"

# What each objective is, and the public format each exportable one is written as.
OBJECTIVE_NAMES = {
    "ar": "autoregressive",
    "mdm": "masked diffusion",
    "bd": "block diffusion",
    "udm": "uniform-state diffusion",
}
PUBLIC_FORMATS = {"ar": "a Hugging Face Llama folder", "mdm": "a LLaDA folder"}


def export_refusal(checkpoint: str | Path, objective: str | None, writes: str) -> str:
    """The one line an exporter of ``writes`` checkpoints (ar or mdm) says when given one of
    ``objective``: what that objective exports as, or that it has no public format, in terms
    of that objective only."""
    name = OBJECTIVE_NAMES.get(objective or "")
    article = "an" if objective in ("ar", "mdm") else "a"  # as the names are spoken
    held = f"{checkpoint} holds {article} {objective!r} checkpoint" + (f" ({name})" if name else "")
    if objective in PUBLIC_FORMATS:
        return (
            f"{held}; this command writes {PUBLIC_FORMATS[writes]}, which only an {writes!r} "
            f"checkpoint is; duolm export writes an {objective!r} checkpoint as "
            f"{PUBLIC_FORMATS[objective]}"
        )
    return (
        f"{held}, which has no public format to export to; duolm export writes an 'ar' "
        "checkpoint as Llama and an 'mdm' one as LLaDA"
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
