"""The steps trained while the coordinator's seat was empty are vouched for once a standby takes it (issue 56), in
real processes over libp2p: a 2-stage swarm with its coordinator and a `swarm coordinator --standby` holding the same
key. The coordinator's whole process group is killed (SIGKILL: every send to it fails at once, where a paused one's
timeouts let a late retry reach the standby). The leading head's state records of the steps hashed between the kill
and the standby's takeover reached no coordinator; it kept them (swarm/replicas/work_outbox.py) and sent them to the
standby, which vouches for them under the swarm key: they are in the DHT's vouched state hashes. Before, they were
lost, and a joiner whose donor sat at such a step was refused."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time

import pytest

from protocol.spec import RunSpec, preset
from swarm.dht import SwarmDHT, start_dht, stop_dht
from swarm.local import LocalOptions, LocalSwarm
from tests.e2e.conftest import wait_for_steps

STEPS = 100000  # the head never finishes: the test stops it
LOCAL = ["/ip4/127.0.0.1/tcp/0"]


def _wait_for_line(swarm: LocalSwarm, name: str, pattern: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    path = swarm.dir / f"{name}.log"
    while not (path.exists() and re.search(pattern, path.read_text(errors="replace"))):
        if time.monotonic() > deadline:
            pytest.fail(f"{name} never logged {pattern!r} within {timeout} s; see {path}")
        time.sleep(0.1)  # poll interval of a log another process writes


def _state_records(swarm: LocalSwarm) -> list[dict]:
    """The leading heads' tallies of the state hashes (each one a work record sent to the coordinator)."""
    return [e for name in swarm.head_names() for e in swarm.events(name) if e["event"] == "state_record"]


async def _vouched_states(maddrs: list[str], want: set[int], timeout: float) -> set[int]:
    """Poll the DHT (through a node of our own, joined at `maddrs`) until the swarm key vouches for the state
    hashes of every step in `want`; the steps it vouches for at the end."""
    dht = await asyncio.to_thread(start_dht, maddrs, LOCAL, None, True)
    try:
        sdht = SwarmDHT(dht)
        signed = await sdht.fetch_run_spec()
        assert signed is not None, "no run spec in the DHT"
        spec = RunSpec.from_json(signed.spec_json)
        await sdht.adopt(spec)
        deadline, steps = time.monotonic() + timeout, set()
        while time.monotonic() < deadline:
            vouched = await sdht.fetch_vouched(spec.run_hash, states=True)
            steps = set(vouched.steps) if vouched is not None else set()
            if want <= steps:
                break
            await asyncio.sleep(0.5)  # poll interval of a record other processes write
        return steps
    finally:
        await asyncio.to_thread(stop_dht, dht)


async def test_the_steps_hashed_while_the_seat_was_empty_are_vouched_once_a_standby_takes_it(tmp_path):
    spec = preset("tiny", stages=2)
    swarm = LocalSwarm(LocalOptions(spec, steps=STEPS, workdir=str(tmp_path / "run"), threads=1, quiet=True,
                                    extra_peer_args=["--ttl", "6"]))
    standby_file = tmp_path / "standby.json"
    try:
        await asyncio.to_thread(swarm.start_coordinator)
        swarm.spawn("standby", ["coordinator", "--standby", "--initial-peers", swarm.maddrs[0],
                                "--key", str(swarm.dir / "swarm.key"), "--state-dir", str(tmp_path / "standby"),
                                "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--maddrs-file", str(standby_file)])
        for stage in range(spec.n_stages):
            swarm.start_peer(stage, *(["--steps", str(STEPS)] if stage == 0 else []))
        await asyncio.to_thread(_wait_for_line, swarm, "standby", r"standing by: coordinator", 90)
        await asyncio.to_thread(wait_for_steps, swarm, 12)
        assert _state_records(swarm), "the leading head tallied no state hash before the kill"

        coordinator = dict(swarm.procs)["coordinator"]
        os.killpg(os.getpgid(coordinator.pid), signal.SIGKILL)  # the coordinator, its DHT node and its p2pd
        killed = time.time()
        await asyncio.to_thread(coordinator.wait, 30)
        swarm.procs = [(n, p) for n, p in swarm.procs if n != "coordinator"]  # gone on purpose
        await asyncio.to_thread(_wait_for_line, swarm, "standby", r"this coordinator holds the seat", 60)
        took = time.time()
        steps_at_takeover = len(swarm.step_events()[0])
        await asyncio.to_thread(wait_for_steps, swarm, steps_at_takeover + 8, 120)

        outage = {e["step"] for e in _state_records(swarm) if killed <= e["time"] < took}
        print(f"takeover {took - killed:.1f} s after the kill; state steps hashed meanwhile: {sorted(outage)}")
        assert outage, "the swarm hashed no state while the seat was empty: the test shows nothing"
        vouched = await _vouched_states(json.loads(standby_file.read_text())["maddrs"], outage, 60.0)
    finally:
        await asyncio.to_thread(swarm.stop, 5.0)
    missing = sorted(outage - vouched)
    assert not missing, f"the standby never vouched for steps {missing} (it vouches for {sorted(vouched)})"
