"""A peer whose `--max-memory` holds no stage of the run leaves at once with one sentence that
names the smallest stage's need and the smallest card that would hold it; `--stage N` that does
not fit is refused the same way."""
from __future__ import annotations

import time

from peer.runner.memory_estimate import estimate_stage, format_bytes
from protocol.spec import preset


def _wait_exit(proc, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the peer did not leave"
        time.sleep(0.1)  # poll the child process's exit
    return proc.returncode


def test_a_peer_whose_memory_holds_no_stage_refuses_with_one_sentence(make_swarm):
    swarm = make_swarm()
    swarm.start_coordinator(serving=False)
    small = swarm.start_peer("auto", "--max-memory", "1MB", name="small")
    picky = swarm.start_peer("1", "--max-memory", "1MB", name="picky")
    assert _wait_exit(small) == 1 and _wait_exit(picky) == 1
    spec = preset("tiny", stages=3)
    least = min((estimate_stage(spec, s, device="cpu", replicated=True) for s in range(3)), key=lambda m: m.peak)
    last = (swarm.dir / "small.log").read_text().strip().splitlines()[-1]
    assert last == (f"error: no stage of tiny fits this peer's 1.0 MiB (--max-memory, else the device's free "
                    f"memory): the smallest, stage {least.stage}, needs about {format_bytes(least.peak)} (estimated "
                    f"peak), which takes an 8 GB card or larger; pass --activation-checkpointing or join from a "
                    f"larger card."), last
    last = (swarm.dir / "picky.log").read_text().strip().splitlines()[-1]
    assert last.startswith("error: stage 1 of tiny needs about") and last.endswith("or join from a larger card.")
