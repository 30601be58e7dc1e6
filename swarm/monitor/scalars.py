"""TensorBoard scalars (`--tensorboard DIR`) for `swarm local`, `swarm peer` and `swarm dashboard`.

A thin owner of one `torch.utils.tensorboard.SummaryWriter`: the writer is imported only when
a user asks for TensorBoard (it pulls in the `tensorboard` package), values that are not finite
numbers are skipped rather than written, and `close()` flushes the event file.
"""
from __future__ import annotations

import math
from pathlib import Path

from swarm.optional import require

FLUSH_S = 5  # TensorBoard's default (120 s) is too slow to follow a live run


class ScalarLog:
    """Writes named scalars at a step into event files under `directory`."""

    def __init__(self, directory: str | Path) -> None:
        require("tensorboard", "--tensorboard")  # the Docker image leaves it out
        from torch.utils.tensorboard import SummaryWriter

        Path(directory).mkdir(parents=True, exist_ok=True)
        self.directory = Path(directory)
        self._writer = SummaryWriter(log_dir=str(directory), flush_secs=FLUSH_S)

    def write(self, step: int, values: dict[str, float | None], wall_time: float | None = None) -> None:
        for tag, value in values.items():
            if value is not None and isinstance(value, (int, float)) and math.isfinite(value):
                self._writer.add_scalar(tag, float(value), global_step=int(step), walltime=wall_time)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
