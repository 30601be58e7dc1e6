"""With no coordinator in the seat, a joiner checks a donor's state against the hashes a head the leader lease
names signed (swarm/replicas/head_vouched.py), served by the head and re-served by the peers that read them
(kind `rec`, want "work"): what counts (a lease head's signature, not a headcount of free ids), what a conflict
reads as, that the lease's swarm-key records still count while a coordinator holds the seat, and that a joiner
with no head record at all waits and refuses instead of taking the state on its donor's word."""
from __future__ import annotations

from types import SimpleNamespace

import msgpack

from peer.checks.vouched_state import VouchedStates
from protocol.spec import preset
from protocol.step_record import WorkRecord
from swarm.coordinator.options import sealed_spec
from swarm.dht import LeaderLease, SwarmDHT, VouchedSnapshots
from swarm.dht.held import WORK_STEPS, HeldRecords
from swarm.dht.record_share import PeerRecords, RecordShare
from swarm.replicas.head_vouched import HeadVouches, agreed, head_record
from swarm.replicas.vouched import coordinator_vouches, vouched_hashes, vouched_states
from swarm.replicas.work_records import WorkRecords
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from swarm.trust.signed_records import sign_record
from tests.swarm.memory_dht import Clock, MemoryDHT

SPEC = preset("tiny", stages=2)


def sha(n: int) -> str:
    return f"{n:064x}"


def state_record(run: str, head: Identity, step: int, hashes: dict[int, str]) -> bytes:
    return sign_record(head)(WorkRecord(run, step, head.peer_id, {}, state_step=step, states=hashes)).encode()


class Seat:
    """`ActiveCoordinator` as `vouched.py` reads it: whether the seat's claim lapsed."""

    def __init__(self, run_hash: str, lapsed: bool) -> None:
        self.run_hash, self.is_lapsed = run_hash, lapsed

    async def lapsed(self) -> bool:
        return self.is_lapsed


def asking(*helds: HeldRecords) -> PeerRecords:
    """A reader's record peers: the holders of `helds`, by index, each served as any peer serves its records."""
    shares = [RecordShare(h) for h in helds]

    async def request(peer: str, _kind: str, body: bytes, _timeout: float) -> bytes:
        return await shares[int(peer)].on_request(body, "joiner")

    async def candidates() -> list[str]:
        return [str(i) for i in range(len(shares))]
    return PeerRecords(request, candidates, every_s=0.0)


def reader(lease: LeaderLease, *helds: HeldRecords) -> tuple[SwarmDHT, HeadVouches]:
    sdht = SwarmDHT(MemoryDHT(Clock()), Identity.generate())
    sdht.record_peers = asking(*helds)

    async def current() -> LeaderLease:
        return lease
    return sdht, HeadVouches(sdht, lease.run_hash, SPEC.n_stages, current)


def run_hash() -> str:
    return sealed_spec(SPEC, SigningKey.generate()).run_hash


def test_a_record_counts_only_if_a_head_the_lease_names_signed_it_for_this_run():
    run, leader, sybil, revoked = run_hash(), Identity.generate(), Identity.generate(), Identity.generate()
    heads = {leader.peer_id}
    good = state_record(run, leader, 8, {0: sha(1), 1: sha(2)})
    assert head_record(good, run, 2, heads).states == {0: sha(1), 1: sha(2)}
    assert head_record(state_record(run, sybil, 8, {1: sha(3)}), run, 2, heads) is None  # not in the lease
    assert head_record(state_record(run, revoked, 8, {1: sha(3)}), run, 2, heads) is None
    assert head_record(good, "0" * 16, 2, heads) is None  # another run's
    # a Sybil that names the lease head as its record's leader, signed with its own key: the key is not the head's
    forged = sign_record(sybil)(WorkRecord(run, 8, leader.peer_id, {}, state_step=8, states={1: sha(3)})).encode()
    assert head_record(forged, run, 2, heads) is None
    # a peer that re-serves the head's record and changes its hash breaks the signature
    tampered = msgpack.unpackb(good, raw=False, strict_map_key=False)
    tampered["z"][1] = sha(3)
    assert head_record(msgpack.packb(tampered, use_bin_type=True), run, 2, heads) is None
    rollback = sign_record(leader)(WorkRecord(run, 9, leader.peer_id, {}, rolled_back_to=4)).encode()
    assert head_record(rollback, run, 2, heads) is None  # names no hash
    assert head_record(b"\x00" * 10, run, 2, heads) is None


def test_a_step_and_stage_that_two_records_name_differently_is_left_out():
    run, a, b = run_hash(), Identity.generate(), Identity.generate()
    records = [head_record(state_record(run, h, 8, hashes), run, 2, {a.peer_id, b.peer_id})
               for h, hashes in ((a, {0: sha(1), 1: sha(2)}), (b, {0: sha(1), 1: sha(9)}), (a, {0: sha(5)}))]
    assert agreed(records[:2], "state") == {8: {0: sha(1)}}  # stage 1 differs: left out; stage 0 agrees
    assert agreed(records, "state") == {}  # the same head, twice, differently (a rollback's re-drive)
    assert agreed(records[:1], "snapshot") == {}


