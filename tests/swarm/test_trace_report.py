"""`swarm trace` (swarm/net/trace_report.py): the phases of each request from its numbered events, the
uplink's busy share as the union of its requests' times on the wire, the downlink's waits; the command
on a folder of traces, its JSON, and one-sentence errors."""
from __future__ import annotations

import json

import pytest

from swarm.cli import main
from swarm.net.frame_trace import FrameEvent, FrameTrace
from swarm.net.trace_report import Spread, covered, peer_times


def _request(frame: int, kind: str, queued: float, turn: float, sent: float, reply: float, nbytes: int):
    return [FrameEvent(t, event, kind, "B", nbytes if event != "reply" else 10, frame=frame)
            for t, event in ((queued, "queued"), (turn, "turn"), (sent, "sent"), (reply, "reply"))]


def test_union_of_intervals_and_spreads():
    assert covered([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == pytest.approx(4.0)
    assert covered([]) == 0.0
    assert Spread.of([0.3, 0.1, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]) == Spread(0.6, 1.0, 1.0)
    assert Spread.of([]) == Spread(0.0, 0.0, 0.0)


def test_a_peers_phases_busy_share_and_downlink_waits():
    events = [*_request(1, "act", 0.0, 0.0, 1.0, 1.5, 1000),  # at once on the wire for 1 s
              *_request(2, "act", 0.5, 1.0, 2.0, 2.5, 1000),  # queued 0.5 s behind the first
              *_request(3, "grad", 3.0, 3.0, 3.5, 4.0, 500),
              FrameEvent(2.2, "arrived", "grad", "B", 300, wait=0.25),  # a request for us
              FrameEvent(2.3, "answered", "grad", "B", 0),
              FrameEvent(5.0, "arrived", "act", "B", 400, wait=0.05)]
    p = peer_times("a", events)
    assert p.span_s == pytest.approx(5.0) and p.uplink_busy == pytest.approx(2.5 / 5.0)  # [0, 2] and [3, 3.5]
    assert (p.requests_out, p.bytes_out, p.requests_in, p.bytes_in) == (3, 2500, 1, 700)
    assert p.downlink_wait_s == pytest.approx(0.3) and p.downlink_wait_max_s == 0.25
    act, grad = p.kinds
    assert (act.kind, act.requests, grad.kind, grad.requests) == ("act", 2, "grad", 1)
    assert act.queued.max == pytest.approx(0.5) and act.wire.median == pytest.approx(1.0)
    assert grad.reply == Spread(0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="holds no frame events"):
        peer_times("empty", [])


def test_the_command_reads_a_folder_and_writes_json(tmp_path, capsys):
    for name in ("stage0", "stage1"):
        trace = FrameTrace(tmp_path / "traces" / f"{name}.frames.jsonl")
        for event in ("queued", "turn", "sent", "reply"):
            trace.note(event, "act", "B", 100, frame=1)
        trace.close()
    assert main(["trace", str(tmp_path / "traces"), "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert out.count("uplink busy") == 2 and "stage0:" in out and "stage1:" in out
    written = json.loads((tmp_path / "t.json").read_text())
    assert [p["name"] for p in written] == ["stage0", "stage1"] and written[0]["kinds"][0]["requests"] == 1
    assert main(["trace", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "none").mkdir()
    assert main(["trace", str(tmp_path / "none")]) == 2
    assert "holds no *.frames.jsonl files" in capsys.readouterr().err
