"""`swarm bench transport` at smoke size: real frames over a raw TCP connection, over libp2p streams between
two real p2pd daemons and over our Transport, each counted; the figures are consistent with each other and
the daemons are stopped."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from swarm.bench.hardware.transport import BOTH_WAYS, CASES, boundary_bytes_per_token, run_transport_bench


def _our_p2pd() -> list[int]:
    """p2pd daemons that are children of this process (another xdist worker's are not ours)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" ", 1)
        except OSError:
            continue  # ended meanwhile
        name, fields = rest.rsplit(")", 1)
        if name.lstrip("(") == "p2pd" and int(fields.split()[1]) == os.getpid():
            found.append(int(pid))
    return found


@pytest.mark.e2e
def test_transport_bench_smoke(tmp_path):
    result = run_transport_bench(str(tmp_path), smoke=True)
    assert not _our_p2pd(), "the bench left p2pd daemons running"
    written = json.loads((tmp_path / "transport.json").read_text())
    assert written["summary"] == result["summary"]
    assert (tmp_path / "transport.png").stat().st_size > 10_000
    rows = {r["case"]: r for r in written["summary"]}
    assert set(rows) == set(CASES)
    assert all(r["mb_per_s"] > 0 for r in rows.values())
    assert abs(rows["tcp"]["ratio_to_tcp"] - 1) < 1e-12
    for r in rows.values():
        assert abs(r["ratio_to_tcp"] - r["mb_per_s"] / rows["tcp"]["mb_per_s"]) < 1e-9
    # every frame of every case was timed: the runs hold each case once per round and size
    assert sorted(r["case"] for r in written["runs"]) == sorted(CASES)
    assert {c["case"] for c in written["caps"]} == set(BOTH_WAYS) == {"transport x2", "direct x2", "transport 2p",
                                                                     "direct 2p"}
    for cap in written["caps"]:
        assert cap["bytes_per_token"] == boundary_bytes_per_token(cap["preset"], cap["codec"], cap["dtype"])
        want = rows[cap["case"]]["mb_per_s"] * 1e6 / cap["bytes_per_token"]  # smoke measures one frame size
        assert abs(cap["tokens_per_second_cap"] - want) < 1e-6 * want
    dense, subspace = (next(c for c in written["caps"] if c["codec"] == k) for k in ("dense", "subspace"))
    assert dense["bytes_per_token"] == 16 * subspace["bytes_per_token"]  # small: d=512 against k=32, both bf16
