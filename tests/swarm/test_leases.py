"""Leader leases (swarm/replicas/leases.py, peer/step/leadership.py): the coordinator orders the heads by
when it first saw them, never by id; a dead leader's successor is next and the dead one, back,
comes last; --trusted-heads pins who may lead; a lease lives in the DHT under the swarm key only."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from swarm.dht import LeaderLease, RecordError, SwarmDHT, lease_key
from swarm.replicas.leases import LeaseKeeper, next_order
from swarm.trust.admission import AdmissionPolicy
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from tests.swarm.test_dht import eventually, swarm  # noqa: F401  (the fixture: two real DHT nodes)

RUN = "0123456789abcdef"


class Heads:
    """The DHT as a `LeaseKeeper` sees it: stage 0's announcements, and the leases it stores."""

    def __init__(self) -> None:
        self.heads: dict[str, str] = {}  # peer id -> state
        self.stamps: dict[str, float] = {}  # peer id -> when it last announced (default 1.0)
        self.stored: list[LeaderLease] = []

    async def stage_peers(self, run_hash: str, stage: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(peer_id=p, state=s, timestamp=self.stamps.get(p, 1.0))
                for p, s in sorted(self.heads.items())]

    async def fetch_lease(self, run_hash: str) -> LeaderLease | None:
        return self.stored[-1] if self.stored else None

    async def publish_lease(self, lease: LeaderLease, ttl: float) -> bool:
        self.stored.append(LeaderLease.from_record(lease.to_record()))  # a copy, as the DHT would keep
        return True


def test_next_order_keeps_the_order_appends_newcomers_and_pins_trusted_heads():
    assert next_order(["B", "C"], ["C", "B", "A"]) == ["B", "C", "A"]  # A: lowest id, but new: last
    assert next_order(["B", "C"], ["C", "A"]) == ["C", "A"]  # B gone: its successor first
    assert next_order([], ["C", "B", "A"], trusted=["A", "X", "B"]) == ["A", "B"]  # only pinned, as given


async def test_a_keeper_orders_heads_by_seniority_drops_a_dead_leader_and_puts_it_last_when_it_returns():
    dht, alive = Heads(), {"M", "N", "A"}

    async def probe(peer: str) -> bool:
        return peer in alive
    keeper = LeaseKeeper(dht, RUN, probe, republish_s=1e9)
    dht.heads["M"] = "online"
    first = await keeper.tick()
    dht.heads |= {"N": "online", "A": "online", "Z": "syncing"}  # later, A with the lowest id; Z not live
    second = await keeper.tick()
    together = sorted(["A", "N"], key=keeper._tie)  # first seen in the same round: the keeper's keyed draw
    assert first.order == ["M"] and second.order == ["M", *together] and second.term > first.term
    assert await keeper.tick() is second and len(dht.stored) == 2  # unchanged: no new term, nothing stored
    alive.discard("M")  # the leader is killed; its record outlives it
    assert (await keeper.tick()).order == ["M", *together]  # one failed probe is not yet death
    third = await keeper.tick()
    assert third.order == together and third.term > second.term  # its successor leads
    assert (await keeper.tick()).order == together  # M's old record is still there: M stays out
    alive.add("M")
    dht.stamps["M"] = 2.0  # M restarted and announced again: it comes back last
    third = await keeper.tick()
    assert third.order == [*together, "M"]
    # a restarted coordinator reads the lease and keeps its order and terms
    again = LeaseKeeper(dht, RUN, probe, republish_s=1e9)
    again.lease = await dht.fetch_lease(RUN)
    dht.heads["B"] = "online"
    assert (await again.tick()).order == [*together, "M", "B"] and dht.stored[-1].term > third.term


async def test_heads_first_seen_together_are_not_ordered_by_id():
    """A stranger that starts with the honest heads (a new swarm) wins the tie as often as not, however
    low the id it ground: the tie is the keeper's keyed hash, a secret the stranger cannot grind against."""
    ground_first = 0
    for _ in range(200):
        dht = Heads()
        dht.heads |= {"1111ground": "online", "zzzzhonest": "online"}
        ground_first += (await LeaseKeeper(dht, RUN).tick()).order[0] == "1111ground"
    assert 60 <= ground_first <= 140, ground_first  # binomial(200, 1/2): outside this once in ~10^8


async def three_heads(**options) -> tuple[Heads, list[float], LeaseKeeper]:
    """A keeper on a manual clock that saw M, then S, then G, one round apart: the order M, S, G."""
    dht, now = Heads(), [0.0]
    keeper = LeaseKeeper(dht, RUN, republish_s=1e9, clock=lambda: now[0], **options)
    for head in ("M", "S", "G"):
        dht.heads[head] = "online"
        lease = await keeper.tick()
        now[0] += 1
    assert lease.order == ["M", "S", "G"]
    return dht, now, keeper


