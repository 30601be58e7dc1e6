"""A head's data memory stays at a microbatch whatever the corpus size: `TokenStore` reads each window with
one `os.pread` of that window's bytes (two across a shard boundary), never a whole shard, no memory map, and
the data-memory bench's corpus writer (swarm/bench/hardware/data_memory.py) makes a folder a head accepts."""
from __future__ import annotations

import os

import numpy as np
import pytest

from peer.data import token_store
from peer.data.batches import BatchSource
from peer.data.token_store import TokenStore
from swarm.bench.hardware.data_memory import measure, write_random_store

SEQ, MB = 63, 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("reads")
    write_random_store(root, 200_000, shard_tokens=50_000, vocab=1000, val_tokens=5_000, seed=3)
    return root


def test_every_read_is_one_window_never_a_shard(folder, monkeypatch):
    store = TokenStore(folder)  # every shard's sha256 checked: the manifest the writer made is valid
    assert store.total_tokens == 200_000 and len(store.manifest.shards) == 4 and store.val_tokens == 5_000
    reads: list[int] = []
    real = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        reads.append(n)
        return real(fd, n, offset)

    monkeypatch.setattr(token_store.os, "pread", counting)
    monkeypatch.setattr(np, "memmap", None)  # a memory map would fail here
    monkeypatch.setattr(np, "fromfile", None)
    src = BatchSource(store, SEQ, MB, seed=1)
    batches = [src.microbatch(step, i) for step in range(50) for i in range(2)] + src.val_batches(4)
    window_bytes = (SEQ + 1) * 2  # uint16
    assert reads and max(reads) <= window_bytes
    assert len(reads) <= len(batches) * MB * 2  # one read a window, two where it crosses a shard
    assert sum(reads) == len(batches) * MB * window_bytes  # exactly the windows' bytes, nothing more

    # the windows are the tokens on disk: shard bytes read back whole (outside the patched reader) agree
    monkeypatch.undo()
    raw = np.concatenate([np.fromfile(folder / s.name, dtype="<u2") for s in store.manifest.shards])
    starts = [49_990, 0, 195_000 - SEQ - 1]  # across the first boundary, the first and the last training window
    got = store.gather(starts, SEQ + 1)
    for row, start in zip(got, starts):
        assert row.tolist() == raw[start:start + SEQ + 1].tolist()


def test_the_bench_measures_a_small_store(folder):
    row = measure(folder, steps=40, seq_len=SEQ, microbatch_size=MB)
    assert row["corpus_bytes"] == 400_000 and row["steps"] == 40 and row["data_peak_rss_kib"] >= 0
    assert row["microbatch_bytes"] == MB * (SEQ + 1) * 8
