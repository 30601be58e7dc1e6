"""A replica the swarm went on without (set aside for one step, as a replica that missed a deadline
under load is) hears the leader's next command, downloads its stage's state again and takes part
again (swarm/replicas/own_state.py `BehindCheck`); before, it stood by at its old step for ever.
In memory, fp64: the run still equals the one-process oracle. Both checks of own_state.py may find
a replica astray at once: it downloads once (`StateSource.resync`)."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from swarm.replicas.own_state import BehindCheck
from swarm.replicas.state_source import StateSource
from tests.peer.swarm_in_memory import make_swarm, param_hash
from tests.peer.test_replicas import assert_close, spec_for
from tests.swarm.test_own_state import Report

pytestmark = pytest.mark.idle_clock  # waits for deadlines, probes and back-offs: tests/idle_clock.py

STEPS = 9
LEFT_OUT = 4  # the step (1-based) that the leader drives without s1r1


async def test_a_replica_left_behind_for_a_step_downloads_the_state_and_takes_part_again(oracle_runs):
    spec = spec_for("subspace", "fp64")
    # a replica holds a message of the step after its own for `future_step_wait` (10 s by default) while its apply
    # may be on the way: s1r1's never comes, so step LEFT_OUT + 1 waits that long before s1r1 refuses; 4 s is still
    # twice the test swarm's 2 s attempt timeout (a late apply is seconds late at most, even on a loaded machine)
    swarm = await make_swarm(spec, [1, 2], daemon_options=dict(future_step_wait=4.0))
    head, late = swarm.peers["s0r0"], swarm.peers["s1r1"]
    report = Report()

    async def resync(swarm_step: int) -> None:  # what ReplicaService._resync does, with the in-memory swarm's donor
        await late.announce("syncing")
        await late.join(["s1r0"])
        await late.announce("online")
    check = BehindCheck(late, resync, report, grace=0.5)
    late.commit.on_behind = check.behind

    def set_aside(log) -> None:  # the leader's view: s1r1 is not there for one step
        if log.step == LEFT_OUT - 1:
            head.directory.banned.add("s1r1")
        elif log.step == LEFT_OUT:
            head.directory.banned.discard("s1r1")
    try:
        await swarm.drive(LEFT_OUT + 1, set_aside)
        # the swarm need not wait for a replica that downloads again, and on a loaded machine it can finish
        # every step before the download is done: the test waits for it before driving the rest of the run
        deadline = time.monotonic() + 60
        while (check.resyncs == 0 or check._running) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # poll: told of step LEFT_OUT + 1, it downloads within seconds
        logs = await swarm.drive(STEPS, set_aside)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert [e["event"] for e in report.events] == ["behind"] and check.resyncs == 1
    assert report.events[0]["step"] == LEFT_OUT - 1 and report.events[0]["swarm_step"] >= LEFT_OUT
    applied = [r.step + 1 for r in late.commit.records]  # the steps it reduced and applied itself
    assert LEFT_OUT not in applied and applied[-1] == STEPS, applied  # it took part again, up to the last step
    assert late.runner.step == swarm.peers["s1r0"].runner.step == STEPS
    assert param_hash(late.runner) == param_hash(swarm.peers["s1r0"].runner)
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)


async def test_a_replica_downloads_its_state_once_when_both_checks_find_it_astray_at_once():
    source = StateSource.__new__(StateSource)
    source.resyncing, downloads, release = False, [], asyncio.Event()

    async def donors() -> list:
        return ["donor"]

    async def download(found: list) -> bool:
        downloads.append(found)
        await release.wait()  # a download takes a while: the second check comes meanwhile
        return True

    async def announce(state: str) -> None:
        pass
    source._donors, source._download, source.peer = donors, download, SimpleNamespace(announce=announce)
    first = asyncio.create_task(source.resync())
    while not downloads:
        await asyncio.sleep(0.01)  # poll: the first download is under way
    await asyncio.wait_for(source.resync(), 1.0)  # the second returns at once
    release.set()
    await first
    assert downloads == [["donor"]] and not source.resyncing
    await source.resync()  # and a later one downloads again
    assert len(downloads) == 2


async def test_a_replica_behind_with_no_other_replica_restores_the_stage_and_one_with_donors_does_not():
    """A replica the swarm left behind that finds no other replica of its stage is the stage's only one (one that
    started at step 0 because the announcements it read lagged, say): it restores the stage as a peer taking an
    emptied stage does (its newest snapshot, or step 0's before the first one) and the swarm rolls back to it,
    instead of going on with its own state at a step the swarm has left for good. So does one whose donors all
    failed and none answers any more (the donor died mid-download); one whose donors answer but gave nothing usable
    goes on with its own state."""
    calls: list = []

    def source_with(donors: list, downloaded: bool, answering: bool = True) -> StateSource:
        source = StateSource.__new__(StateSource)
        source.resyncing, source.stage = False, 1
        donors = [SimpleNamespace(peer_id=d) for d in donors]

        async def answers(peer: str) -> bool:
            calls.append(("probe", peer))
            return answering
        source.answers = answers

        async def found() -> list:
            return donors

        async def download(given: list) -> bool:
            calls.append(("download", [a.peer_id for a in given]))
            return downloaded

        async def swarm_step() -> int:
            return 3

        async def restore(at: int) -> None:
            calls.append(("restore", at))

        async def announce(state: str) -> None:
            calls.append(("announce", state))
        source._donors, source._download, source._swarm_step, source._restore = found, download, swarm_step, restore
        source.peer = SimpleNamespace(announce=announce)
        return source

    await source_with([], False).resync()  # the own-state check's resync: the swarm's step is read
    assert calls == [("download", []), ("restore", 3), ("announce", "online")]
    calls.clear()
    await source_with([], False).resync(7)  # the behind check's: the step of the leader's command
    assert calls == [("download", []), ("restore", 7), ("announce", "online")]
    calls.clear()
    await source_with(["donor"], False).resync()  # a donor that gave nothing usable: no restore, no rollback
    assert calls == [("download", ["donor"]), ("probe", "donor"), ("announce", "online")]
    calls.clear()
    await source_with(["donor"], False, answering=False).resync(5)  # the donor died mid-download: restore
    assert calls == [("download", ["donor"]), ("probe", "donor"), ("restore", 5), ("announce", "online")]
    calls.clear()
    await source_with(["donor"], True).resync()
    assert calls == [("download", ["donor"]), ("announce", "online")]


async def test_a_replica_with_nothing_on_its_way_downloads_at_once_and_one_whose_apply_may_come_waits():
    """Nothing brings a replica level by itself unless it follows a donor's forwarded sums, or is one step behind
    with its sum of that step made or held here (the leader's apply may be on its way): otherwise it does not
    wait the grace. A standby head that started from the seed as the swarm took its first step waited 10 s in the
    churn smoke (one step behind, left out of that step's reduce), the stage's only other replica died meanwhile,
    and the swarm rolled back. The wait is judged again as the swarm moves on: one step behind with a sum held,
    then told of a step two past it, it downloads at once."""
    resynced: dict[str, float] = {}

    def check_of(name: str, donor: str | None, step: int, holds_sum: bool = False) -> BehindCheck:
        async def resync(swarm_step: int) -> None:
            resynced[name] = time.monotonic() - start
        tasks: list = []
        runner = SimpleNamespace(step=step, stage=1)
        peer = SimpleNamespace(runner=runner, follower=SimpleNamespace(donor=donor),
                               commit=SimpleNamespace(sum_on_its_way=lambda: holds_sum),
                               daemon=SimpleNamespace(spawn=lambda c: tasks.append(asyncio.ensure_future(c))))
        check = BehindCheck(peer, resync, Report(), grace=30.0)
        check.tasks = tasks  # kept: a task nobody holds may be collected
        return check
    checks = {"alone": check_of("alone", None, 2), "following": check_of("following", "donor", 2),
              "left out": check_of("left out", None, 3), "holds its sum": check_of("holds its sum", None, 3, True),
              "then two behind": check_of("then two behind", None, 3, True)}
    start = time.monotonic()
    for check in checks.values():
        check.behind(4)  # a command of step 5 (0-based 4): 2, 2, 1, 1 and 1 steps past them
    deadline = time.monotonic() + 20
    while not {"alone", "left out"} <= set(resynced) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # poll: they download after LEFT_BEHIND_S, far within the 30 s grace
    assert {"alone", "left out"} <= set(resynced) and max(resynced.values()) < 20
    assert not {"following", "holds its sum", "then two behind"} & set(resynced)  # their applies may be on the way
    checks["then two behind"].behind(5)  # the swarm went on: a command of step 6, two past it
    deadline = time.monotonic() + 20
    while "then two behind" not in resynced and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # poll
    assert "then two behind" in resynced and resynced["then two behind"] < 20
    assert not {"following", "holds its sum"} & set(resynced)
    for check in checks.values():
        for task in check.tasks:
            task.cancel()


async def test_a_stage_whose_only_up_to_date_replica_leaves_while_the_other_is_behind_goes_on_within_30_s(
        oracle_runs):
    """Issue 56, item 4: stage 1's replica s1r1 is left out of a step (behind), then s1r0, the only one at the
    swarm's step, dies. With no donor, s1r1 restores the stage from the snapshots other stages keep and the swarm
    rolls back to it (StateSource.resync's road, here with the in-memory swarm's peers): the next step comes within
    30 s of the death, and the run still equals the one-process run."""
    spec = spec_for("subspace", "fp64")
    swarm = await make_swarm(spec, [1, 2], daemon_options=dict(future_step_wait=4.0),
                             snapshot_options=dict(every=2))
    head, late = swarm.peers["s0r0"], swarm.peers["s1r1"]
    report, killed, restored = Report(), {}, []

    async def resync(swarm_step: int) -> None:  # no live donor: restore the stage, as StateSource.resync does
        await late.announce("syncing")
        if "s1r0" in swarm.net.down:
            restored.append(await late.restore(swarm_step=swarm_step))
        else:
            await late.join(["s1r0"])
        await late.announce("online")
    check = BehindCheck(late, resync, report, grace=0.5)
    late.commit.on_behind = check.behind

    def on_step(log) -> None:  # s1r1 is not there for step LEFT_OUT; right after it, s1r0 dies
        if log.step == LEFT_OUT - 1 and "at" not in killed:  # (not again when the rollback drives it again)
            head.directory.banned.add("s1r1")
        elif log.step == LEFT_OUT and "at" not in killed:
            head.directory.banned.discard("s1r1")
            swarm.kill("s1r0")
            killed["at"], killed["t"] = log.step, time.monotonic()
        elif "t" in killed and log.step > killed["at"] and "next" not in killed:
            killed["next"] = time.monotonic() - killed["t"]
    try:
        logs = await asyncio.wait_for(swarm.drive(STEPS, on_step), 60)
        await swarm.applied()
    finally:
        await swarm.stop()
    # once, from a snapshot no later than the step it missed: the commands heard before the rollback are of
    # undone steps, and do not make it restore (and the swarm roll back) again
    assert len(restored) == 1 and restored[0] <= LEFT_OUT, restored
    assert head.rollback.rollbacks == 1
    assert killed.get("next", 1e9) <= 30.0, f"the next step came {killed.get('next')} s after s1r0 died"
    final = {log.step: log.loss for log in logs}
    assert sorted(final) == list(range(1, STEPS + 1))
    assert_close([final[s] for s in range(1, STEPS + 1)], oracle_runs.losses(spec, STEPS), 1e-10)


async def test_commands_heard_before_a_rollback_do_not_make_a_replica_download_after_it():
    """The swarm rolled back (to a snapshot this replica restored, or one every stage loads): the steps of the
    leader's commands heard before are undone, and a replica now behind them is not behind the swarm. Before,
    the wait begun before the rollback ended in a download (or, alone in its stage, a second restore and a
    second rollback)."""
    resyncs: list[int] = []

    async def resync(swarm_step: int) -> None:
        resyncs.append(swarm_step)
    runner, rollback, tasks = SimpleNamespace(step=4, stage=1), SimpleNamespace(rollbacks=0), []
    peer = SimpleNamespace(runner=runner, rollback=rollback, follower=SimpleNamespace(donor=None),
                           commit=SimpleNamespace(sum_on_its_way=lambda: False),
                           daemon=SimpleNamespace(spawn=lambda c: tasks.append(asyncio.ensure_future(c))))
    check = BehindCheck(peer, resync, Report(), grace=30.0)
    check.behind(6)  # two steps behind: it would download after LEFT_BEHIND_S (1 s)
    runner.step, rollback.rollbacks = 2, 1  # meanwhile the swarm rolled back to step 2
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert resyncs == [] and check.resyncs == 0
    check.behind(3)  # a command after the rollback, one past this replica's step, counts afresh
    assert check.swarm_step == 3
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
