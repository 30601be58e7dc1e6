"""A joiner with no coordinator in the seat, in a whole swarm in memory (fp64): the leading head signs its tally of
the replicas' state hashes (`WorkRecords.vouch_states`) and holds the records; the joiner reads them over the record
share (swarm/replicas/head_vouched.py), refuses a hostile donor's noisy state although 50 free ids signed its hash,
and takes the honest donor's state, whose hash the head signed."""
from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from peer.checks.vouched_state import VouchedStates
from peer.runner.state_hash import state_sha256
from peer.state.state_transfer import load_state_bytes
from swarm.dht import LeaderLease, SwarmDHT
from swarm.dht.held import HeldRecords
from swarm.replicas.head_vouched import HeadVouches
from swarm.replicas.vouched import coordinator_vouches, vouched_states
from swarm.replicas.work_records import WorkRecords
from swarm.trust.identity import Identity
from tests.doubles.hostile_donor import serve_bad_state
from tests.peer.swarm_in_memory import make_swarm
from tests.peer.test_replicas import spec_for
from tests.swarm.memory_dht import Clock, MemoryDHT
from tests.swarm.test_head_vouched import Seat, asking, state_record

STEPS = 11  # odd: the last step is a hashed one (every 2nd here)


def head_records(spec, leader: Identity, held: HeldRecords) -> WorkRecords:
    """The leading head's work records as `ReplicaService` wires them, signed by `leader`; the coordinator away."""
    async def send_work(body: bytes) -> None:
        raise ConnectionError("no coordinator holds the seat")
    ctx = SimpleNamespace(peer_id=leader.peer_id, sdht=SimpleNamespace(identity=leader, held=held),
                          report=SimpleNamespace(write=lambda *a, **k: None))
    return WorkRecords(spec, ctx, SimpleNamespace(send_work=send_work), lambda coro: coro.close())


async def test_no_coordinator_a_joiner_refuses_a_sybil_backed_donor_and_takes_the_state_the_lease_head_signed(caplog):
    caplog.set_level(logging.WARNING, logger="peer.replica.stage_peer")
    spec = spec_for("subspace", "fp64")
    swarm = await make_swarm(spec, [1, 2])
    leader, head_held, sybil_held = Identity.generate(), HeldRecords(), HeldRecords()
    head = swarm.peers["s0r0"]
    for peer in swarm.peers.values():  # hashed every 2nd step; a donor serves a state at such a step
        peer.commit.hasher.every, peer.state.hashed_only = 2, True
    head.driver.votes.on_agreed = head_records(spec, leader, head_held).vouch_states
    hostile = swarm.peers["s1r1"]
    serve_bad_state(hostile, "near")  # trains honestly, serves noise, boasts 1e9 tokens/s
    sybils = [Identity.generate() for _ in range(50)]
    served: list[tuple[int, str]] = []
    noisy = hostile.state._snapshot

    def snapshot(follower: str, every: int = 1):  # 50 free ids sign the hash of the noisy state it serves
        got = noisy(follower, every)
        if got is not None:
            step, data = got
            served.append((step, state_sha256(load_state_bytes(data))))
            sybil_held.keep_work(spec.run_hash, {(s.peer_id, "state", step): state_record(
                spec.run_hash, s, step, {1: served[-1][1]}) for s in sybils})
        return got
    hostile.state._snapshot = snapshot

    sdht = SwarmDHT(MemoryDHT(Clock()), Identity.generate())  # the joiner's: its held records and record peers
    sdht.record_peers = asking(sybil_held, head_held)
    lease = LeaderLease(spec.run_hash, 3, [leader.peer_id])  # the swarm key's, held from before the outage

    async def current() -> LeaderLease:
        return lease
    heads, seat = HeadVouches(sdht, spec.run_hash, spec.n_stages, current), Seat(spec.run_hash, lapsed=True)

    def check() -> VouchedStates:
        return VouchedStates(lambda: vouched_states(sdht, spec.run_hash, 1, seat, heads), wait=60.0, poll=0.05,
                             every=2, unchecked=lambda: coordinator_vouches(seat))

    async def join() -> tuple[object, str]:
        while len(swarm.logs) < 3:
            await asyncio.sleep(0.01)  # poll the run's progress
        newcomer = await swarm.add(1, "s1new", announce="syncing")
        newcomer.commit.hasher.every = 2
        newcomer.vouched = check()
        announced = {p: swarm.peers[p].status().step for p in ("s1r1", "s1r0")}
        donor = await newcomer.join(["s1r1", "s1r0"], announced=announced)  # the liar first, as it boasts
        await newcomer.announce("online")
        return newcomer, donor
    try:
        task = asyncio.create_task(join())
        await swarm.drive(STEPS)
        newcomer, donor = await task
        await swarm.applied()
    finally:
        await swarm.stop()
    assert donor == "s1r0"
    assert served, "the hostile donor served nothing: the test tested nothing"
    step, bad = served[0]
    problem = await check().check(step, bad)  # what the joiner found: the 50 ids' hash is not the head's
    assert problem and "differs" in problem, problem
    assert state_sha256(newcomer.runner.state_dict()) == state_sha256(swarm.peers["s1r0"].runner.state_dict())
    signed = await heads.hashes(1)
    assert signed and all(h != bad for h in signed.values())
    assert newcomer.commit.hasher.last == (STEPS - 1, signed[STEPS - 1])  # the swarm's state, as its head signed
    assert any("s1r1"[-8:] in r.getMessage() and "is refused: its sha256 differs" in r.getMessage()
               for r in caplog.records), "the joiner did not refuse the hostile donor for its hash"
