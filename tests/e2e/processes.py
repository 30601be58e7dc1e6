"""Process helpers for the multi-process tests: kill one peer hard, see what it left behind, and
run independent commands side by side."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def at_once(*calls: Callable[[], T]) -> list[T]:
    """Run independent blocking calls side by side (e.g. CLI commands, each mostly its own start-up,
    on one torch thread each); their results in order, or the first error."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result() for f in futures]


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command name) of the live (non-zombie) processes in process group `pgid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the process ended while we looked
        name, rest = stat[stat.index("(") + 1: stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if rest[0] not in "ZX" and int(rest[2]) == pgid:
            found.append((int(entry), name))
    return found


def sigkill_and_wait_for_group(proc: subprocess.Popen, timeout: float = 20.0) -> float:
    """SIGKILL the process alone (not its group: its children must clean up by themselves) and
    wait until nothing of its process group is left; returns how long that took."""
    pgid = os.getpgid(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    while members := group_members(pgid):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"processes outlived their SIGKILLed parent {proc.pid}: {members}")
        time.sleep(0.1)  # poll the process table
    return time.monotonic() - t0
