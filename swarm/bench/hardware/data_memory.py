"""`swarm bench data-memory`: a head's resident memory for data, on a prepared corpus far larger than that
memory: it stays at about one microbatch (peer/data/token_store.py reads windows with pread), not the corpus.

It writes a prepared token folder of `--gb` GB straight to disk (`write_random_store`: random uint16 ids,
no tokenizing, with a valid manifest: shard sha256s and the manifest hash, so `TokenStore` checks it as a
head does), then, in a fresh process, opens it as a head does (every shard's size and sha256 checked),
draws `--steps` random (step, microbatch) pairs through `BatchSource`, and the validation batches, and
reports the peak resident memory less the process's own before the store was opened:

    data RSS = VmHWM (peak, reset through /proc/self/clear_refs once torch and the data code are imported)
               - VmRSS at that moment
(reported for opening the store, every shard hashed in 8 MB reads, and for the draws alone, the peak reset
between them). The page cache holds what was read, but it is the kernel's, not the process's resident memory.

Writes data_memory.json (with the machine) and removes the folder unless `--keep`. Linux only (/proc).
Run as `python -m swarm.bench.hardware.data_memory --out DIR --gb 5 --steps 3000`; `--measure DIR` runs the
measuring half alone on a prepared folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from peer.data.manifest import MANIFEST_NAME, Manifest, ShardRecord
from peer.data.tokenizer import atomic_write_bytes

__all__ = ["measure", "run_data_memory_bench", "write_random_store"]

CHUNK_TOKENS = 16 << 20  # tokens generated and written at a time (32 MB of uint16)
RANDOM_TOKENIZER_SHA256 = hashlib.sha256(b"subspace-swarm data-memory bench: uniform random token ids").hexdigest()


def write_random_store(folder: str | os.PathLike[str], total_tokens: int, *, shard_tokens: int = 256 << 20,
                       vocab: int = 32768, val_tokens: int = 1 << 20, seed: int = 0) -> Manifest:
    """A prepared token folder of `total_tokens` uniform random uint16 ids in shards of `shard_tokens`, with
    its manifest (sha256s computed as the shards are written). Memory: one chunk of `CHUNK_TOKENS`."""
    if not 0 < vocab <= 1 << 16 or val_tokens >= total_tokens:
        raise ValueError("vocab must be in (0, 65536] and val_tokens below total_tokens.")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shards, left, index = [], total_tokens, 0
    while left:
        n, name = min(shard_tokens, left), f"shard_{index:05d}.bin"
        digest, done = hashlib.sha256(), 0
        with open(out / name, "wb") as f:
            while done < n:
                data = rng.integers(0, vocab, min(CHUNK_TOKENS, n - done), dtype=np.uint16).astype("<u2").tobytes()
                f.write(data)
                digest.update(data)
                done += len(data) // 2
        shards.append(ShardRecord(name, n, digest.hexdigest()))
        left, index = left - n, index + 1
    manifest = Manifest(RANDOM_TOKENIZER_SHA256, vocab, None, "uint16", tuple(shards), val_tokens, 1)
    atomic_write_bytes(out / MANIFEST_NAME, manifest.to_bytes())
    return manifest


def _status_kib(field: str) -> int:
    """A /proc/self/status memory line (VmRSS, VmHWM) in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    """VmHWM := VmRSS (Linux >= 4.0: writing 5 to clear_refs resets the peak resident size)."""
    Path("/proc/self/clear_refs").write_text("5")


