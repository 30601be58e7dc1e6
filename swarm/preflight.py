"""Checks a command makes before it starts anything: the devices, ports and folders the user named.

Each refuses with one sentence that says what to do: `ValueError` for a value that cannot be
right anywhere (exit 2), `Refused` for one this machine cannot honour (exit 1). They run before
any process, daemon or training starts, so that a mistake costs nothing and nothing is left
behind (`swarm/user_errors.py` prints the sentence).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from swarm.user_errors import Refused


def check_device(device: str, flag: str = "--device") -> None:
    """`device` is a torch device this machine has: cuda:N needs a CUDA build of torch and an N-th GPU."""
    import torch
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"{flag} has {device!r}, which is not a torch device; write cpu, cuda or cuda:0.") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "torch here is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise Refused(f"{flag} asks for {device}, but this machine cannot run CUDA ({why}); pass {flag} cpu, or "
                          f"run on a machine with an NVIDIA GPU and a CUDA build of torch.")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise Refused(f"{flag} asks for {device}, but this machine has {count} CUDA device"
                          f"{'s' if count != 1 else ''} (cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}).")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise Refused(f"{flag} asks for mps, which this machine does not have; pass {flag} cpu.")


def check_port(port: int, flag: str) -> None:
    """A TCP port number: 0 (any free port) to 65535."""
    if not 0 <= port <= 65535:
        raise ValueError(f"{flag} must be a TCP port from 1 to 65535 (or 0 for any free one), not {port}.")


def check_positive(value: int, flag: str, what: str) -> None:
    if value < 1:
        raise ValueError(f"{flag} must be at least 1 ({what}), not {value}.")


def check_writable_dir(path: str, flag: str) -> None:
    """`path` is (or can be made) a folder this user can write a file in: made if missing, and a file
    written and removed there now, so that a run never trains for hours and then fails to save."""
    p = Path(path)
    for parent in (p, *p.parents):
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{flag} {path} cannot be a folder: {parent} is a file; pass a folder's path.")
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise Refused(f"{flag} {path} cannot be written ({e.strerror or e}); pass a folder this user can write, "
                      f"or change its permissions.") from None


def check_writable_file(path: str, flag: str) -> None:
    """`path` names a file this user can write at the end of a run: not a folder, in a folder that can be written
    (made if missing), so that hours of training never end in an error about where to put their figures."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {path} is a folder; pass a file's path, e.g. {p / 'metrics.json'}.")
    check_writable_dir(str(p.parent), f"{flag}'s folder")
