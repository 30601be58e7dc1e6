"""What the churn bench reads from its hosts while the swarm runs: the events a peer appends to its report
(`ReportTail`), and the processes still in a host's network namespace (`netns_pids`)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path


def appended(path: Path, offset: int) -> bytes:
    """What a file another process writes holds past `offset` (b"" while it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""


class ReportTail:
    """The events a peer appended to its JSON-lines report since the last read."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rest = path, 0, b""

    def read(self) -> list[dict]:
        data = appended(self.path, self.offset)
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


def netns_pids(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
    return [int(p) for p in done.stdout.split()]
