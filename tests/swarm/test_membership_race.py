"""The step-1 race of a fresh swarm: a peer whose view of the announcements lags behind the
sender's (it has not read the sender's announcement yet) asks the sender to retry, and the step
goes through: no ban, no failed attempt, no 60 s wait for another peer, losses equal to the oracle.
And the rule before it: in a private swarm, a sender with no ticket is refused whatever it sends."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from protocol.spec import preset
from protocol.wire import (
    KIND_ACTIVATION,
    KIND_BASIS,
    KIND_CONTROL,
    KIND_DRIVE,
    KIND_FOLLOW,
    KIND_GRADIENT,
    KIND_REDUCE,
    KIND_SNAPSHOT,
    KIND_STATE,
)
from swarm.replicas.membership import Membership
from swarm.trust.admission import Admission, AdmissionPolicy, Ticket
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from tests.peer.swarm_in_memory import make_swarm, patient_options

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py


class LaggingView:
    """A router and a DHT for `Membership` whose announcements of one stage show a peer only after
    `lag` fresh reads of that stage: a DHT that has not yet spread that peer's announcement."""

    def __init__(self, members: dict[int, list[str]], lag: int) -> None:
        self.members, self.lag = members, lag
        self.fresh_reads: dict[int, int] = {}
        self.banned: set[str] = set()

    def refuses(self, peer: str) -> bool:
        return peer in self.banned

    async def admitted(self, peer: str) -> bool:
        return True

    async def announced(self, stage: int, fresh: bool = False, recent: bool = False) -> list[SimpleNamespace]:
        if fresh:
            self.fresh_reads[stage] = self.fresh_reads.get(stage, 0) + 1
        if self.fresh_reads.get(stage, 0) < self.lag:
            return []
        return [SimpleNamespace(peer_id=p, state="online", step=0, throughput=0.0, leads=False, timestamp=0.0)
                for p in self.members.get(stage, [])]

    async def live_peers(self, stage: int, fresh: bool = False) -> list[SimpleNamespace]:
        return await self.announced(stage, fresh)

    async def lease_order(self, fresh: bool = False) -> list[str] | None:
        return None  # no coordinator: the rule without a lease


async def test_an_unread_sender_of_a_boundary_message_is_asked_to_retry_and_then_admitted():
    view = LaggingView({1: ["s1r0"]}, lag=2)
    m = Membership(view, view, stage=2, n_stages=3, refresh_s=0.0)
    first = await m.check("s1r0", KIND_ACTIVATION)
    assert first is not None and first.code == "retry" and "s1r0"[-8:] in first.reason
    assert await m.check("s1r0", KIND_ACTIVATION) is None  # the second fresh read finds it
    assert view.fresh_reads[1] == 2


async def test_fresh_reads_are_rate_limited_so_a_stranger_cannot_hammer_the_dht():
    view = LaggingView({}, lag=0)
    m = Membership(view, view, stage=1, n_stages=3, refresh_s=3600.0)
    for _ in range(5):
        refusal = await m.check("stranger", KIND_GRADIENT)
        assert refusal is not None and refusal.code == "retry"
    assert view.fresh_reads[2] == 1  # one fresh read in the hour, however often it asks


async def test_a_head_read_late_is_asked_to_retry_its_commands_and_a_reduce_is_refused():
    view = LaggingView({0: ["s0r0"], 1: ["s1r0"]}, lag=2)
    m = Membership(view, view, stage=1, n_stages=3, refresh_s=3600.0)
    refusal = await m.check("s1r1", KIND_REDUCE)  # the replicas' exchange has its own recovery
    assert refusal is not None and refusal.code == "refused"
    refusal = await m.check("s0r0", KIND_DRIVE)
    assert refusal is not None and refusal.code == "retry"
    assert await m.check("stranger", KIND_CONTROL) is None  # a status query: anyone admitted may probe


async def test_a_swarm_whose_last_stage_reads_announcements_late_trains_like_the_oracle(oracle_runs):
    spec = preset("tiny", stages=3)
    steps = 3
    # deadlines a loaded machine cannot miss: a failed attempt here is the retries' doing, not the load's
    swarm = await make_swarm(spec, [1, 1, 1], **patient_options())
    view = LaggingView({1: ["s1r0"], 0: ["s0r0"]}, lag=4)
    tail = swarm.stage(2)[0].daemon
    tail.admit = Membership(view, view, stage=2, n_stages=3, refresh_s=0.0).check
    failures: list[str] = []
    middle = swarm.stage(1)[0].daemon
    middle.directory.report_failure = lambda peer, bad_data=False: failures.append(peer)
    try:
        logs = await swarm.drive(steps)
    finally:
        await swarm.stop()
    assert [log.loss for log in logs] == oracle_runs.losses(spec, steps)
    assert all(log.attempts == 1 for log in logs)  # the retries stayed inside the first attempt
    assert max(log.seconds for log in logs) < 30.0  # and no step waited 60 s for another peer
    assert tail.refused >= 1  # the lagging view really refused (as "retry") before it read stage 1
    assert view.fresh_reads[1] >= 4
    assert failures == []  # a "retry" is no failure: nothing is banned


async def test_an_outsider_of_a_private_swarm_is_refused_every_kind_and_a_ticket_holder_is_not():
    """Messages only from whom they may come (docs/security.md): in a private swarm a sender with no valid ticket
    is refused whatever it sends, the kinds anyone may send in a public swarm (basis, state, snapshots, a status
    probe) too, with the one sentence that says how to get in; a peer whose ticket was seen is served."""
    key = SigningKey.generate()
    admission = Admission(AdmissionPolicy(True, key.public_bytes()))
    member, outsider = Identity.generate().peer_id, Identity.generate().peer_id
    assert admission.learn(member, Ticket.issue(key, member).to_bytes())  # its announcement carried its ticket
    view = LaggingView({0: [member], 1: [member], 2: [member]}, lag=0)

    async def admitted(peer: str) -> bool:  # SwarmDHT.admitted, less its look-up of announcements' tickets
        return admission.admits(peer)
    m = Membership(view, SimpleNamespace(admitted=admitted), stage=1, n_stages=3, refresh_s=0.0)
    kinds = (KIND_ACTIVATION, KIND_GRADIENT, KIND_CONTROL, KIND_DRIVE, KIND_REDUCE, KIND_FOLLOW, KIND_BASIS,
             KIND_STATE, KIND_SNAPSHOT)
    for kind in kinds:
        refusal = await m.check(outsider, kind)
        assert refusal is not None and refusal.code == "refused" and "private" in refusal.reason \
            and "swarm admit" in refusal.reason, (kind, refusal)
    for kind in (KIND_GRADIENT, KIND_REDUCE, KIND_FOLLOW, KIND_BASIS, KIND_STATE, KIND_SNAPSHOT, KIND_CONTROL):
        assert await m.check(member, kind) is None, kind
