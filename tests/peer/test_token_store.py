"""Tests for peer/data/token_store.py and BatchSource over a store: the manifest, sizes and hashes
checked with one-sentence errors naming the file, hashes remembered by (size, mtime), windows across
shard edges, microbatches that any process regenerates, and resident memory that stays small."""
from __future__ import annotations

import gc
import json
import os

import numpy as np
import pytest
import torch

from peer.data import token_store
from peer.data.batches import BatchSource
from peer.data.corpus import DataError
from peer.data.manifest import MANIFEST_NAME, Manifest, ShardRecord, sha256_file
from peer.data.shards import prepare
from peer.data.token_store import STAMP_NAME, TokenStore
from tests.peer.test_tokenizer import corpus_text

SHARD = 1000


@pytest.fixture
def folder(tmp_path):
    """Bytes of a few documents in shards of 1000 tokens, the last 600 for validation."""
    (tmp_path / "a.txt").write_text(corpus_text(5, 900), encoding="utf-8")
    prepare(tmp_path / "a.txt", "byte", tmp_path / "out", shard_tokens=SHARD, val_tokens=600, progress=False)
    return tmp_path / "out"


def all_tokens(folder) -> np.ndarray:
    m = Manifest.read(folder / MANIFEST_NAME)
    return np.concatenate([np.fromfile(folder / s.name, dtype=m.numpy_dtype) for s in m.shards]).astype(np.int64)


def test_windows_cross_shard_edges(folder):
    store, tokens = TokenStore(folder), all_tokens(folder)
    assert store.total_tokens == tokens.size > 10 * SHARD
    for start, length in [(0, 1), (SHARD - 3, 7), (SHARD - 1, 2 * SHARD + 5), (5 * SHARD, SHARD), (tokens.size - 9, 9)]:
        assert store.window(start, length).tolist() == tokens[start:start + length].tolist()
    rows = store.gather(torch.tensor([0, SHARD - 1, 3 * SHARD - 2]), 4)
    assert rows.dtype == torch.long and rows.shape == (3, 4)
    assert rows[2].tolist() == tokens[3 * SHARD - 2:3 * SHARD + 2].tolist()
    with pytest.raises(ValueError, match="runs past"):
        store.window(tokens.size - 3, 4)


def test_microbatches_from_a_store_equal_those_from_the_same_tokens_in_memory(folder):
    tokens = torch.from_numpy(all_tokens(folder))
    store = TokenStore(folder)
    train, val = store.split()
    assert train.numel() == tokens.numel() - 600 and val.numel() == 600
    disk = BatchSource(store, 31, 4, seed=9)
    memory = BatchSource(tokens[:-600], 31, 4, seed=9, val_tokens=tokens[-600:])
    again = BatchSource(TokenStore(folder, verify=False), 31, 4, seed=9)  # another head, another process
    crossed = 0
    for step, index in [(0, 0), (0, 1), (7, 3), (123456, 0)] + [(s, 0) for s in range(40)]:
        batch = disk.microbatch(step, index)
        assert batch.shape == (4, 32) and batch.dtype == torch.long
        assert torch.equal(batch, memory.microbatch(step, index)) and torch.equal(batch, again.microbatch(step, index))
        crossed += sum(1 for row in range(4) if _crosses_an_edge(tokens, batch[row]))
    assert crossed > 0  # some windows spanned two shards
    assert all(torch.equal(a, b) for a, b in zip(disk.val_batches(3), memory.val_batches(3)))
    assert disk.name == str(folder)
    with pytest.raises(ValueError, match="own val split"):
        BatchSource(store, 31, 4, seed=9, val_tokens=tokens[:100])


def _crosses_an_edge(tokens: torch.Tensor, row: torch.Tensor) -> bool:
    windows = tokens.unfold(0, row.numel(), 1)
    start = int((windows == row).all(dim=1).nonzero()[0])
    return start // SHARD != (start + row.numel() - 1) // SHARD


