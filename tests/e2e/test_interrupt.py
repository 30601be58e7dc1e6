"""Ctrl+C on `swarm local` stops everything it started: peers, coordinator and their p2pd."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import MARKER, marked_p2pd


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_interrupted_local_swarm_leaves_nothing_behind(tmp_path):
    workdir = tmp_path / "run"
    marker = os.environ[MARKER]
    before = marked_p2pd(marker)
    proc = subprocess.Popen([sys.executable, "-m", "swarm.cli", "local", "--steps", "100000", "--workdir", str(workdir),
                             "--no-dashboard", "--quiet", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        report = workdir / "stage0.jsonl"
        while not (report.exists() and report.read_text().count('"event": "step"') >= 2):
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the local swarm never trained"
            time.sleep(0.2)  # poll interval of the head's report
        started = marked_p2pd(marker) - before
        assert len(started) == 4, f"expected a p2pd for the coordinator and each of 3 peers, found {started}"

        proc.send_signal(signal.SIGINT)  # what Ctrl+C in a terminal does
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 130, out[-3000:]
        assert "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 15
    while (left := (marked_p2pd(marker) - before) | set(_processes_mentioning(str(workdir)))) \
            and time.monotonic() < deadline:
        time.sleep(0.1)  # poll until the children have been reaped
    assert not left, f"processes left behind after Ctrl+C: {sorted(left)}"
