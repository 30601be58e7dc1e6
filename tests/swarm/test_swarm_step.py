"""The step the swarm is on, as a peer that finds no live replica of its stage judges it
(swarm/replicas/swarm_step.py): a fake id's announced step counts only as far as the swarm key's
records support it, so it cannot make the fresh head of an untrained swarm wait for a snapshot
that does not exist; the honest claims still count (a real loss at step N > 0 still restores)."""
from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

from swarm.dht import StageAnnouncement, VouchedSnapshots
from swarm.replicas.state_source import StateSource
from swarm.replicas.swarm_step import SLACK, counted_claims, settled_step

RUN = "r"
TTL = 2.0  # today's rule gives up waiting for a paused head after 2 x ttl: the fake's step then wins
HEAD, STAGE2, FAKE, JOINER = "head-peer", "stage2-peer", "fake-peer", "joiner-peer"


def ann(peer: str, stage: int, step: int, state: str = "online") -> StageAnnouncement:
    return StageAnnouncement(peer, RUN, stage, [], 100.0, 0, 0, state, "0", step=step)


class FakeRouter:
    """The directory's live announcements and the swarm key's lease order (None: no swarm key)."""

    def __init__(self, peers: list[StageAnnouncement], order: list[str] | None) -> None:
        self.peers, self.order = peers, order

    async def live_peers(self, stage: int, fresh: bool = False) -> list[StageAnnouncement]:
        return [a for a in self.peers if a.stage == stage]

    async def lease_order(self, fresh: bool = False) -> list[str] | None:
        return self.order


class FakeDHT:
    """The swarm key's vouched records: snapshot steps and state-hash steps (step -> stage -> sha256)."""

    def __init__(self, snapshots: list[int] = (), states: list[int] = ()) -> None:
        self.snapshots, self.states = snapshots, states

    async def fetch_vouched(self, run_hash: str, states: bool = False) -> VouchedSnapshots | None:
        steps = self.states if states else self.snapshots
        return VouchedSnapshots(run_hash, {t: {s: f"{s:x}" * 64 for s in range(3)} for t in steps}) if steps else None


def joiner_of_stage_1(peers: list[StageAnnouncement], order: list[str] | None, dht: FakeDHT) -> StateSource:
    """The StateSource of a replica of stage 1, just far enough built to judge the swarm's step (as `acquire`
    does)."""
    source = StateSource.__new__(StateSource)
    source.stage = 1
    source.spec = SimpleNamespace(n_stages=3, run_hash=RUN)
    source.ctx = SimpleNamespace(router=FakeRouter(peers, order), sdht=dht, peer_id=JOINER, ttl=TTL)
    return source


async def judged(peers: list[StageAnnouncement], order: list[str] | None, dht: FakeDHT) -> tuple[int, float]:
    t0 = time.monotonic()
    step = await asyncio.wait_for(joiner_of_stage_1(peers, order, dht)._swarm_step(), 4 * TTL + 5)
    return step, time.monotonic() - t0


async def test_a_fake_far_step_does_not_stop_a_fresh_swarm_from_starting(caplog):
    # a swarm with a coordinator that has not trained: its head waits at step 0 for stage 1, and a fake id
    # announced step 1000 on stage 2 first. Nothing is vouched for yet: the swarm starts afresh, at once
    peers = [ann(HEAD, 0, 0), ann(STAGE2, 2, 0), ann(FAKE, 2, 1000)]
    with caplog.at_level(logging.WARNING, logger="swarm.replicas.swarm_step"):
        step, seconds = await judged(peers, [HEAD], FakeDHT())
    assert step == 0, "the fake's claim made the joiner wait for a snapshot of an untrained swarm"
    assert seconds < TTL, f"the joiner waited {seconds:.1f} s for the swarm to settle"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and FAKE[-8:] in warned[0] and "step 1000" in warned[0], warned
    assert HEAD[-8:] not in warned[0] and STAGE2[-8:] not in warned[0]


async def test_a_fake_paused_head_past_the_records_is_ignored_and_the_honest_step_stands():
    # a trained swarm lost stage 1 at step 13: states vouched up to 12, snapshots up to 10. A fake head
    # announces itself paused at step 1000; the leading head (the lease's first live one) is paused at 13
    peers = [ann(FAKE, 0, 1000, "paused"), ann(HEAD, 0, 13, "paused"), ann(STAGE2, 2, 13)]
    step, _ = await judged(peers, [HEAD, FAKE], FakeDHT(snapshots=[5, 10], states=[4, 8, 12]))
    assert step == 13


async def test_a_real_loss_after_training_still_restores():
    # the honest paths: the leading head's claim counts whatever the records lag (here none reached the DHT),
    step, _ = await judged([ann(HEAD, 0, 3, "paused"), ann(STAGE2, 2, 3)], [HEAD], FakeDHT())
    assert step == 3
    # and without a live head the other stages' steps count up to the newest vouched step + the slack
    step, _ = await judged([ann(STAGE2, 2, 12 + SLACK)], [HEAD], FakeDHT(snapshots=[10], states=[12]))
    assert step == 12 + SLACK


async def test_without_a_swarm_key_every_claim_counts_as_before():
    # no coordinator, so no record to check a claim against: not defended (docs/security.md)
    step, seconds = await judged([ann(HEAD, 0, 0), ann(FAKE, 2, 1000)], None, FakeDHT())
    assert step == 1000 and seconds >= 2 * TTL


def test_the_claims_that_count():
    fake, head, honest = ann(FAKE, 2, 30), ann(HEAD, 0, 500), ann(STAGE2, 2, 30)
    assert counted_claims([fake, head], 0, HEAD) == ([head], [fake])  # no record: only the leader's step > 0
    assert counted_claims([fake, honest], 30 - SLACK, None) == ([fake, honest], [])  # at the bound: counted
    assert counted_claims([fake], 29 - SLACK, None) == ([], [fake])  # one past it: ignored
    assert counted_claims([fake, head], None, None) == ([fake, head], [])  # no swarm key: all count
    assert settled_step([], 0.0, TTL) == 0  # every claim ignored: a swarm that has not trained
    assert settled_step([ann(STAGE2, 2, 7)], 0.0, TTL) is None  # a head may still announce its pause
