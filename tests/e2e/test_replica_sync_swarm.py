"""replica_sync "powersgd" in a real swarm (separate processes over libp2p, run spec signed by the
coordinator): both rounds of the reduce get through the transport and the membership checks,
the replicas of each stage end bit-identical, and each sends a fraction of what "exact" would."""
from __future__ import annotations

import math

import torch

from peer.checkpoint import checkpoint_path, load_checkpoint
from peer.stage import StageRunner
from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm


def test_powersgd_replicas_over_libp2p_end_identical_and_send_a_fraction_of_exact(tmp_path):
    steps = 12
    spec = preset("tiny", stages=2, batch_size=32, microbatch_size=8, lr=1e-3, replica_sync="powersgd",
                  replica_sync_rank=2)
    swarm = LocalSwarm(LocalOptions(spec, steps=steps, replicas=2, workdir=str(tmp_path / "run"), threads=1,
                                    quiet=True, extra_peer_args=["--ttl", "6"]))
    names = [swarm.peer_name(s, r) for r in range(2) for s in range(2)]
    dirs = {n: tmp_path / f"ckpt-{n}" for n in names}
    try:
        swarm.start_coordinator()
        for r in range(2):
            for s in range(2):
                name = swarm.peer_name(s, r)
                swarm.start_peer(s, *(["--steps", str(steps)] if s == 0 else []), "--checkpoint-dir", str(dirs[name]),
                                 name=name)
        records = swarm.follow()
        swarm.wait_for_head()
    finally:
        swarm.stop()  # every peer writes its checkpoint at its last step
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    losses = [r["loss"] for r in records]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.3
    for s in range(2):
        a, b = (load_checkpoint(checkpoint_path(dirs[swarm.peer_name(s, r)], spec.run_hash, s)) for r in range(2))
        assert a["step"] == b["step"] == steps
        for name, tensor in a["module"].items():
            assert torch.equal(tensor, b["module"][name]), f"stage {s} {name} differs between the replicas"
    layout_bytes = 4 * StageRunner(spec, 1).layout.numel  # what one "exact" contribution of stage 1 carries
    for name in (swarm.peer_name(1, 0), swarm.peer_name(1, 1)):
        wire = next(e for e in swarm.events(name) if e["event"] == "wire")
        assert wire["synced_steps"] == steps, f"{name} did not reduce with its replica every step"
        per_step = wire["bytes_out"]["red"] / wire["synced_steps"]
        assert 0 < per_step < layout_bytes / 10, f"{name}: {per_step:.0f} bytes per step"
