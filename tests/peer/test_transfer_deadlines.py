"""Deadlines that grow with the bytes (peer/daemon/transfer_time.py), in memory, fp64: replicas whose exact
contributions take longer than the fixed allowance on their uplinks, but come at least at the slowest
rate waited for, finish every step in its first attempt and equal the one-process run; one slower than
that is cut and the run still equals it; a first step whose activations take longer than the fixed
first-step timeout over a slow uplink is not re-driven for ever."""
from __future__ import annotations

import asyncio

import pytest

from peer.daemon.interfaces import LinkError
from peer.daemon.loopback import LoopbackLink
from peer.daemon.transfer_time import PING_BASE_S, TOO_SLOW, StepDeadlines, TransferWait, boundary_bytes
from peer.replica.memory_swarm import TEST_DRIVER_OPTIONS
from peer.runner.replica_sync import flat_limits
from peer.runner.stage import StageRunner
from protocol.spec import preset
from protocol.wire import KIND_ACTIVATION, KIND_REDUCE
from tests.peer.swarm_in_memory import make_swarm, param_hash, patient_options
from tests.peer.test_replicas import assert_close

pytestmark = pytest.mark.idle_clock  # waits for deadlines, probes and back-offs: tests/idle_clock.py

STEPS, BASE_S, TRANSFER_S = 3, 0.3, 0.6  # TRANSFER_S: 2x the base allowance, the modelled link's time
# a microbatch's own deadline (peer/daemon/microbatch_forward.py) is not what these tests prove:
# on a loaded CI machine a
# reply can take longer than its 1 s floor, and a re-sent microbatch re-drives the step (patient_options' reason)
PATIENT_DAEMON = patient_options()["daemon_options"]


def metered_uplinks(bytes_per_s: dict[str, float], kind: str = KIND_REDUCE) -> type[LoopbackLink]:
    """Each peer's messages of `kind` (requests it sends, and replies it gives) leave through its one uplink,
    one after another, at its rate (bytes/s); a request ends at its timeout, as the real transport's does."""
    uplinks: dict[str, asyncio.Lock] = {}
    metered = kind

    async def leave(peer: str, nbytes: int) -> None:
        if nbytes > 4096 and peer in bytes_per_s:
            async with uplinks.setdefault(peer, asyncio.Lock()):
                await asyncio.sleep(nbytes / bytes_per_s[peer])  # the modelled link's time

    class MeteredLink(LoopbackLink):
        async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
            async def send() -> bytes:
                if kind == metered:
                    await leave(self.peer_id, len(body))
                reply = await LoopbackLink.request(self, peer, kind, body, timeout)
                if kind == metered:
                    await leave(peer, len(reply))
                return reply
            try:
                return await asyncio.wait_for(send(), timeout)
            except TimeoutError:
                raise LinkError(f"no reply from {peer} within {timeout:g} s.") from None
    return MeteredLink


def test_the_wait_is_the_base_plus_the_bytes_at_the_floor():
    wait = TransferWait(60.0, 8e6)
    assert wait.seconds(0) == 60.0 and wait.seconds(10**6) == pytest.approx(61.0)
    assert wait.seconds(400 * 10**6) == pytest.approx(460.0)  # a large stage's exact contribution at 8 Mbit/s
    with pytest.raises(ValueError, match="positive rate"):
        TransferWait(60.0, 0.0)


def test_a_status_ping_may_wait_behind_one_boundary_frame_at_the_floor():
    """Dense `large` at 8 Mbit/s: a microbatch's activation is 16.8 MB, 16.8 s on the floor's uplink; a
    ping's reply queued behind it on a healthy peer must not count as a miss (peer/step/attempt_watch.py)."""
    spec = preset("large", codec="dense", dtype="bf16", stages=2)
    assert boundary_bytes(spec) == 4 * 1024 * 2048 * 2
    ping = StepDeadlines(spec, 120.0, 90.0).ping
    assert ping == pytest.approx(PING_BASE_S + 8 * boundary_bytes(spec) / spec.slowest_uplink_bps)
    assert 18 < ping < 19
    assert StepDeadlines(preset("small"), 120.0, 90.0).ping < PING_BASE_S + 0.2  # 16x smaller frames: ~2 s
    assert StepDeadlines(preset("tiny", stages=1), 120.0, 90.0).ping == PING_BASE_S  # nothing crosses a boundary


