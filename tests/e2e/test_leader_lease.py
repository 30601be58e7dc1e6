"""Leadership comes from the swarm key's lease (issue 20, item 1), in real processes over libp2p: a
head with a ground lower id than every honest head never leads, and when the leading head is
killed with the coordinator already stopped, the next head of the lease drives the next step
within 10 s. (Before leases the lowest id among heads at the swarm's step took over: the
stranger.)"""
from __future__ import annotations

import asyncio
import os
import signal
import time

from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from swarm.trust.identity import Identity
from tests.e2e.conftest import wait_for_event, wait_for_steps
from tests.e2e.processes import sigkill_and_wait_for_group

STEPS = "100000"  # the heads never finish: the test stops them


def _ground_below(ids: list[str], path) -> str:
    """Write an identity whose peer id sorts below every id of `ids` (a few tries: keys are free)."""
    while True:
        identity = Identity.generate()
        if identity.peer_id < min(ids):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(identity.to_bytes())
            return identity.peer_id


def _steps_by(swarm: LocalSwarm, name: str) -> list[dict]:
    return [e for e in swarm.events(name) if e["event"] == "step"]


def _story(swarm: LocalSwarm, *names: str) -> str:
    """What a failure needs: the leases the coordinator signed and the heads' logs without their steps."""
    out = []
    for name in names:
        path = swarm.dir / f"{name}.log"
        lines = path.read_text().splitlines() if path.exists() else []
        keep = [ln for ln in lines if "lease" in ln] if name == "coordinator" else \
            [ln for ln in lines if " loss " not in ln and "computed 1 microbatch" not in ln][-40:]
        out.append(f"--- {name}.log\n" + "\n".join(keep))
    return "\n".join(out)


async def test_a_ground_low_id_head_never_leads_and_the_lease_successor_takes_over_without_the_coordinator(tmp_path):
    spec = preset("tiny", stages=2, batch_size=16, microbatch_size=8)
    swarm = LocalSwarm(LocalOptions(spec, steps=int(STEPS), workdir=str(tmp_path / "lease"), threads=1, quiet=True,
                                    extra_peer_args=["--ttl", "6"]))
    try:
        swarm.head_names = lambda: ["stage0", "second", "ground"]  # whose reports hold the steps
        await asyncio.to_thread(swarm.start)
        swarm.start_peer(0, "--steps", STEPS, name="second")
        honest = {name: wait_for_event(swarm, name, "ready")[0]["peer_id"] for name in ("stage0", "second")}
        await asyncio.to_thread(wait_for_steps, swarm, 3)
        ground = _ground_below(list(honest.values()), tmp_path / "ground.id")
        swarm.start_peer(0, "--steps", STEPS, "--identity", str(tmp_path / "ground.id"), name="ground")
        wait_for_event(swarm, "ground", "ready")
        joined_at = len(swarm.step_events()[0])
        await asyncio.to_thread(wait_for_steps, swarm, joined_at + 10)

        coordinator = dict(swarm.procs)["coordinator"]
        coordinator.send_signal(signal.SIGTERM)
        await asyncio.to_thread(coordinator.wait, 30)
        swarm.procs = [(n, p) for n, p in swarm.procs if n != "coordinator"]  # gone on purpose
        leader = max(honest, key=lambda n: max((e["time"] for e in _steps_by(swarm, n)), default=0.0))
        successor = next(n for n in honest if n != leader)
        killed_at = len(swarm.step_events()[0])
        t_kill = time.time()
        await asyncio.to_thread(sigkill_and_wait_for_group, dict(swarm.procs)[leader])
        swarm.procs = [(n, p) for n, p in swarm.procs if n != leader]
        await asyncio.to_thread(wait_for_steps, swarm, killed_at + 5, 60.0)
    finally:
        await asyncio.to_thread(swarm.stop, 5.0)
    assert ground < min(honest.values())  # the stranger's id is the lowest of all heads
    story = _story(swarm, "coordinator", leader, successor, "ground")
    driven = [e["step"] for e in _steps_by(swarm, "ground")]
    assert driven == [], f"the head with the ground low id drove steps {driven}\n{story}"
    after = [e for e in _steps_by(swarm, successor) if e["step"] > killed_at]
    assert after, f"the next head of the lease never drove a step\n{story}"
    first = min(e["time"] for e in after)
    assert first - t_kill <= 10.0, f"the next step came {first - t_kill:.1f} s after the leader was killed"
    steps = sorted(e["step"] for e in swarm.step_events()[0])
    assert steps == list(range(1, len(steps) + 1))  # no step lost or doubled across the handover