async def test_a_head_whose_record_lapsed_keeps_its_place_for_the_grace_and_then_comes_back_last():
    """A late heartbeat, or a DHT read that missed one record, must not put an honest head behind every
    head that joined after it (the successor of a leader killed next would then be the newcomer)."""
    dht, now, keeper = await three_heads(absent_grace_s=30.0)
    del dht.heads["S"]  # S's record is missing from one read
    now[0] += 1
    assert (await keeper.tick()).order == ["M", "S", "G"]
    dht.heads["S"] = "online"  # its next heartbeat
    now[0] += 1
    assert (await keeper.tick()).order == ["M", "S", "G"] and len(dht.stored) == 3  # no new term either
    del dht.heads["S"]  # gone for longer than the grace: it comes back last
    now[0] += 29
    assert (await keeper.tick()).order == ["M", "S", "G"]
    now[0] += 2
    assert (await keeper.tick()).order == ["M", "G"]
    dht.heads["S"] = "online"
    now[0] += 1
    assert (await keeper.tick()).order == ["M", "G", "S"]


@pytest.mark.parametrize("state", ["leaving", "syncing"])
async def test_a_head_that_announces_it_is_not_live_leaves_the_order_at_once(state):
    dht, now, keeper = await three_heads()
    dht.heads["S"] = state  # it said so itself: nothing to hold
    now[0] += 1
    assert (await keeper.tick()).order == ["M", "G"]
    dht.heads["S"] = "online"
    now[0] += 1
    assert (await keeper.tick()).order == ["M", "G", "S"]


async def test_trusted_heads_alone_may_lead():
    dht = Heads()
    dht.heads |= {"A": "online", "T": "online", "U": "online"}
    keeper = LeaseKeeper(dht, RUN, trusted=["U", "T"])
    assert (await keeper.tick()).order == ["U", "T"]


def test_a_lease_record_is_checked_like_every_record():
    assert LeaderLease.from_record(LeaderLease(RUN, 3, ["B", "A"]).to_record()).order == ["B", "A"]
    for bad in ({"order": ["A", "A"]}, {"term": -1}, {"order": "A"}, {"term": 1.5}):
        with pytest.raises(RecordError):
            LeaderLease.from_record({**LeaderLease(RUN, 3, ["A"]).to_record(), **bad})


def swarm_key_views(swarm) -> tuple[SwarmDHT, SwarmDHT, SwarmDHT]:  # noqa: F811
    """Over the two real nodes: the coordinator (the swarm key), a forger with its own key, and a
    reader that adopted the swarm key from the run spec."""
    key, stranger = SigningKey.generate(), SigningKey.generate()
    policy = AdmissionPolicy(False, key.public_bytes())
    return (SwarmDHT(swarm.first.dht, Identity.of_key(key), swarm_key=key, policy=policy),
            SwarmDHT(swarm.first.dht, Identity.of_key(stranger), swarm_key=stranger),
            SwarmDHT(swarm.second.dht, policy=policy))


@pytest.mark.e2e
async def test_only_the_swarm_keys_lease_is_read_over_a_real_dht(swarm):  # noqa: F811
    coordinator, forger, reader = swarm_key_views(swarm)
    assert await forger.publish_lease(LeaderLease(RUN, 10**15, ["EVIL"]), 60)  # stored under its own key
    assert await reader.fetch_lease(RUN) is None
    assert await coordinator.publish_lease(LeaderLease(RUN, 7, ["B", "A"]), 60)
    lease = await eventually(lambda: reader.fetch_lease(RUN))  # the record travels between the nodes
    assert lease.order == ["B", "A"] and lease.term == 7
    envelopes, problems = await reader.entries(lease_key(RUN))
    assert len(envelopes) == 1 and any("not by the swarm key" in p for p in problems)  # the forged one, refused
    with pytest.raises(RecordError):
        await SwarmDHT(swarm.second.dht).fetch_lease(RUN)  # no coordinator key to trust yet: one clear error


async def test_heads_that_did_checked_work_go_ahead_of_heads_that_only_announced():
    """Issue 57, item 6: a stranger reaches the line of successors only after a leader's signed work record
    names it among stage 0's workers; announcing stage 0 early is not enough."""
    dht = Heads()
    keeper = LeaseKeeper(dht, RUN, republish_s=1e9)
    dht.heads["A"] = "online"
    assert (await keeper.tick()).order == ["A"]  # a new swarm: nobody worked yet, the first head leads
    fakes = {"F1": "online", "F2": "online", "F3": "online"}
    dht.heads |= fakes  # three ids that announce stage 0 and never work
    assert (await keeper.tick()).order[0] == "A"
    keeper.note_work(SimpleNamespace(workers={0: ["A"], 1: ["S"]}))  # the leader's record after a snapshot step
    dht.heads["H"] = "online"  # a real head joins after the fakes
    order = (await keeper.tick()).order
    assert order[0] == "A" and order[-1] == "H" and set(order[1:4]) == set(fakes)  # no work of its own yet
    keeper.note_work(SimpleNamespace(workers={0: ["A", "H"], 1: ["S"]}))  # it drove microbatches of a step
    order = (await keeper.tick()).order
    assert order[:2] == ["A", "H"] and set(order[2:]) == set(fakes)
    assert dht.stored[-1].order == order  # what the swarm reads
    dht.heads["A"] = "leaving"  # the leader goes: the head that worked succeeds it, not a fake
    assert (await keeper.tick()).order[0] == "H"
    assert "S" not in keeper.worked  # only stage 0's workers are heads
    pinned = LeaseKeeper(Heads(), RUN, trusted=["F1", "H"])
    pinned.sdht.heads |= {"F1": "online", "H": "online"}
    pinned.note_work(SimpleNamespace(workers={0: ["H"]}))
    assert (await pinned.tick()).order == ["F1", "H"]  # --trusted-heads: the operator's order, as given
