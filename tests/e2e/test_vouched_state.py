"""Vouched state (issue 21, item 4) and the coordinator's snapshots (issue 19), in real processes
over libp2p: two replicas of stage 1 that train honestly but serve joiners noisy weights under
their own sha256 (the stock peer made a hostile donor: tests/doubles/hostile_peer.py), both
boasting a huge throughput and a step ahead of the swarm (one 1000 steps, one 2), so that a
joiner tries them first (this one asks them first whatever they announce at that moment:
tests/doubles/donor_order_peer.py). The joiner skips the one whose step the swarm's records do not know,
refuses the other's state (its hash is not the vouched one), takes the state of an honest
replica, and after its next step its own state hash is the one the leader's record holds. The
coordinator, started with --checkpoint-dir, wrote every stage's vouched snapshots to files."""
from __future__ import annotations

import asyncio
import hashlib
import re
import time

from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from tests.doubles import donor_order_peer, hostile_peer
from tests.e2e.conftest import wait_for_event

STEPS = "100000"  # the head never finishes: the test stops it
STAY = ["--rebalance-period", "0"]  # five replicas of stage 1 and one head: nobody moves


def _wait(swarm: LocalSwarm, what, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, f"timed out; see the logs in {swarm.dir}"
        swarm._check_alive()
        time.sleep(0.2)  # poll interval of reports other processes write


def _steps(swarm: LocalSwarm) -> int:
    return len([e for e in swarm.events("head") if e["event"] == "step"])


async def test_a_joiner_refuses_hostile_donors_takes_the_vouched_state_and_the_coordinator_keeps_snapshots(tmp_path):
    spec = preset("tiny", stages=2, batch_size=16, microbatch_size=8)
    checkpoints = tmp_path / "coordinator-snapshots"
    swarm = LocalSwarm(LocalOptions(spec, steps=int(STEPS), workdir=str(tmp_path / "run"), threads=1, quiet=True,
                                    extra_peer_args=["--ttl", "6", *STAY]))
    swarm.head_names = lambda: ["head"]
    try:
        await asyncio.to_thread(swarm.start_coordinator, "--checkpoint-dir", str(checkpoints), "--snapshot-every", "3",
                                serving=False)
        # two honest replicas: under CI's load one may miss a microbatch deadline while it serves a liar its
        # state and fall a step behind; while it downloads the state again (BehindCheck) the other can give
        # the joiner a state the records hold. Both serve before the head starts: one that comes up while the
        # head drives step 1 with the other starts from the initial state a step behind, and step 2 then waits
        # ~10 s for it (the swarm's behaviour, not this test's subject)
        swarm.start_peer(1, name="honest")
        swarm.start_peer(1, name="honest2")
        for name in ("honest", "honest2"):
            wait_for_event(swarm, name, "ready")
        swarm.start_peer(0, "--steps", STEPS, name="head")
        wait_for_event(swarm, "head", "ready")
        await asyncio.to_thread(_wait, swarm, lambda: _steps(swarm) >= 3)
        # both liars join at once (each join waits for the next step whose state the replicas hash, and for its
        # record): a liar skips or refuses the other as a donor as the joiner does, and joins from an honest one
        for how in ("far", "near"):
            swarm.start_peer(1, "--serve-bad-state", how, name=f"liar_{how}", module=hostile_peer.MODULE)
        for how in ("far", "near"):
            wait_for_event(swarm, f"liar_{how}", "joined", timeout=180)
        await asyncio.to_thread(_wait, swarm, lambda: _steps(swarm) >= 8)
        # the joiner asks the liars first: by announced step it would (the far one's boast is unbeatable, the
        # near one's +2 beats the honest replicas' step while it keeps up), but under CI's load the routers may
        # set the near one aside at a missed deadline; a step behind, it announces less than the honest ones
        liars = [wait_for_event(swarm, f"liar_{how}", "ready")[0]["peer_id"] for how in ("far", "near")]
        swarm.start_peer(1, "--ask-first", ",".join(liars), name="joiner", module=donor_order_peer.MODULE)
        joined = wait_for_event(swarm, "joiner", "joined", timeout=180)[0]
        checked = wait_for_event(swarm, "joiner", "state_checked", timeout=180)[0]
        record = [e for e in swarm.events("head") if e["event"] == "state_record" and e["step"] == checked["step"]]
    finally:
        await asyncio.to_thread(swarm.stop, 5.0)
    honest = {next(e for e in swarm.events(n) if e["event"] == "ready")["peer_id"] for n in ("honest", "honest2")}
    assert joined["donor"] in honest
    log = (swarm.dir / "joiner.log").read_text()
    tried = "\n".join(line for line in log.splitlines() if "stage_peer" in line)  # each donor asked, and why not
    assert re.search(rf"{liars[0][-8:]} is not asked for the state: it announces step \d+, which the swarm's "
                     rf"records do not know", log), tried
    assert f"the state from {liars[1][-8:]} is refused: its sha256 differs from the one the swarm's records hold" \
        in log, tried
    # the joiner's state after its first step in a reduce is the one the leader's signed record holds
    assert checked["step"] > joined["step"] and checked["agrees"] and checked["sha256"] == checked["vouched"]
    assert record and record[0]["hashes"]["1"] == checked["sha256"]
    # the coordinator fetched every stage's vouched snapshots and wrote them: each file's bytes match its name
    files = sorted((checkpoints / swarm.run_hash).glob("*.snap"))
    stages = {int(re.match(r"stage(\d+)-", f.name)[1]) for f in files}
    assert stages == {0, 1}, [f.name for f in files]
    for f in files:
        assert hashlib.sha256(f.read_bytes()).hexdigest() == f.name.rsplit("-", 1)[1].removesuffix(".snap")
