"""`StageError`: the one exception a stage raises for work it must refuse, shared by the
runner (`peer/runner/stage.py`) and its replica half (`peer/runner/reduced.py`)."""
from __future__ import annotations


class StageError(ValueError):
    """Work this stage must refuse (wrong step, unknown or duplicate microbatch)."""
