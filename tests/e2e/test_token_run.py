"""A run on a prepared token folder, end to end: a BPE tokenizer trained and a folder prepared as
docs/own-corpus.md says, `swarm local --tokens DIR` (coordinator + 3 peers as OS processes), and the
head's per-step losses equal the in-process oracle's on the same spec and the same `TokenStore`
microbatches: the folder's tokens, with the tokenizer's vocabulary, are what the swarm trained on."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from peer.data.batches import BatchSource
from peer.data.run_tokens import recorded_tokens, with_tokens
from peer.data.shards import prepare
from peer.data.token_store import TokenStore
from peer.data.tokenizer import train_bpe
from peer.runner.pipeline import InProcessPipeline
from protocol.spec import RunSpec, preset
from swarm.local_reports import report_events
from tests.peer.test_tokenizer import corpus_text

STEPS = 6


def oracle_losses(spec: RunSpec, folder) -> list[float]:
    """The one-process pipeline on the microbatches every head draws from the folder, on one torch
    thread as in the peers (the same fp32 sums)."""
    source = BatchSource(TokenStore(folder), spec.seq_len, spec.microbatch_size, spec.data_seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pipe = InProcessPipeline(spec)
        return [pipe.train_step(step, source.microbatch).loss for step in range(STEPS)]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.e2e
def test_swarm_local_on_a_token_folder_matches_the_oracle(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    for seed in range(4):  # ~300 KB of text
        (texts / f"{seed}.txt").write_text(corpus_text(seed, 1800), encoding="utf-8")
    tok = train_bpe(texts, 384, tmp_path / "tokenizer.json")
    folder = tmp_path / "tokens"
    prepare(texts, tok, folder, shard_tokens=20_000, progress=False)
    spec = with_tokens(preset("tiny"), str(folder))
    assert spec.vocab == tok.vocab_size > 256  # two-byte token ids on the wire

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "swarm.cli", "local", "--preset", "tiny", "--tokens", str(folder), "--steps",
           str(STEPS), "--workdir", str(run), "--threads", "1", "--quiet", "--no-dashboard"]
    # swarm local stops every process it started, also when killed at the timeout (they exit with it)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, f"swarm local failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert f"done: {STEPS} steps" in done.stdout

    started = RunSpec.load(run / "run.json")  # the spec swarm local gave its coordinator
    assert started == spec and recorded_tokens(started)["path"] == str(folder)
    by_step: dict[int, dict] = {}
    for e in report_events(run / "stage0.jsonl"):
        if e["event"] == "step":  # a re-driven step is reported again: its last report counts
            by_step[e["step"]] = e
    assert sorted(by_step) == list(range(1, STEPS + 1))
    swarm = [by_step[s]["loss"] for s in range(1, STEPS + 1)]
    for step, (a, b) in enumerate(zip(swarm, oracle_losses(spec, folder)), start=1):
        assert abs(a - b) / abs(b) < 1e-5, f"step {step}: swarm loss {a} vs oracle {b}"
    head_log = (run / "stage0.log").read_text()
    assert f"training on token folder {folder}" in head_log
