"""Which training rows step s reads, and where a checkpoint stands in that order.

Rows held in memory (and shards read by one process) follow one global order: step s reads
sample positions ``s * batch_size ...`` of ``EpochSampler(n_rows, seed)``, the same on any number
of processes, so a run resumes exactly on another process count. Shards read by N > 1 processes
are split by shard: each process draws its share of every batch (``batch_size / N`` rows) from
its own shards in its own order, and the processes gather the batch. That order depends on N, so
a checkpoint records its data position (``data_position``) and a resume on another process count
is refused rather than silently reading other tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from accelerate import Accelerator

from shared.data.rows import EpochSampler
from shared.data.shards import shard_folder
from shared.errors import ConfigError

ORDER_GLOBAL = "global"  # one order over all rows, the same on any process count
ORDER_PER_PROCESS = "per-process shards"  # each process its own shards, in its own order


class DataOrder:
    """The rows of each step (``rows``) and the data position after a step (``position``)."""

    def __init__(
        self,
        train_rows: Any,
        *,
        seed: int,
        batch_size: int,
        accelerator: Accelerator,
        sharded: bool,
        source: str,
    ) -> None:
        self.train_rows, self.accelerator, self.source = train_rows, accelerator, source
        self.world, self.rank = accelerator.num_processes, accelerator.process_index
        self.kind = ORDER_PER_PROCESS if sharded and self.world > 1 else ORDER_GLOBAL
        self.seed = seed
        if self.kind == ORDER_GLOBAL:
            self.share = batch_size
            self.sampler = EpochSampler(len(train_rows), seed)
        else:
            self.share = batch_size // self.world
            self.sampler = EpochSampler(len(train_rows), seed, salt=(self.rank, self.world))

    @classmethod
    def for_run(cls, data: Any, cfg: Any, accelerator: Accelerator) -> DataOrder:
        """The order of a run's ``RunData`` under its ``TrainConfig``."""
        return cls(
            data.train_rows,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            accelerator=accelerator,
            sharded=shard_folder(cfg.dataset) is not None,
            source=data.record["corpus_fingerprint"],
        )

    def rows(self, step: int) -> torch.Tensor:
        """The global batch of optimizer step ``step`` (0-based), int64 [batch_size, seq_len]."""
        picked = self.sampler.indices(step * self.share, self.share)
        local = torch.as_tensor(np.asarray(self.train_rows[picked]), dtype=torch.long)
        if self.kind == ORDER_GLOBAL:
            return local
        # each process read its own part; the batch is their concatenation in rank order
        gathered = self.accelerator.gather(local.to(self.accelerator.device))
        return gathered.cpu()

    def position(self, steps_done: int) -> dict[str, Any]:
        """Where the data order stands after ``steps_done`` steps, for the checkpoint."""
        return {
            "order": self.kind,
            "source": self.source,
            "seed": self.seed,
            "processes": self.world if self.kind == ORDER_PER_PROCESS else None,
            "rows": len(self.train_rows) if self.kind == ORDER_GLOBAL else None,
            "samples_per_order": steps_done * self.share,
            "steps": steps_done,
        }

    def check_resume(self, saved: dict[str, Any] | None, start_step: int) -> None:
        """Refuse to resume where this run would read other tokens than the checkpoint's run
        would have read next. Checkpoints from before data positions were saved pass."""
        if saved is None:
            return
        here = self.position(start_step)
        if saved.get("order") != here["order"] or saved.get("processes") != here["processes"]:
            raise ConfigError(
                f"refusing to resume: the checkpoint's data order is {describe(saved)}, this "
                f"run's is {describe(here)}; shards split per process are read in an order of "
                "their process count, so resume on the checkpoint's number of processes (rows "
                "held in memory resume on any)"
            )
        if saved.get("samples_per_order") != here["samples_per_order"]:
            raise ConfigError(
                f"refusing to resume: the checkpoint's data position ({saved['samples_per_order']}"
                f" samples) is not where step {start_step} reads ({here['samples_per_order']})"
            )


def describe(position: dict[str, Any]) -> str:
    if position.get("order") == ORDER_PER_PROCESS:
        return f"{ORDER_PER_PROCESS} over {position.get('processes')} processes"
    return str(position.get("order"))
