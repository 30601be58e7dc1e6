"""`swarm local` extras without processes: TensorBoard from the head's step records, the dashboard's port."""
from __future__ import annotations

import json
import socket

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm, dashboard_port


def test_follow_writes_the_heads_steps_to_tensorboard(tmp_path):
    steps = [{"event": "step", "step": i, "loss": 5.0 - i / 10, "tokens": 1024, "seconds": 0.5 * i,
              "basis_version": 0, "lr": 1e-3, "time": 1000.0 + i} for i in range(1, 6)]
    opts = LocalOptions(preset("tiny", stages=3), steps=5, workdir=str(tmp_path / "run"), quiet=True,
                        tensorboard=str(tmp_path / "tb"))
    swarm = LocalSwarm(opts)
    (swarm.dir / "stage0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in steps + [{"event": "done"}]))

    assert [s["step"] for s in swarm.follow()] == [1, 2, 3, 4, 5]

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, round(e.value, 4)) for e in acc.Scalars("loss")] == [(i, 5.0 - i / 10) for i in range(1, 6)]
    assert [round(e.value) for e in acc.Scalars("tokens_per_s")] == [round(1024 / (0.5 * i)) for i in range(1, 6)]
    assert [e.wall_time for e in acc.Scalars("loss")] == [1000.0 + i for i in range(1, 6)]


def test_a_taken_dashboard_port_is_replaced_by_a_free_one_and_said_so():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        port, note = dashboard_port(busy)
    assert port != busy and note == f"port {busy} is taken; the dashboard uses port {port} instead."
    assert dashboard_port(port) == (port, None)


def test_tests_do_not_start_the_dashboard_by_default():
    assert LocalOptions(preset("tiny")).dashboard is False
