"""`FrameTrace` (swarm/net/frame_trace.py): events written as JSON lines and read back, a cut-off last line
left out, nothing written once closed; `swarm local --trace-frames DIR` hands every peer its own file."""
from __future__ import annotations

from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from swarm.net.frame_trace import EVENTS, FrameTrace, read_trace


def test_events_are_written_as_lines_and_read_back(tmp_path):
    path = tmp_path / "sub" / "peer.frames.jsonl"
    trace = FrameTrace(path)
    trace.note("queued", "act", "12D3KooA", 262751)
    trace.note("arrived", "grad", "12D3KooB", 262227, wait=0.125)
    trace.close()
    trace.note("sent", "act", "12D3KooA", 1)  # after close: dropped, not an error
    with path.open("a") as f:
        f.write('{"t": 1.0, "event": "tur')  # a crash mid-line
    got = read_trace(path)
    assert [(e.event, e.kind, e.peer, e.bytes, e.wait) for e in got] == [
        ("queued", "act", "12D3KooA", 262751, None), ("arrived", "grad", "12D3KooB", 262227, 0.125)]
    assert got[0].t <= got[1].t and {e.event for e in got} <= set(EVENTS)


def test_swarm_local_gives_each_peer_its_own_trace_file(tmp_path, monkeypatch):
    swarm = LocalSwarm(LocalOptions(preset("tiny"), workdir=str(tmp_path / "run"), trace_frames="traces", quiet=True))
    swarm.maddrs = ["/ip4/127.0.0.1/tcp/1/p2p/x"]
    spawned = []
    monkeypatch.setattr(swarm, "spawn", lambda name, args, **_: spawned.append((name, args)))
    monkeypatch.chdir(tmp_path)
    swarm.start_peer(0)
    swarm.start_peer(1, name="late")
    for name, args in spawned:
        assert args[args.index("--trace-frames") + 1] == str(tmp_path / "traces" / f"{name}.frames.jsonl")