async def test_contributions_slower_than_the_base_allowance_but_above_the_floor_are_waited_for(oracle_runs):
    spec = preset("tiny", stages=2, codec="subspace", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3, replica_sync="exact")
    contribution = flat_limits(spec, StageRunner(spec, 1)).numel * 8  # fp64 bytes of a whole flat gradient
    rate = contribution / TRANSFER_S  # each contribution takes ~0.6 s on its uplink: more than the base 0.3 s
    spec = spec.replace(slowest_uplink_bps=8 * rate / 3)  # the swarm waits for uplinks 3x slower than these
    swarm = await make_swarm(spec, [1, 2], metered_uplinks({"s1r0": rate, "s1r1": rate}),
                             driver_options=dict(TEST_DRIVER_OPTIONS, min_timeout=60.0, first_timeout=60.0),
                             commit_options=dict(reduce_timeout=BASE_S), daemon_options=PATIENT_DAEMON)
    try:
        logs = await asyncio.wait_for(swarm.drive(STEPS), 120)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert [log.attempts for log in logs] == [1] * STEPS, "a reduce gave up on a replica that was sending"
    assert len({param_hash(p.runner) for p in swarm.stage(1)}) == 1
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)


async def test_a_replica_slower_than_the_floor_is_not_cut_on_one_word_but_by_two_of_three(oracle_runs):
    """Two replicas: the fast one says the slow one's contribution came too late, which one word cannot tell from
    a lie (issue 57, item 1): nobody is banned, the stage waits for a third replica; with it, two of three cut the
    slow one, which is told it is slow, not false, and the step goes on without it."""
    spec = preset("tiny", stages=2, codec="subspace", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3, replica_sync="exact")
    contribution = flat_limits(spec, StageRunner(spec, 1)).numel * 8
    # bytes/s: a contribution at the floor takes ~1 s (not TRANSFER_S: the fast replicas' 0.25 s a contribution
    # must stay far below their deadline on a loaded machine, and this test gains little from a shorter one)
    floor = contribution / 1.0
    spec = spec.replace(slowest_uplink_bps=8 * floor)  # the swarm's rule, in its spec (4x the default here)
    # s1r1 sends at a third of the floor: ~3 s a contribution, against a deadline of 0.3 + 1 s (at the default
    # floor of 8 Mbit/s the deadline would be 0.3 + 4.2 s, and it would be waited for: the spec's floor rules)
    assert contribution / (floor / 3) < TransferWait(BASE_S).seconds(contribution)
    link = metered_uplinks({"s1r0": 4 * floor, "s1r1": floor / 3, "s1r2": 4 * floor})
    swarm = await make_swarm(spec, [1, 2], link,
                             driver_options=dict(TEST_DRIVER_OPTIONS, min_timeout=60.0, first_timeout=60.0),
                             commit_options=dict(reduce_timeout=BASE_S), daemon_options=PATIENT_DAEMON)
    head, slow = swarm.peers["s0r0"], swarm.peers["s1r1"]
    run = asyncio.ensure_future(swarm.drive(STEPS))
    try:
        deadline = asyncio.get_running_loop().time() + 120
        while head.driver.spot.disputed_stages(0) != [1]:
            assert asyncio.get_running_loop().time() < deadline and not run.done(), "no dispute"
            await asyncio.sleep(0.02)  # poll: the one-sided blame is re-driven twice, then the stage is disputed
        assert head.driver.spot.convicted == [] and not any(p.directory.banned for p in swarm.peers.values())
        assert swarm.logs == []  # nothing applied on the fast replica's word
        third = await swarm.add(1, "s1r2", link, announce="syncing")  # placement's part in a real swarm
        await third.join(["s1r0"])
        await third.announce("online")
        logs = await asyncio.wait_for(run, 120)
        await swarm.applied()
        await asyncio.wait_for(slow.commit.banned.wait(), 10)  # the leader tells it in the background
    finally:
        if not run.done():
            run.cancel()
        await swarm.stop()
    assert head.driver.spot.convicted == ["s1r1"], "the slow replica was not cut by the two others"
    # it is told why, in the abort the leader sends it: slow, not false (swarm/replicas/replica.py ban_message)
    # (its own offers gave up first, so the others saw it end its reduce with nothing sent: named for it)
    assert TOO_SLOW in slow.commit.ban_reason and "blamed by 2 of the 2 other replicas" in slow.commit.ban_reason, \
        slow.commit.ban_reason
    assert logs[0].attempts >= 4 and all(log.attempts == 1 for log in logs[1:]), [log.attempts for log in logs]
    assert param_hash(swarm.peers["s1r0"].runner) == param_hash(third.runner)
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)


