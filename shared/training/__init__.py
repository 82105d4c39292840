"""The training library: ``train(spec) -> summary`` runs a ``RunSpec`` made by ``new_run`` (a
preset plus overrides) or ``resume_run`` (a checkpoint plus overrides).

    from shared.training import new_run, train
    summary = train(new_run("tiny", "runs/t", objective="mdm", max_steps=100))

Modules: ``config`` (TrainConfig), ``presets``, ``run`` (RunSpec), ``setup`` (accelerator, data,
optimizer), ``loop`` (the step loop), ``checkpoints`` (keeping and best), ``resume`` (what a
resumed run may change), ``warm_start`` (``--init-from``: another run's weights), ``schedule``
(LR and budgets), ``metrics``, ``cli`` (train.py's flags), ``convert`` (checkpoints of earlier
releases, whose training state is pickled, to the current format).
"""

from shared.training.config import TrainConfig, TrainingDiverged
from shared.training.loop import train
from shared.training.presets import get_preset, resolve_config
from shared.training.run import RunSpec, new_run, resume_run

__all__ = [
    "RunSpec",
    "TrainConfig",
    "TrainingDiverged",
    "get_preset",
    "new_run",
    "resolve_config",
    "resume_run",
    "train",
]
