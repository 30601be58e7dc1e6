"""A replica's check of its own state hash against the vouched one (swarm/replicas/own_state.py):
the first hashed step, then every `every` steps; a mismatch makes it download the state again."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from swarm.replicas.own_state import OwnStateCheck


def sha(i: int) -> str:
    return f"{i:064x}"


class Report:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def write(self, event: str, **fields) -> None:
        self.events.append({"event": event, **fields})


def fake_peer():
    tasks: list[asyncio.Task] = []
    daemon = SimpleNamespace(spawn=lambda coro: tasks.append(asyncio.get_running_loop().create_task(coro)))
    commit = SimpleNamespace(hasher=SimpleNamespace(last=None))
    peer = SimpleNamespace(commit=commit, daemon=daemon, runner=SimpleNamespace(stage=1),
                           rollback=SimpleNamespace(redriven=(-1, -1)))
    return peer, tasks


def checking(vouched: dict[int, str]):
    """A fake replica, the check over the `vouched` record (read live), its report, and the steps it resynced at."""
    peer, tasks = fake_peer()
    resyncs, report = [], Report()

    async def hashes() -> dict[int, str]:
        return dict(vouched)

    async def resync() -> None:
        resyncs.append(peer.commit.hasher.last[0])
    return peer, tasks, OwnStateCheck(peer, hashes, resync, report, every=8, wait=5.0), report, resyncs


async def test_a_replica_checks_its_first_hashed_step_then_every_few_and_resyncs_on_a_mismatch():
    vouched = {4: sha(4), 8: sha(8), 12: sha(99)}
    peer, tasks, check, report, resyncs = checking(vouched)
    check.after_step(3)  # no hash taken at this step: nothing to check
    for steps in (4, 8, 12):
        peer.commit.hasher.last = (steps, sha(steps))
        check.after_step(steps)
        await asyncio.gather(*tasks)
    checked = [e["step"] for e in report.events]
    assert checked == [4, 12]  # the first, then once 8 steps have passed (8 is not due)
    assert [e["agrees"] for e in report.events] == [True, False] and resyncs == [12]
    peer.commit.hasher.last = (16, sha(16))  # after a re-sync the next hashed step is checked at once
    vouched[16] = sha(16)
    check.after_step(16)
    await asyncio.gather(*tasks)
    assert report.events[-1]["step"] == 16 and report.events[-1]["agrees"] and resyncs == [12]


async def test_steps_driven_again_after_a_rollback_are_not_checked_against_the_first_drives_record():
    """The swarm rolled back from step 12 to 3 and no coordinator heard of it: the record still holds the first
    drive's hashes of 4-12, which the re-driven steps need not match (other bits). Checked: the first step past
    them; before, a check here downloaded the stage again, found no donor and rolled the swarm back again."""
    vouched = {s: sha(1000 + s) for s in range(1, 13)} | {13: sha(13)}  # the first drive's 4-12, then 13
    peer, tasks, check, report, resyncs = checking(vouched)
    peer.rollback.redriven = (3, 12)
    for steps in range(4, 14):
        peer.commit.hasher.last = (steps, sha(steps))
        check.after_step(steps)
        await asyncio.gather(*tasks)
    assert [(e["step"], e["agrees"]) for e in report.events] == [(13, True)] and resyncs == []
