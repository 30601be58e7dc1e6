"""replica_sync "powersgd" in a real swarm (separate processes over libp2p, run spec signed by the
coordinator): both rounds of the reduce get through the transport and the membership checks,
two replicas of stage 1 end bit-identical, and each sends a fraction of what "exact" would.
One head drives: a second head would join by download and take the lead mid-run, which tests
the driver's hand-over (tests/e2e/test_replica_swarm.py does), not the sync."""
from __future__ import annotations

import math

import torch

from peer.runner.checkpoint import checkpoint_path, load_checkpoint
from peer.runner.stage import StageRunner
from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from tests.e2e.conftest import wait_for_event


def test_powersgd_replicas_over_libp2p_end_identical_and_send_a_fraction_of_exact(tmp_path):
    steps = 12
    spec = preset("tiny", stages=2, batch_size=32, microbatch_size=8, lr=1e-3, replica_sync="powersgd",
                  replica_sync_rank=2)
    swarm = LocalSwarm(LocalOptions(spec, steps=steps, workdir=str(tmp_path / "run"), threads=1, quiet=True,
                                    extra_peer_args=["--rebalance-period", "0"]))
    replicas = ["stage1", "stage1r1"]  # one head; the two replicas of stage 1 are what is tested
    dirs = {n: tmp_path / f"ckpt-{n}" for n in replicas}
    try:
        swarm.start_coordinator(serving=False)
        for name in replicas:  # started together (a replica that sees the other serve downloads its state)
            swarm.start_peer(1, "--checkpoint-dir", str(dirs[name]), name=name)
        for name in replicas:  # both serve before the head starts, so both take part in every step
            run = wait_for_event(swarm, name, "ready")[0]["run"]  # the signed spec's hash
        swarm.start_peer(0, "--steps", str(steps), name="stage0")
        records = swarm.follow()
        swarm.wait_for_head()
    finally:
        swarm.stop()  # the stage-1 replicas write their checkpoints at their last step
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    losses = [r["loss"] for r in records]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.3
    a, b = (load_checkpoint(checkpoint_path(dirs[n], run, 1)) for n in replicas)
    assert a["step"] == b["step"] == steps
    for name, tensor in a["module"].items():
        assert torch.equal(tensor, b["module"][name]), f"{name} differs between the replicas"
    layout_bytes = 4 * StageRunner(spec, 1).layout.numel  # what one "exact" contribution of stage 1 carries
    for name in replicas:
        wire = next(e for e in swarm.events(name) if e["event"] == "wire")
        assert wire["synced_steps"] == steps, f"{name} did not reduce with its replica every step"
        per_step = wire["bytes_out"]["red"] / wire["synced_steps"]
        assert 0 < per_step < layout_bytes / 10, f"{name}: {per_step:.0f} bytes per step"
