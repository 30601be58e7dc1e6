"""Nothing a swarm process started outlives it, not even after `kill -9` or the OOM killer.

hivemind runs each DHT node in a forked child that owns a p2pd; a process that ends normally,
by Ctrl+C or by SIGTERM stops them in its `finally` blocks, but one killed by a signal it
cannot catch leaves both behind (orphans that keep their ports and connections). So each
long-running command starts a **watcher**: a tiny process (this module; standard library
only) that notes its owner's descendants once a second and, as soon as the owner is gone,
ends those still there (SIGTERM, then SIGKILL after a grace period), then exits itself. A
clean exit leaves it nothing to do. Linux only (it reads /proc); elsewhere it is not started.

An owner killed between two looks (a peer that is ready within a second of its start, killed at
once) has descendants the watcher never noted; they were reparented and no longer descend from
it. When the owner leads its process group (`swarm local`'s processes, each in a session of its
own; a command started from an interactive shell), every process still in that group is one the
owner or its descendants started (the kernel does not reuse the id of a live group), so those are
ended too.

    python -m swarm.reaper OWNER_PID
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 1.0  # how often the owner's descendants are noted (and its death noticed)
GRACE_S = 3.0  # from SIGTERM to SIGKILL


def start_watcher() -> subprocess.Popen | None:
    """Start the watcher of this process (None where there is no /proc)."""
    if not os.path.isdir("/proc"):
        return None
    return subprocess.Popen([sys.executable, "-m", "swarm.reaper", str(os.getpid())], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, start time, process group) of a live process, None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if rest[0] in ("Z", "X") else (int(rest[1]), int(rest[19]), int(rest[2]))


def _processes() -> dict[int, tuple[int, int, int]]:
    return {int(e): found for e in os.listdir("/proc") if e.isdigit() and (found := _stat(int(e))) is not None}


def descendants(owner: int, skip: int) -> dict[int, int]:
    """Every live descendant of `owner` except `skip` (and its own): pid -> start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for pid, (parent, start, _) in _processes().items():
        children.setdefault(parent, []).append(pid)
        starts[pid] = start
    out, todo = {}, list(children.get(owner, []))
    while todo:
        pid = todo.pop()
        if pid != skip and pid not in out:
            out[pid] = starts[pid]
            todo += children.get(pid, [])
    return out


def group_members(group: int, skip: int) -> dict[int, int]:
    """Every live process of process group `group` except `skip`: pid -> start time."""
    return {pid: start for pid, (_, start, pgrp) in _processes().items() if pgrp == group and pid != skip}


def _alive(known: dict[int, int]) -> dict[int, int]:
    # the same process only: a pid whose start time changed has been reused by someone else
    return {pid: start for pid, start in known.items() if (found := _stat(pid)) is not None and found[1] == start}


def end(known: dict[int, int], grace: float = GRACE_S) -> None:
    """SIGTERM each process that is still the one noted, then SIGKILL those that outlive `grace`."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 1.0)):
        for pid in _alive(known):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while _alive(known) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _alive(known):
            return


def watch(owner: int) -> None:
    me = os.getpid()
    known: dict[int, int] = {}
    while os.getppid() == owner:  # once the owner dies, this process is handed to another parent
        known = {**_alive(known), **descendants(owner, me)}
        time.sleep(POLL_S)
    if os.getpgid(0) == owner:  # the owner led this group (module docstring): its members are its own
        known = {**_alive(known), **group_members(owner, me)}
    end(known)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl+C in the terminal is for the owner, who cleans up
    watch(int(sys.argv[1]))