async def test_without_a_coordinator_a_joiner_reads_the_lease_heads_hashes_and_sybils_count_for_nothing():
    spec, leader, standby = sealed_spec(SPEC, SigningKey.generate()), Identity.generate(), Identity.generate()
    run = spec.run_hash
    lease = LeaderLease(run, 4, [leader.peer_id, standby.peer_id])
    head = HeldRecords()  # the leading head holds what it signs (WorkRecords.vouch_states)
    sent: list[bytes] = []

    async def send_work(body: bytes) -> None:
        sent.append(body)
    ctx = SimpleNamespace(peer_id=leader.peer_id, sdht=SimpleNamespace(identity=leader, held=head),
                          report=SimpleNamespace(write=lambda *a, **k: None))
    records = WorkRecords(spec, ctx, SimpleNamespace(send_work=send_work), lambda coro: coro.close())
    for step in (4, 8):
        records.vouch_states(step, {0: sha(step), 1: sha(step + 1)})
    records.after_commit(8, {0: [leader.peer_id]}, (8, {0: sha(80), 1: sha(81)}))  # every stage snapshotted at 8
    # 200 free ids each sign another hash for the same steps, and serve those: no headcount makes them count
    sybils = HeldRecords()
    for _ in range(200):
        sybil = Identity.generate()
        sybils.keep_work(run, {(sybil.peer_id, "state", t): state_record(run, sybil, t, {1: sha(666)})
                               for t in (4, 8)})
    sdht, heads = reader(lease, sybils, head)
    seat = Seat(run, lapsed=True)
    assert await vouched_states(sdht, run, 1, seat, heads) == {4: sha(5), 8: sha(9)}
    assert await vouched_states(sdht, run, 0, seat, heads) == {4: sha(4), 8: sha(8)}
    assert await vouched_hashes(sdht, run, 1, seat, heads) == {8: sha(81)}  # a restore's: the snapshot it signed
    assert not await coordinator_vouches(seat)
    # the joiner holds what it read, and re-serves it: a newcomer that reaches only the joiner reads the same
    assert set(sdht.held.work) == {(leader.peer_id, "state", 4), (leader.peer_id, "state", 8),
                                   (leader.peer_id, "snapshot", 8)}
    later, later_heads = reader(lease, sdht.held)
    assert await later_heads.hashes(1) == {4: sha(5), 8: sha(9)}
    # a new lease that no longer names the head (nor revokes it: it is gone): its records count no more
    lease.order, lease.term = [standby.peer_id], 5
    assert await heads.hashes(1) == {}


async def test_a_live_coordinator_s_records_still_count_and_the_heads_do_not_override_them():
    clock, key = Clock(), SigningKey.generate()
    spec = sealed_spec(SPEC, key)
    coordinator = SwarmDHT(MemoryDHT(clock), swarm_key=key)
    sdht = SwarmDHT(coordinator.dht, Identity.generate())
    await sdht.adopt(spec)
    await coordinator.publish_vouched(VouchedSnapshots(spec.run_hash, {8: {0: sha(1), 1: sha(2)}}), 86400.0,
                                      states=True)
    leader = Identity.generate()
    head = HeldRecords()
    head.keep_work(spec.run_hash, {(leader.peer_id, "state", 8): state_record(spec.run_hash, leader, 8, {1: sha(7)})})
    sdht.record_peers = asking(head)

    async def current() -> LeaderLease:
        return LeaderLease(spec.run_hash, 1, [leader.peer_id])
    heads = HeadVouches(sdht, spec.run_hash, SPEC.n_stages, current)
    seat = Seat(spec.run_hash, lapsed=False)
    assert await vouched_states(sdht, spec.run_hash, 1, seat, heads) == {8: sha(2)}  # the swarm key's, as before
    assert await vouched_hashes(sdht, spec.run_hash, 1, seat, heads) == {}
    assert await coordinator_vouches(seat) and await coordinator_vouches(None)
    seat.is_lapsed = True
    assert await vouched_states(sdht, spec.run_hash, 1, seat, heads) == {8: sha(7)}


async def test_without_a_coordinator_and_no_head_record_a_joiner_waits_then_refuses():
    async def none() -> dict[int, str]:
        return {}

    async def lapsed() -> bool:
        return False
    problem = await VouchedStates(none, wait=0.3, poll=0.01, unchecked=lapsed).check(8, sha(8))
    assert problem and "no head the leader lease names has signed" in problem
    assert await VouchedStates(none, wait=0.3, poll=0.01).check(8, sha(8)) is None  # a coordinator's swarm: as before
    known = {8: sha(8)}

    async def some() -> dict[int, str]:
        return known
    check = VouchedStates(some, wait=0.3, poll=0.01, unchecked=lapsed)
    assert await check.check(8, sha(8)) is None
    assert "differs" in await check.check(8, sha(9))


def test_the_held_records_keep_the_newest_steps_of_each_kind_and_a_rollback_drops_the_steps_after_it():
    run, head = run_hash(), Identity.generate()
    held = HeldRecords()
    for step in range(1, WORK_STEPS["state"] + 11):
        held.keep_work(run, {(head.peer_id, "state", step): state_record(run, head, step, {0: sha(step)})})
    held.keep_work(run, {(head.peer_id, "snapshot", 2): b"snapshot record"})
    assert sorted(t for _, w, t in held.work if w == "state") == list(range(11, WORK_STEPS["state"] + 11))
    assert (head.peer_id, "snapshot", 2) in held.work  # snapshot steps are kept apart: not pushed out by states
    held.forget_work_after(40)
    assert max(t for _, _, t in held.work) == 40
    assert held.work_of("0" * 16) == [] and held.reply("work", "0" * 16, 0).record == b""
    assert len(msgpack.unpackb(held.reply("work", run, 0).record)) == len(held.work)
