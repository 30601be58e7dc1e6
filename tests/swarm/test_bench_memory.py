"""`swarm bench memory` off the GPU: it refuses with one sentence, and its plot draws the
committed H100 results (docs/img/memory-gpu-h100.json) into a PNG."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm.bench.hardware.memory import main, plot, run_memory_bench

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_needs_a_gpu(tmp_path, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="run it on a GPU"):
        run_memory_bench(str(tmp_path), presets=["tiny"], device="cuda")


def test_plot_draws_the_committed_results(tmp_path):
    pytest.importorskip("matplotlib")
    result = json.loads((ROOT / "docs/img/memory-gpu-h100.json").read_text())
    assert {r["preset"] for r in result["rows"]} == {"small", "large", "xl", "paper8b"}
    plot(result, tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    copy = tmp_path / "again.json"
    copy.write_text(json.dumps(result))
    assert main(["--plot", str(copy)]) == 0 and (tmp_path / "again.png").stat().st_size > 10_000
