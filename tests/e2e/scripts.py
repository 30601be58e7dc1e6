"""Running the shell scripts of `examples/` as a user would, on this machine or in a network
namespace, and always stopping them (each in its own process group, with whatever it started)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def swarm_on_path(folder: Path) -> dict[str, str]:
    """An environment whose `swarm` is this checkout's CLI (as `pip install -e .` would give)."""
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "swarm"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m swarm.cli \"$@\"\n")
    shim.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "PYTHONUNBUFFERED": "1",
            "SWARM_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1"}


class Scripts:
    """Processes started from example scripts; `stop()` ends each one's whole process group."""

    def __init__(self, workdir: Path, env: dict[str, str], cwd: Path | None = None) -> None:
        """Logs go to `workdir`; the scripts run in `cwd` (default: `workdir`), e.g. a clone's root as a user would."""
        self.dir, self.env, self.cwd = workdir, env, cwd or workdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, cmd: Sequence[str], prefix: Sequence[str] = (), **env: str) -> subprocess.Popen:
        with open(self.dir / f"{name}.log", "w") as log:
            proc = subprocess.Popen([*prefix, *map(str, cmd)], stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                    env={**self.env, **env}, start_new_session=True)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for_log(self, name: str, pattern: str, timeout: float = 120.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.log(name))
            if found:
                return found
            proc = self.procs[name]
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{name} never logged {pattern!r} (exit code {proc.poll()}); its log ends with:\n"
                            f"{self.log(name)[-3000:]}")
            time.sleep(0.2)  # poll interval of a log another process writes

    def coordinator_address(self, name: str = "coordinator", timeout: float = 120.0) -> str:
        """The first address the coordinator tells peers to join with (the widest reach first)."""
        return self.wait_for_log(name, r"peers join with: swarm peer --initial-peers (\S+)", timeout).group(1)

    def stop(self, grace: float = 15.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of it, p2pd included
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout=10)
