"""A swarm with no coordinator at all (issue 56, item 2), in real processes over libp2p: a 2-stage subspace swarm
(a re-fit every 5 steps) with two heads, whose coordinator signs records that live only 8 s in the DHT
(`--record-ttl 8`, where the defaults are 60 s, 100 min, 1 h and 1 day: the same expiry, in seconds). The
coordinator is stopped (SIGTERM) and the test waits until the DHT holds none of its records (run spec, basis
chain, lease). Then: training went on with every step once; a newcomer (a second stage-1 replica) that joins
through a peer's address gets the run spec, the basis chain and the lease from the peers, each checked against the
swarm key, downloads the stage's state and takes part in the steps; and killing the leading head still hands the
steps to the next head of the lease."""
from __future__ import annotations

import asyncio
import signal
import time

import pytest

from protocol.spec import RunSpec, preset
from swarm.dht import RUN_KEY, SwarmDHT, basis_key, close_node, lease_key, start_dht
from swarm.local import LocalOptions, LocalSwarm
from tests.e2e.conftest import wait_for_event, wait_for_steps
from tests.e2e.processes import sigkill_and_wait_for_group

STEPS = "100000"  # the heads never finish: the test stops them
RECORD_TTL = 8
HEADS = ("stage0", "second")
TOOK = ("got the run spec from peer", "got the basis updates from peer", "got the leader lease from peer")


def _log(swarm: LocalSwarm, name: str) -> str:
    path = swarm.dir / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _driven(swarm: LocalSwarm, name: str) -> list[dict]:
    return [e for e in swarm.events(name) if e["event"] == "step"]


async def _poll(what: str, check, timeout: float):
    """Await `check()` until it returns something true; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:g} s")
        await asyncio.sleep(0.5)  # poll interval of the DHT
    return found


async def test_without_any_coordinator_training_goes_on_a_newcomer_joins_from_peers_and_heads_fail_over(tmp_path):
    spec = preset("tiny", stages=2, codec="subspace", basis_interval=5)
    swarm = LocalSwarm(LocalOptions(spec, steps=int(STEPS), workdir=str(tmp_path / "run"), threads=1, quiet=True,
                                    record_ttl=RECORD_TTL, extra_peer_args=["--ttl", "6"]))
    swarm.head_names = lambda: list(HEADS)  # whose reports hold the steps
    dht = None
    try:
        await asyncio.to_thread(swarm.start_coordinator, serving=False)
        for name in HEADS:
            swarm.start_peer(0, "--steps", STEPS, name=name)
        swarm.start_peer(1)
        heads = {name: wait_for_event(swarm, name, "ready")[0]["peer_id"] for name in HEADS}
        stage1 = wait_for_event(swarm, "stage1", "ready")[0]["maddrs"]
        await asyncio.to_thread(wait_for_steps, swarm, 12)  # two re-fits: basis versions 1 and 2 signed

        # a reader in the test process: what the DHT itself holds (it asks no peer)
        dht = await asyncio.to_thread(start_dht, swarm.maddrs + stage1, ["/ip4/127.0.0.1/tcp/0"], None, True)
        reader = SwarmDHT(dht)
        run = RunSpec.from_json((await reader.fetch_run_spec()).spec_json)
        await reader.adopt(run)
        await _poll("no basis version was signed", lambda: reader.fetch_bases(run.run_hash), 60)

        async def both_heads():
            lease = await reader.fetch_lease(run.run_hash)
            return lease is not None and set(heads.values()) <= set(lease.order)
        await _poll("the lease never named both heads", both_heads, 60)

        coordinator = dict(swarm.procs)["coordinator"]
        coordinator.send_signal(signal.SIGTERM)
        await asyncio.to_thread(coordinator.wait, 30)
        swarm.procs = [(n, p) for n, p in swarm.procs if n != "coordinator"]  # gone on purpose
        steps_at_stop = len(swarm.step_events()[0])

        async def all_expired():  # the entries themselves: a reader's fetch_lease gives the lease it holds
            keys = (RUN_KEY, basis_key(run.run_hash), lease_key(run.run_hash))
            return not any([(await reader.entries(key))[0] for key in keys])
        await _poll("the coordinator's records never expired from the DHT", all_expired, RECORD_TTL + 30)
        steps_at_expiry = len(swarm.step_events()[0])

        swarm.maddrs = stage1  # the newcomer knows a peer's address, not the (dead) coordinator's
        swarm.start_peer(1, name="newcomer")
        wait_for_event(swarm, "newcomer", "joined", 120)
        joined_at = len(swarm.step_events()[0])
        await asyncio.to_thread(wait_for_steps, swarm, joined_at + 6, 120)

        leader = max(HEADS, key=lambda n: max((e["time"] for e in _driven(swarm, n)), default=0.0))
        successor = next(n for n in HEADS if n != leader)
        killed_at, t_kill = len(swarm.step_events()[0]), time.time()
        await asyncio.to_thread(sigkill_and_wait_for_group, dict(swarm.procs)[leader])
        swarm.procs = [(n, p) for n, p in swarm.procs if n != leader]
        await asyncio.to_thread(wait_for_steps, swarm, killed_at + 4, 60.0)
    finally:
        if dht is not None:
            await close_node(dht)
        await asyncio.to_thread(swarm.stop, 5.0)

    newcomer = _log(swarm, "newcomer")
    story = f"--- newcomer.log\n{newcomer[-4000:]}"
    assert steps_at_expiry > steps_at_stop, "no step was driven while the coordinator's records expired"
    for line in TOOK:
        assert line in newcomer, f"the newcomer never logged {line!r}\n{story}"
    wire = [e for e in swarm.events("newcomer") if e["event"] == "wire"]
    assert wire and wire[-1]["synced_steps"] > 0, f"the newcomer took part in no step: {wire}\n{story}"
    after = [e for e in _driven(swarm, successor) if e["step"] > killed_at]
    assert after, f"the next head of the lease never drove a step\n--- {successor}\n{_log(swarm, successor)[-3000:]}"
    assert min(e["time"] for e in after) - t_kill <= 15.0, "the next head of the lease took over too late"
    driven = sorted(e["step"] for name in HEADS for e in _driven(swarm, name))
    assert driven == list(range(1, len(driven) + 1)), f"a step was lost or driven twice: {driven}"
