"""Reading a peer's JSON-lines report while the peer writes it: a half-written record is not read yet."""
from __future__ import annotations

import json

from swarm.local_reports import report_events
from swarm.node import Reporter


def test_a_half_written_record_waits_for_its_newline(tmp_path):
    path = tmp_path / "stage0.jsonl"
    assert report_events(path) == []
    Reporter(str(path)).write("step", step=1, loss=3.5)
    whole = path.read_text()
    record = json.dumps({"event": "step", "time": 2.0, "step": 2, "parts": {f"p{i}": i / 7 for i in range(40)}})
    with open(path, "a") as f:
        f.write(record[: len(record) // 2])
    events = report_events(path)
    assert [e["step"] for e in events] == [1] and events[0]["loss"] == 3.5
    with open(path, "a") as f:
        f.write(record[len(record) // 2:] + "\n")
    events = report_events(path)
    assert [e["step"] for e in events] == [1, 2] and events[1]["parts"]["p39"] == 39 / 7
    assert path.read_text().startswith(whole)