def measure(folder: str | os.PathLike[str], steps: int = 3000, seq_len: int = 1024, microbatch_size: int = 8,
            seed: int = 0, verify: bool = True) -> dict:
    """Open `folder` as a head does and draw `steps` random microbatches and 16 validation ones; the peak
    resident memory this added (KiB, see the module docstring) and the times."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the head's reads are single-threaded; restored below for an in-process caller
    try:
        return _measure(folder, steps, seq_len, microbatch_size, seed, verify)
    finally:
        torch.set_num_threads(threads)


def _measure(folder: str | os.PathLike[str], steps: int, seq_len: int, microbatch_size: int, seed: int,
             verify: bool) -> dict:
    import torch

    from peer.data.batches import BatchSource
    from peer.data.token_store import TokenStore

    BatchSource(torch.zeros(seq_len + 2, dtype=torch.long), seq_len, 1, 0).microbatch(0, 0)  # warm the code paths
    baseline = _status_kib("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    store = TokenStore(folder, verify=verify)
    opened_s = time.perf_counter() - t0
    after_open = _status_kib("VmHWM") - baseline
    _reset_peak()  # the draws' own peak, apart from the hashing's 8 MB reads
    src = BatchSource(store, seq_len, microbatch_size, seed)
    draw = random.Random(seed)
    checksum, t0 = 0, time.perf_counter()
    for _ in range(steps):
        batch = src.microbatch(draw.randrange(1 << 30), draw.randrange(64))
        checksum += int(batch[:, 0].sum())  # use the data: nothing may be skipped
    read_s = time.perf_counter() - t0
    checksum += sum(int(b.sum()) for b in src.val_batches(16))
    size = sum((Path(folder) / s.name).stat().st_size for s in store.manifest.shards)
    return {"corpus_bytes": size, "shards": len(store.manifest.shards), "total_tokens": store.total_tokens,
            "steps": steps, "seq_len": seq_len, "microbatch_size": microbatch_size, "verify": verify,
            "microbatch_bytes": microbatch_size * (seq_len + 1) * 8, "baseline_rss_kib": baseline,
            "peak_after_open_kib": after_open, "draws_peak_rss_kib": _status_kib("VmHWM") - baseline,
            "data_peak_rss_kib": max(after_open, _status_kib("VmHWM") - baseline),
            "open_s": opened_s, "read_s": read_s, "microbatches_per_s": steps / read_s, "checksum": checksum}


def run_data_memory_bench(out_dir: str, gb: float = 5.0, steps: int = 3000, folder: str | None = None,
                          keep: bool = False, seq_len: int = 1024, microbatch_size: int = 8,
                          smoke: bool = False) -> dict:
    """Write the corpus, measure it in a fresh process, write data_memory.json; returns the result."""
    from swarm.bench.common.machine import machine_info

    if smoke:
        gb, steps = 0.02, 200
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    where = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="swarm-data-memory-", dir="/tmp"))
    try:
        t0 = time.perf_counter()
        total = int(gb * 1e9) // 2
        m = write_random_store(where, total, shard_tokens=min(256 << 20, total))
        write_s = time.perf_counter() - t0
        print(f"wrote {total * 2 / 1e9:.2f} GB in {len(m.shards)} shards to {where} in {write_s:.0f} s", flush=True)
        cmd = [sys.executable, "-m", "swarm.bench.hardware.data_memory", "--measure", str(where), "--steps",
               str(steps), "--seq-len", str(seq_len), "--microbatch-size", str(microbatch_size)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        if not keep:
            shutil.rmtree(where, ignore_errors=True)
    result = {"bench": "data-memory", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": machine_info([]), "write_s": write_s, **row}
    (out / "data_memory.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"data RSS {row['data_peak_rss_kib'] / 1024:.1f} MiB at most for a {row['corpus_bytes'] / 1e9:.2f} GB "
          f"corpus: opening it (every shard hashed) {row['peak_after_open_kib'] / 1024:.1f} MiB, {steps} random "
          f"microbatches {row['draws_peak_rss_kib'] / 1024:.1f} MiB", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    """The bench (`--out DIR --gb G --steps N`), or with `--measure DIR` its measuring half (one JSON line)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m swarm.bench.hardware.data_memory",
                                description="A head's resident memory for data on a generated prepared corpus.")
    p.add_argument("--out", default="bench-out", metavar="DIR", help="where data_memory.json goes (default: bench-out)")
    p.add_argument("--gb", type=float, default=5.0, help="corpus size on disk, GB (default: 5)")
    p.add_argument("--folder", metavar="DIR", help="write the corpus here (default: a new folder under /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the corpus afterwards (default: removed)")
    p.add_argument("--smoke", action="store_true", help="20 MB and 200 steps (default: off)")
    p.add_argument("--measure", metavar="DIR", help="only measure this prepared folder, printing one JSON line")
    p.add_argument("--steps", type=int, default=3000, help="random microbatches drawn (default: 3000)")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per window less one (default: 1024)")
    p.add_argument("--microbatch-size", type=int, default=8, help="windows per microbatch (default: 8)")
    a = p.parse_args(argv)
    if a.measure:
        print(json.dumps(measure(a.measure, a.steps, a.seq_len, a.microbatch_size)))
    else:
        run_data_memory_bench(a.out, a.gb, a.steps, a.folder, a.keep, a.seq_len, a.microbatch_size, a.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
