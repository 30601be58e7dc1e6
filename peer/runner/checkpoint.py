"""Checkpoints: a stage's state on disk, written so that a crash never leaves a torn file.

`save_checkpoint` writes to a temporary file in the same folder, fsyncs it, renames it over
the old one (atomic on POSIX) and fsyncs the folder, so the file on disk is always either
the previous checkpoint or the new one, whole. The content is `StageRunner.state_dict()`:
the state at the start of the step in progress. `load_checkpoint` reads it back with
`weights_only=True`, so a checkpoint file can hold tensors and plain data but never code.
"""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

import torch


def checkpoint_path(folder: str | os.PathLike, run_hash: str, stage: int) -> Path:
    return Path(folder) / f"{run_hash}-stage{stage}.pt"


def save_checkpoint(path: str | os.PathLike, state: dict | bytes) -> None:
    """Write `state` (a state dict, or one already serialised with `torch.save`) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    if isinstance(state, bytes):
        buf.write(state)
    else:
        torch.save(state, buf)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | os.PathLike) -> dict:
    return torch.load(Path(path), map_location="cpu", weights_only=True)
