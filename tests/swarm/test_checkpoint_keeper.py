"""The coordinator's copy of the vouched snapshots (`swarm coordinator --checkpoint-dir`, issue 19):
after the swarm vouches for a step's snapshots it fetches every stage's from the peers, writes
them to files, reads them back after a restart, and a peer restores a stage from it alone (in
memory, fp64: no peer of another stage keeps a copy here, and the stage's replica is gone)."""
from __future__ import annotations

import asyncio
import hashlib
import time

from peer.daemon.loopback import LoopbackLink
from peer.runner.state_hash import state_sha256
from peer.state.state_transfer import load_state_bytes
from protocol.spec import preset
from protocol.wire import KIND_SNAPSHOT
from swarm.replicas.checkpoint_keeper import CheckpointKeeper
from tests.peer.swarm_in_memory import make_swarm

STEPS = 6


async def until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.02)  # poll the keeper's progress


async def test_the_coordinator_keeps_the_vouched_snapshots_on_disk_and_a_stage_is_restored_from_it_alone(tmp_path):
    spec = preset("tiny", stages=3, codec="subspace", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3)
    # copies=0: no custodian keeps another stage's snapshot, so the coordinator is the only other holder
    swarm = await make_swarm(spec, [1, 1, 1], snapshot_options=dict(every=2, copies=0))
    coord = LoopbackLink(swarm.net, "coord")

    async def holders(stage: int) -> list[str]:
        return [p.peer_id for s in [stage] + [t for t in range(3) if t != stage] for p in swarm.stage(s)]
    keeper = CheckpointKeeper(spec, coord, holders, tmp_path)
    await coord.serve(KIND_SNAPSHOT, keeper.on_request)
    vouched: dict[int, dict[int, str]] = {}

    def on_committed(steps, workers, snapshots) -> None:  # what the coordinator does with the leader's work record
        if snapshots is not None and snapshots[0] not in vouched:
            vouched[snapshots[0]] = snapshots[1]
            keeper.on_vouched(*snapshots)
    swarm.peers["s0r0"].driver.on_committed = on_committed
    try:
        await swarm.drive(STEPS)
        await swarm.applied()
        await until(lambda: len(list((tmp_path / spec.run_hash).glob("*.snap"))) == 6 and not keeper._tasks, 60,
                    "the keeper wrote two snapshots of each of the three stages")
        # the files are the vouched snapshots, byte for byte
        assert sorted(vouched) == [2, 4]
        for step, hashes in vouched.items():
            for stage, sha in hashes.items():
                path = tmp_path / spec.run_hash / f"stage{stage}-step{step}-{sha}.snap"
                assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
        # stage 1's replica took the snapshot at step 4: the state a restore must give back
        own = swarm.peers["s1r0"].snapshots.store.get(1, 4)
        assert own.sha256 == vouched[4][1]
        want = state_sha256(load_state_bytes(own.data))
        # a restarted coordinator holds what it wrote
        again = CheckpointKeeper(spec, coord, holders, tmp_path)
        assert [i.step for i in again.store.listed(1)] == [4, 2]
        # stage 1's only replica is gone; a fresh one restores it from the coordinator alone
        swarm.kill("s1r0")
        newcomer = await swarm.add(1, "s1new", announce="syncing")

        async def coordinators() -> list[str]:
            return ["coord"]
        newcomer.snapshots.extra_holders = coordinators

        async def vouched_hashes() -> dict[int, str]:
            return {t: h[1] for t, h in vouched.items()}
        newcomer.snapshots.vouched = vouched_hashes
        assert all(not swarm.peers[p].snapshots.store.listed(1) for p in ("s0r0", "s2r0"))
        assert await newcomer.restore() == 4
        assert newcomer.runner.step == 4
        assert state_sha256(newcomer.runner.state_dict()) == want
    finally:
        await keeper.stop()
        await swarm.stop()
