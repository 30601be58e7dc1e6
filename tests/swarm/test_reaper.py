"""The watcher (swarm/reaper.py) ends what its owner started even when the owner is killed before
the watcher's first look at its descendants, or after they were reparented away from it: as the
leader of its process group, every process left in the group is the owner's. An owner that does
not lead its group leaves the group's other members alone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from swarm.reaper import _alive, _stat, descendants

pytestmark = pytest.mark.e2e  # it starts processes
ROOT = Path(__file__).resolve().parents[2]

# the owner: starts a process that leaves its tree at once (started by a child that exits: reparented, no
# descendant of the owner by the time its watcher starts, so no look of the watcher ever sees it descend from
# the owner), then its watcher, writes that process's pid, and waits to be killed
OWNER = textwrap.dedent("""
    import os, subprocess, sys, time
    from swarm.reaper import start_watcher
    child = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys; print(subprocess.Popen(['sleep', '300']).pid, flush=True)"],
        stdout=subprocess.PIPE, text=True)
    stray = int(child.stdout.readline())
    child.wait()
    start_watcher()
    with open(sys.argv[1], "w") as f:
        f.write(str(stray))
    time.sleep(300)
""")


def start_owner(tmp_path: Path, new_group: bool) -> tuple[subprocess.Popen, int]:
    out = tmp_path / "stray.pid"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(out)], cwd=ROOT, start_new_session=new_group,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text()):
        assert time.monotonic() < deadline and owner.poll() is None, "the owner never started its stray process"
        time.sleep(0.05)  # poll a file another process writes
    return owner, int(out.read_text())


def watcher_of(owner: int) -> tuple[int, int]:
    """(pid, start time) of the owner's watcher."""
    for pid, start in descendants(owner, -1).items():
        if f"swarm.reaper\0{owner}" in Path(f"/proc/{pid}/cmdline").read_text():
            return pid, start
    raise AssertionError(f"no watcher among the descendants of {owner}")


def gone_within(pid: int, start: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive({pid: start}) and time.monotonic() < deadline:
        time.sleep(0.1)  # poll until the process has ended
    return not _alive({pid: start})


def test_a_group_leader_killed_outright_takes_a_process_it_never_saw_descend_from_it(tmp_path):
    owner, stray = start_owner(tmp_path, new_group=True)
    start = _stat(stray)[1]
    assert _stat(stray)[0] != owner.pid  # reparented: the watcher's look at the owner's tree misses it
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=30)
    assert gone_within(stray, start, 30.0), "the process the owner's group started outlived it"


def test_an_owner_that_does_not_lead_its_group_leaves_the_groups_other_processes_alone(tmp_path):
    owner, stray = start_owner(tmp_path, new_group=False)  # in this test process's group
    start = _stat(stray)[1]
    watcher = watcher_of(owner.pid)
    try:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        assert gone_within(*watcher, 30.0), "the watcher did not finish"  # whatever it ends, it has ended
        assert _alive({stray: start}), "a process of a group the owner does not lead was ended"
    finally:
        os.kill(stray, signal.SIGKILL)