def test_tokenizer_and_manifest_pins_are_checked(folder):
    m = Manifest.read(folder / MANIFEST_NAME)
    with pytest.raises(DataError, match=f"{m.tokenizer_sha256}.*not the one given \\(sha256 {'a' * 64}\\)"):
        TokenStore(folder, tokenizer_sha256="a" * 64)
    with pytest.raises(DataError, match=f"manifest_sha256 {m.manifest_sha256}, not the {'b' * 64}"):
        TokenStore(folder, manifest_sha256="b" * 64)
    assert TokenStore(folder, tokenizer_sha256=m.tokenizer_sha256, manifest_sha256=m.manifest_sha256)


def test_a_truncated_corrupt_or_missing_shard_is_named(folder):
    shard = folder / "shard_00002.bin"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1])
    with pytest.raises(DataError, match=f"token shard '{shard}' is truncated: {2 * SHARD - 1} bytes where the manifest "
                       f"says {2 * SHARD}"):
        TokenStore(folder, verify=False)
    shard.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same size, one bit flipped
    with pytest.raises(DataError, match=f"token shard '{shard}' is corrupt: its sha256 is {sha256_file(shard)}"):
        TokenStore(folder)
    assert not (folder / STAMP_NAME).exists()
    shard.unlink()
    with pytest.raises(DataError, match=f"token shard '{shard}' cannot be read"):
        TokenStore(folder)


def test_an_edited_or_missing_manifest_is_refused(folder, tmp_path):
    path = folder / MANIFEST_NAME
    body = json.loads(path.read_text())
    body["validation"]["tokens"] = 1
    path.write_text(json.dumps(body))
    with pytest.raises(DataError, match="was edited after it was written"):
        TokenStore(folder)
    path.unlink()  # as when a preparation has not finished
    with pytest.raises(DataError, match=f"'{path}' does not exist.*run `swarm data prepare`"):
        TokenStore(folder)


def test_hashes_are_remembered_by_size_and_mtime(folder, monkeypatch):
    hashed = []
    real = token_store.sha256_file
    monkeypatch.setattr(token_store, "sha256_file", lambda p: hashed.append(p.name) or real(p))
    n = len(Manifest.read(folder / MANIFEST_NAME).shards)
    TokenStore(folder)
    assert len(hashed) == n and (folder / STAMP_NAME).exists()
    TokenStore(folder)
    assert len(hashed) == n  # nothing hashed again
    shard = folder / "shard_00001.bin"
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: hashed again, only it
    TokenStore(folder)
    assert hashed[n:] == ["shard_00001.bin"]


def test_resident_memory_stays_small_while_reading_a_large_store(tmp_path):
    """Thousands of microbatches from a 256 MB store grow VmRSS by far less than the store."""
    shards, per_shard = 4, 32 << 20  # uint16 tokens: 64 MB a shard
    block = np.random.default_rng(0).integers(0, 50_000, 1 << 22, dtype=np.uint16).tobytes()  # 8 MB, repeated
    records = []
    for i in range(shards):
        with open(tmp_path / f"shard_{i:05d}.bin", "wb") as f:
            for _ in range(per_shard // (1 << 22)):
                f.write(block)
        records.append(ShardRecord(f"shard_{i:05d}.bin", per_shard, "0" * 64))  # hashes not checked below
    del block
    manifest = Manifest("0" * 64, 50_000, None, "uint16", tuple(records), 1 << 20, 1)
    (tmp_path / MANIFEST_NAME).write_bytes(manifest.to_bytes())
    gc.collect()
    source = BatchSource(TokenStore(tmp_path, verify=False), 255, 8, seed=1)
    source.microbatch(0, 0)
    before = vm_rss()
    total = 0
    for step in range(3000):
        total += int(source.microbatch(step, 0)[0, 0])
    grown = vm_rss() - before
    store_bytes = shards * per_shard * 2
    assert grown < store_bytes / 20, f"VmRSS grew by {grown / 1e6:.1f} MB reading a {store_bytes / 1e6:.0f} MB store"
    for path in tmp_path.glob("shard_*.bin"):
        path.unlink()  # 256 MB: do not leave it in pytest's kept temporary folders


def vm_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")
