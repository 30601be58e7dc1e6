"""Which head leads (peer/step/leadership.py) and how a stage follows a new one (membership.py): a
leader keeps the lead against a later head with a lower id; a claimant is followed only once
the old leader fails this peer's own probe, at most one probe per period however many messages
ask; a set-aside leader that announces again is followed again."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from peer.daemon.interfaces import PeerInfo
from peer.step.leadership import leader_of
from protocol.wire import (
    KIND_ACTIVATION,
    KIND_DRIVE,
    KIND_FOLLOW,
    KIND_GRADIENT,
    KIND_REDUCE,
    KIND_SNAPSHOT,
    KIND_STATE,
)
from swarm.replicas.membership import Membership


def head(peer_id: str, step: int = 5, leads: bool = False) -> PeerInfo:
    return PeerInfo(peer_id, 0, "online", step, 0.0, leads)


def test_a_leader_keeps_the_lead_against_a_lower_id_that_joins_later():
    assert leader_of([head("B", leads=True), head("A")]) == "B"


def test_without_a_claim_the_lowest_id_at_the_swarms_step_leads_and_a_head_behind_never_does():
    assert leader_of([head("C"), head("B"), head("A", step=4)]) == "B"
    assert leader_of([]) is None


def test_claims_that_collide_go_to_the_lowest_claimant():
    assert leader_of([head("C", leads=True), head("B", leads=True), head("A")]) == "B"


class Heads:
    """Router and DHT for `Membership`: stage 0's announcements, each with a timestamp."""

    def __init__(self, order: list[str] | None = None, **claims: bool) -> None:
        self.order = order  # the lease's order (None: a swarm without a lease)
        self.heads = {p: SimpleNamespace(peer_id=p, state="online", step=5, throughput=0.0, leads=lead, timestamp=1.0)
                      for p, lead in claims.items()}

    banned: frozenset[str] = frozenset()

    def refuses(self, peer: str) -> bool:
        return peer in self.banned

    async def admitted(self, peer: str) -> bool:
        return True

    async def announced(self, stage: int, fresh: bool = False, recent: bool = False) -> list[SimpleNamespace]:
        return list(self.heads.values()) if stage == 0 else []

    async def live_peers(self, stage: int, fresh: bool = False) -> list[SimpleNamespace]:
        return await self.announced(stage, fresh)

    async def lease_order(self, fresh: bool = False) -> list[str] | None:
        return self.order


class Prober:
    def __init__(self, alive: set[str]) -> None:
        self.alive, self.probed = alive, []

    async def __call__(self, peer: str) -> bool:
        self.probed.append(peer)
        await asyncio.sleep(0.05)  # a probe takes a round trip: concurrent checks must share it
        return peer in self.alive


async def test_the_successor_of_a_dead_leader_is_followed_after_one_probe_and_the_old_one_when_it_announces_again():
    view, probe = Heads(A=True, B=False), Prober(alive={"B"})
    m = Membership(view, view, stage=1, n_stages=2, refresh_s=0.0, probe=probe)
    assert (await m.check("B", KIND_ACTIVATION)) is not None  # B does not claim: A leads, no probe
    assert probe.probed == []
    view.heads["B"].leads = True  # B found A dead and claims the lead
    refusals = await asyncio.gather(*(m.check("B", KIND_ACTIVATION) for _ in range(8)))
    assert refusals == [None] * 8 and probe.probed == ["A"]  # eight microbatches, one probe
    assert await m.check("A", KIND_DRIVE) is not None  # the set-aside leader is not followed
    view.heads["A"].timestamp = 2.0  # ... until it announces again (it was alive after all)
    assert await m.check("A", KIND_DRIVE) is None


async def test_a_claimant_is_refused_while_the_leader_answers():
    view, probe = Heads(A=True, B=True), Prober(alive={"A", "B"})
    m = Membership(view, view, stage=1, n_stages=2, refresh_s=0.0, probe=probe)
    refusal = await m.check("B", KIND_DRIVE)  # two claims: the lowest claimant, A, leads; A answers
    assert refusal is not None and refusal.code == "refused" and probe.probed == ["A"]
    assert await m.check("A", KIND_DRIVE) is None


# ------------------------------------------------------------------ with the swarm key's lease
def test_with_a_lease_the_first_live_head_of_its_order_leads_and_no_other_head_ever_does():
    order = ["C", "B"]
    # A: the lowest id, at the highest step, claiming the lead: not named by the lease, so never the leader
    assert leader_of([head("A", step=9, leads=True), head("B"), head("C")], order) == "C"
    assert leader_of([head("A", step=9, leads=True), head("B")], order) == "B"  # C died: its successor
    assert leader_of([head("A", leads=True)], order) is None
    assert leader_of([head("B")], []) is None  # a lease not granted yet: nobody leads


async def test_with_a_lease_a_low_id_claimant_is_refused_even_once_the_leader_is_gone_and_the_successor_followed():
    # C leads by the lease and was just killed (its record lives on); A, the lowest id, claims the lead
    view, probe = Heads(order=["C", "B"], A=True, B=False, C=True), Prober(alive={"A", "B"})
    m = Membership(view, view, stage=1, n_stages=2, refresh_s=0.0, probe=probe)
    assert await m.check("B", KIND_DRIVE) is not None and probe.probed == []  # B does not claim yet: no probe
    refusal = await m.check("A", KIND_ACTIVATION)
    assert refusal is not None and refusal.code == "refused"
    assert probe.probed == ["C"]  # the claim made this peer look: C is gone, and still A is not the leader
    view.heads["B"].leads = True  # B, next in the lease, found C dead and claims
    assert await m.check("B", KIND_DRIVE) is None and probe.probed == ["C"]
    assert await m.check("A", KIND_DRIVE) is not None


async def test_before_any_lease_is_read_here_a_head_is_asked_to_retry_and_is_admitted_once_the_lease_names_it():
    """The first step's race: the head read the new lease that names it, this stage still reads the one granted to
    nobody. It asks the head to retry (a plain refusal left the step waiting for its 60 s timeout) and admits it
    once it reads the lease; a head the lease it reads does not name is still refused outright."""
    view = Heads(order=[], A=True)
    m = Membership(view, view, stage=1, n_stages=2, refresh_s=0.0)
    refusal = await m.check("A", KIND_ACTIVATION)
    assert refusal is not None and refusal.code == "retry"
    view.order = ["A"]
    assert await m.check("A", KIND_ACTIVATION) is None
    view.order = ["B"]
    refusal = await m.check("A", KIND_DRIVE)
    assert refusal is not None and refusal.code == "refused"


async def test_a_peer_banned_here_may_still_download_the_stages_state_and_nothing_else():
    """A replica whose state differs from its stage's is set aside (banned for a while, as for bad data) and told to
    download the state again; with two replicas the only source is the peer that set it aside, which must serve it
    the state (the public model) while it refuses that peer's boundary messages and commands."""
    view = Heads(order=["A"], A=True)
    view.banned = frozenset({"B"})
    m = Membership(view, view, stage=0, n_stages=2, refresh_s=0.0)
    assert await m.check("B", KIND_STATE) is None
    for kind in (KIND_REDUCE, KIND_FOLLOW, KIND_GRADIENT, KIND_SNAPSHOT):
        refusal = await m.check("B", kind)
        assert refusal is not None and "banned" in refusal.reason, kind
    assert await m.check("C", KIND_REDUCE) is not None and await m.check("C", KIND_STATE) is None
