"""`swarm local` extras without a swarm: TensorBoard from the head's step records, the dashboard's port,
devices per peer, and where each process is placed."""
from __future__ import annotations

import json
import socket
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm, Loopback, dashboard_port, parse_devices


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


def _spawned_peers(opts, monkeypatch, n):
    swarm = LocalSwarm(opts)
    swarm.maddrs = ["/ip4/127.0.0.1/tcp/1/p2p/QmCoordinator"]
    spawned = []
    monkeypatch.setattr(swarm, "spawn", lambda name, args, **_: spawned.append((name, args)))
    for stage in range(n):
        swarm.start_peer(stage)
    return spawned


def test_devices_are_given_to_peers_round_robin(tmp_path, monkeypatch):
    opts = LocalOptions(preset("tiny", stages=3), workdir=str(tmp_path), devices="cuda:0,cuda:1")
    spawned = _spawned_peers(opts, monkeypatch, 3)
    assert [args[args.index("--device") + 1] for _, args in spawned] == ["cuda:0", "cuda:1", "cuda:0"]
    plain = _spawned_peers(LocalOptions(preset("tiny"), workdir=str(tmp_path), device="cuda"), monkeypatch, 3)
    assert [args[args.index("--device") + 1] for _, args in plain] == ["cuda"] * 3
    with pytest.raises(ValueError, match="'gpu0', which is not a torch device"):
        parse_devices("cuda:0,gpu0")


@pytest.mark.e2e  # it runs the placed command
def test_a_placement_prefixes_each_command_and_names_its_address(tmp_path):
    """The prefix really runs in front of the command (here: a program that prints what follows it)."""

    class Echo(Loopback):
        def prefix(self, name):
            return [sys.executable, "-c", "import sys; print('placed', sys.argv[1:])", name]

        def host(self, name):
            return "10.0.0.7"

    swarm = LocalSwarm(LocalOptions(preset("tiny"), workdir=str(tmp_path)), Echo())
    swarm.maddrs = ["/ip4/10.0.0.1/tcp/1/p2p/QmCoordinator"]
    proc = swarm.start_peer(1)
    assert proc.wait(timeout=30) == 0
    line = (tmp_path / "stage1.log").read_text()
    assert line.startswith("placed ['stage1', ") and "'-m', 'swarm.cli', 'peer'" in line
    assert "'--host-maddrs', '/ip4/10.0.0.7/tcp/0'" in line
