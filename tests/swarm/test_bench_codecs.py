"""Smoke test of `swarm bench codecs`: real buffers, files written, the headline ratio holds."""
from __future__ import annotations

import json

import pytest

from swarm.bench.hardware.codecs import run_codecs_bench


@pytest.mark.e2e  # a whole benchmark
def test_codecs_bench_smoke(tmp_path):
    result = run_codecs_bench(str(tmp_path), smoke=True)
    data = json.loads((tmp_path / "codecs.json").read_text())
    assert data["ratios"] == {d: {c: v for c, v in r.items()} for d, r in result["ratios"].items()}
    png = (tmp_path / "codecs.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    assert data["ratios"]["1024"]["subspace"] >= 80
    assert data["ratios"]["1024"]["dense"] == 1.0
    assert data["ratios"]["1024"]["bottleneck"] > 50
    for row in data["rows"]:
        assert row["bytes_per_token"] > 0 and row["encode_us_per_token"] > 0 and row["decode_us_per_token"] > 0
        if row["codec"] == "subspace" and row["d"] == 1024:
            assert row["width"] == 10
            # k bf16 numbers + a uint16 id per token (+ one extra id per row and the header)
            assert 22 < row["bytes_per_token"] < 23
