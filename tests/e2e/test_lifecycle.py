"""A volunteer's peer over its life: restarted with the same identity file it comes back with the
same peer id and stage; an identity file already in use is refused in one sentence; and Ctrl+C,
SIGTERM or kill -9 leave none of its processes (DHT process, p2pd, watcher) behind."""
from __future__ import annotations

import signal
import time

import pytest

from swarm.reaper import descendants
from tests.e2e.conftest import wait_for_event


def peer_args(swarm, name: str, *extra: str) -> list[str]:
    return ["peer", "--initial-peers", swarm.maddrs[0], "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--report",
            str(swarm.dir / f"{name}.jsonl"), *extra]


def forget_ended(swarm) -> None:
    """Processes this test ended on purpose are no failure of the swarm's (LocalSwarm checks all it started)."""
    swarm.procs = [(name, proc) for name, proc in swarm.procs if proc.poll() is None]


def wait_gone(pids: dict[int, int], timeout: float = 30.0) -> None:
    from swarm.reaper import _alive
    deadline = time.monotonic() + timeout
    while (left := _alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)  # poll until the processes have ended
    assert not left, f"processes left behind: {sorted(left)}"


def test_restart_with_the_same_identity_keeps_peer_id_and_stage(make_swarm, tmp_path):
    swarm = make_swarm()
    swarm.start_coordinator(serving=False)
    swarm.start_peer(0, "--steps", "100000")
    swarm.start_peer(2)
    for stage in (0, 2):
        wait_for_event(swarm, f"stage{stage}", "ready")
    identity = str(tmp_path / "volunteer.id")
    first = swarm.spawn("volunteer", peer_args(swarm, "volunteer", "--identity", identity))
    ready = wait_for_event(swarm, "volunteer", "ready")[0]
    assert ready["stage"] == 1  # the only stage left
    wait_for_event(swarm, "stage0", "step", count=2)

    # the same identity file in a second process, while the first runs: one clear sentence
    twin = swarm.spawn("twin", peer_args(swarm, "twin", "--identity", identity))
    assert twin.wait(timeout=120) == 1
    log = (swarm.dir / "twin.log").read_text()
    assert "is in use by another running peer" in log and "Traceback" not in log, log[-2000:]

    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 0
    forget_ended(swarm)
    # meanwhile stage 1 gets another peer, so that `--stage auto` alone would now pick stage 0 (the
    # volunteer kept no checkpoint and the run is younger than its first snapshot: stage 1 restores its
    # initial state and the swarm rolls back to step 0)
    swarm.start_peer(1, name="other")
    wait_for_event(swarm, "other", "ready")
    restored = wait_for_event(swarm, "other", "restored")[0]
    assert restored["step"] == 0, restored
    deadline = time.monotonic() + 60
    while "every stage rolls back to step 0" not in (swarm.dir / "stage0.log").read_text():
        assert time.monotonic() < deadline, "the head did not roll the swarm back to step 0"
        time.sleep(0.2)  # poll the head's log

    swarm.spawn("volunteer-again", peer_args(swarm, "volunteer-again", "--identity", identity))
    again = wait_for_event(swarm, "volunteer-again", "ready")[0]
    assert again["peer_id"] == ready["peer_id"]
    assert again["stage"] == 1


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "sigterm", "kill-9"])
def test_a_stopped_or_killed_peer_leaves_no_process(make_swarm, sig):
    swarm = make_swarm()
    swarm.start_coordinator(serving=False)
    peer = swarm.spawn("peer", peer_args(swarm, "peer", "--stage", "1"))
    wait_for_event(swarm, "peer", "ready")
    family = descendants(peer.pid, skip=-1)
    assert len(family) >= 3, family  # the DHT's process, its p2pd and the watcher at least
    peer.send_signal(sig)
    code = peer.wait(timeout=60)
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 0)
    wait_gone(family)