async def test_a_first_step_slower_than_the_first_timeout_over_a_slow_uplink_ends_in_one_attempt(oracle_runs):
    spec = preset("tiny", stages=2, codec="dense", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3)
    per_mb = boundary_bytes(spec)  # one activation (or gradient) on the wire
    spec = spec.replace(slowest_uplink_bps=8 * per_mb / 1.0)  # the floor: one activation a second
    # the head's 4 activations leave one after another, 0.35 s each: the first step takes ~1.4 s, more than
    # its fixed 0.5 s; at the floor its bytes may take 2 x 4 s
    swarm = await make_swarm(spec, [1, 1], metered_uplinks({"s0r0": per_mb / 0.35}, KIND_ACTIVATION),
                             driver_options=dict(TEST_DRIVER_OPTIONS, first_timeout=0.5, min_timeout=60.0),
                             daemon_options=PATIENT_DAEMON)
    try:
        logs = await asyncio.wait_for(swarm.drive(2), 120)
    finally:
        await swarm.stop()
    assert logs[0].seconds > 1.0 and [log.attempts for log in logs] == [1, 1], [(g.seconds, g.attempts) for g in logs]
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, 2), 1e-10)


async def test_a_head_whose_share_outlasts_the_command_timeout_over_a_slow_uplink_is_waited_for(oracle_runs):
    spec = preset("tiny", stages=2, codec="dense", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3)
    per_mb = boundary_bytes(spec)  # one activation (or gradient) on the wire
    spec = spec.replace(slowest_uplink_bps=8 * per_mb / 1.0)  # the floor: one activation a second
    # the second head's activations take 0.4 s each on its uplink: its share (2 microbatches) outlasts the 0.5 s
    # a command may take, and is well within that plus a step's boundary bytes at the floor
    swarm = await make_swarm(spec, [2, 1], metered_uplinks({"s0r1": per_mb / 0.4}, KIND_ACTIVATION),
                             driver_options=dict(TEST_DRIVER_OPTIONS, command_timeout=0.5, min_timeout=60.0,
                                                 first_timeout=60.0),
                             daemon_options=PATIENT_DAEMON)
    try:
        logs = await asyncio.wait_for(swarm.drive(3), 120)
    finally:
        await swarm.stop()
    assert [log.attempts for log in logs] == [1, 1, 1], [(g.heads, g.attempts) for g in logs]
    assert all(log.heads.get("s0r1", 0) >= 1 for log in logs), [log.heads for log in logs]
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, 3), 1e-10)


async def test_a_spot_check_whose_inputs_take_longer_than_the_fixed_allowance_still_runs(oracle_runs):
    """A check fetches the checked share's activations and gradients from its replica (peer/checks/share_check.py):
    over a slow uplink that outlasts the fixed allowance, and every check failed, and an honest replica was
    convicted after three ("could not be checked 3 times in a row")."""
    spec = preset("tiny", stages=2, codec="dense", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3, replica_sync="exact")
    per_mb = boundary_bytes(spec)  # one activation (or gradient) on the wire
    rate = 4 * per_mb / TRANSFER_S  # a share's inputs (2 microbatches: 4 tensors) take ~0.6 s, the base allowance 0.3 s
    spec = spec.replace(slowest_uplink_bps=8 * rate / 3)
    swarm = await make_swarm(spec, [1, 2], metered_uplinks({"s1r0": rate, "s1r1": rate}),
                             driver_options=dict(TEST_DRIVER_OPTIONS, spot_check_rate=1.0, min_timeout=60.0,
                                                 first_timeout=60.0),
                             commit_options=dict(reduce_timeout=BASE_S), daemon_options=PATIENT_DAEMON)
    try:
        logs = await asyncio.wait_for(swarm.drive(STEPS), 120)
        await swarm.applied()
    finally:
        await swarm.stop()
    spot = swarm.peers["s0r0"].driver.spot
    assert spot.checks >= STEPS and spot.convicted == [], (spot.checks, spot.convicted)
    assert [log.attempts for log in logs] == [1] * STEPS, [log.attempts for log in logs]
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)
