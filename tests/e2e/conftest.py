"""Fixtures that start real swarm processes and always stop them (process groups, p2pd too)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from protocol.spec import preset
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
        swarm.stop(grace=5.0)


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
