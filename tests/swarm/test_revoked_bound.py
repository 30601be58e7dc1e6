"""The leader lease's revoked list stays within what a stored lease may carry (`MAX_REVOKED`,
swarm/dht/records.py), however many cheap ids get revoked: the coordinator drops the oldest
revocations of heads that cost nothing, never a head that led or did checked work while one of those
is left (swarm/replicas/leases.py)."""
from __future__ import annotations

from types import SimpleNamespace

from swarm.dht import LeaderLease
from swarm.dht.records import MAX_REVOKED
from swarm.replicas.leases import LeaseKeeper
from tests.swarm.test_leases import RUN, Heads


async def test_a_flood_of_cheap_revocations_keeps_the_lease_valid_and_the_real_offenders_revoked():
    dht = Heads()
    dht.heads = {"L": "online", "W": "online", "H": "online"}
    keeper = LeaseKeeper(dht, RUN, republish_s=1e9)
    keeper.note_work(SimpleNamespace(workers={0: ["W", "H"]}))  # W and H did checked work
    await keeper.tick()
    assert await keeper.revoke("L", "fed other data", rollback_to=2, caught=5)  # it led: caught at step 5
    assert await keeper.revoke("W", "refused the run's data")  # a head that worked
    first_rollback = keeper.rollback[0]
    cheap = [f"fake-{i:05d}" for i in range(MAX_REVOKED + 50)]
    for p in cheap:
        await keeper.revoke(p, "reported the run's data as other data")
    stored = dht.stored[-1]  # stored (the copy went through the record's checks): the keeper can still publish
    assert len(stored.revoked) == MAX_REVOKED == len(keeper.revoked)
    assert {"L", "W"} <= set(stored.revoked)  # the costly revocations stay
    assert stored.revoked[2:] == cheap[-(MAX_REVOKED - 2):]  # the oldest cheap ones went, the newest stay
    assert "L" not in stored.order and "W" not in stored.order and "H" in stored.order
    # a later rollback is numbered above every earlier one, whatever the list's length now
    await keeper.revoke("H", "fed other data", rollback_to=3, caught=9)
    assert keeper.rollback[0] > first_rollback and dht.stored[-1].rollback_id == keeper.rollback[0]
    assert "H" in dht.stored[-1].revoked and len(dht.stored[-1].revoked) == MAX_REVOKED
    LeaderLease.from_record(dht.stored[-1].to_record())  # and it reads back


async def test_revocations_read_from_a_stored_lease_are_not_dropped_before_new_cheap_ones():
    dht = Heads()
    old = [f"old-{i:04d}" for i in range(MAX_REVOKED)]
    dht.stored.append(LeaderLease(RUN, 1, [], revoked=old))
    keeper = LeaseKeeper(dht, RUN, republish_s=1e9)
    await keeper.load()
    await keeper.revoke("fake-new", "reported the run's data as other data")
    assert keeper.revoked == old  # the new costless one is the one dropped: the old ones may have led
