"""A stage's training state, with no network and no asyncio: the room every other room of peer/ builds on.

- `stage.py`: `StageRunner` (forward, backward, accumulation, optimizer step, basis switches);
  its halves `reduced.py` (a replica's flat gradient and the agreed sum), `loss_scaling.py` (fp16),
  `basis_versions.py` (the basis a step uses); `step_record.py`, `stage_error.py` (`StageError`).
- `state_hash.py`, `state_hasher.py`: a stage's state as bytes and its hash, computed on a thread.
- `checkpoint.py`: a stage's state on disk, written atomically.
- `replica_sync.py`: `PowerSync`, one replica's side of replica_sync "powersgd".
- `pipeline.py`: `InProcessPipeline`, runners chained through real wire bytes: the swarm's oracle.
- `memory_estimate.py`: a stage's peak memory from the spec alone.
"""
from .checkpoint import load_checkpoint, save_checkpoint
from .memory_estimate import StageMemory, estimate_stage
from .pipeline import InProcessPipeline
from .reduced import Reduced
from .stage import StageRunner
from .stage_error import StageError
from .state_hash import state_sha256
from .step_record import StepRecord

__all__ = ["InProcessPipeline", "Reduced", "StageError", "StageMemory", "StageRunner", "StepRecord",
           "estimate_stage", "load_checkpoint", "save_checkpoint", "state_sha256"]
