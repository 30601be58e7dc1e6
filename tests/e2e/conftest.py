"""Fixtures that start real swarm processes and always stop them (process groups, p2pd too)."""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from protocol.spec import preset
from swarm.launch.fork_server import ForkServer
from swarm.local import LocalOptions, LocalSwarm

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    """Every test under tests/e2e starts real processes: all of them are e2e (this hook sees every item)."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def make_swarm(tmp_path, session_fork_server):
    """make_swarm(**preset_overrides) -> a LocalSwarm whose processes are stopped at teardown."""
    started: list[LocalSwarm] = []

    def make(**overrides) -> LocalSwarm:
        spec = preset("tiny", **{"stages": 3, **overrides})
        swarm = LocalSwarm(LocalOptions(spec, workdir=str(tmp_path / f"swarm{len(started)}"), threads=1, quiet=True),
                           fork_server=session_fork_server)
        started.append(swarm)
        return swarm

    yield make
    for swarm in started:
        # the test is over: its peers need not leave gracefully (test_interrupt.py and test_lifecycle.py test that
        # they do), and a peer stopped mid-step gives its sends in flight 2 s to finish (Daemon.drain)
        swarm.stop(grace=0.5)


def wait_for_event(swarm: LocalSwarm, name: str, event: str, timeout: float = 120.0, count: int = 1) -> list[dict]:
    """Poll a peer's report until `count` events of this kind are there (or fail with its log)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in swarm.events(name) if e["event"] == event]
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            log = (swarm.dir / f"{name}.log").read_text()[-3000:] if (swarm.dir / f"{name}.log").exists() else ""
            pytest.fail(f"{name} reported no {event!r} within {timeout} s; its log ends with:\n{log}")
        try:
            swarm._check_alive()
        except Exception:
            # the process may have written the event and exited since we read the report
            if len([e for e in swarm.events(name) if e["event"] == event]) >= count:
                continue
            raise
        time.sleep(0.1)  # poll interval of a report file written by another process


async def follow_beside_oracle(swarm: LocalSwarm, spec, steps: int) -> tuple[list[dict], list[float]]:
    """The head's step records to the run's end, and the one-process oracle's losses of the same run, which trains
    meanwhile (one torch thread; ~20 s of CPU on a busy 2-core box, which the swarm's peers, waiting on each other's
    messages most of a step, leave partly idle). The caller stops the swarm."""
    from tests.peer.swarm_in_memory import oracle
    want = asyncio.create_task(asyncio.to_thread(oracle, spec, steps))
    records = await asyncio.to_thread(swarm.follow, 120.0)
    await asyncio.to_thread(swarm.wait_for_head)
    return records, await want


def wait_for_steps(swarm: LocalSwarm, count: int, timeout: float = 120.0) -> list[dict]:
    """Poll the heads' reports until the swarm has done `count` steps, whichever head drove them."""
    deadline = time.monotonic() + timeout
    while True:
        steps, done = swarm.step_events()
        if len(steps) >= count or done:
            return steps
        if time.monotonic() > deadline:
            pytest.fail(f"the swarm did {len(steps)} of {count} steps within {timeout} s; see the logs in {swarm.dir}")
        swarm._check_alive()
        time.sleep(0.1)  # poll interval of report files written by other processes


def read_json(path) -> dict:
    return json.loads(path.read_text())


_command_runs = itertools.count()


def swarm_command(server: ForkServer | None, argv: list[str], env: dict[str, str], folder: Path,
                  timeout: float = 120.0) -> subprocess.CompletedProcess:
    """`swarm ARGV` in a process of its own, its output captured, forked from `server` as a local swarm's
    processes are (its imports are the server's: ~2.5 CPU-s less, taken from a swarm that trains meanwhile);
    without a server (SWARM_FORK_SERVER=0), a plain `python -m swarm.cli`. Its output files go to `folder`."""
    if server is None:
        return subprocess.run([sys.executable, "-m", "swarm.cli", *argv], capture_output=True, text=True,
                              timeout=timeout, env=env)
    n = next(_command_runs)
    out, err = folder / f"command{n}.out", folder / f"command{n}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = server.popen(argv, stdout=o, stderr=e, env=env)
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # with whatever it started (its p2pd)
            proc.wait(timeout=10)
    return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())
