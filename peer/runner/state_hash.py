"""A stage's state as bytes (what a donor serves a joiner and a snapshot holds), and the hash
that names its content: what every replica reports after each applied step (the leader votes
on it per stage, `peer/checks/state_votes.py`, and the swarm key vouches for the agreed one) and what a
joiner recomputes from the state it loaded.

    state hash = sha256 over the state dict, walked in a canonical order:
                 dict   -> "D" n, then each (key, value) sorted by repr(key)
                 list   -> "L" n, then each item
                 tensor -> "T" dtype shape, then sha256(sha256(piece_1) ... sha256(piece_m))
                           over its bytes (contiguous, CPU) cut in pieces of PIECE_BYTES
                 other  -> "S" repr(value)        (str, int, float, bool, None)

The pieces are copied off the device through pinned buffers and hashed on a pool of threads
(hashlib lets go of the GIL). Measured on an H100 host (docs/results/hash_cost.py, 4.8 GB: one
stage of `large` in two, weights and both Adam moments): pageable copies 3.8 s (1.3 GB/s) and one
thread's sha256 4.1 s (1.2 GB/s), as this hash was first computed; pinned copies 0.09 s (55 GB/s)
and sha256 on 16 threads 0.30 s (16 GB/s). In a swarm (`swarm bench scale`, docs/benchmarks.md)
`large` in one stage spent 14-17 s on every 4th step with one thread, 6.6 s with the pool over
pageable copies; the pinned path was not yet timed in a swarm.

Over values, not over torch.save bytes: those are the same for equal states only because
`state_bytes` interns every string first (pickle writes a string object it met before as a
back-reference, and a state loaded from bytes has other string objects than its original); the
walk does not depend on that, and skips the serialisation.

Cost (the 2-core dev machine, CPU, one thread, loaded, both Adam moments present;
docs/security.md, "Vouched state"): `tiny` 11-26 ms a stage (5.6-6.4 MB), 4.8% of a `tiny` step
of both stages in one process (0.39 s); `small` 186-214 ms a stage (138-154 MB), 0.42% of its
step (56.6 s). So a replica hashes its state after every `HASH_EVERY`-th step only (steps
applied % k == 0: 1.2% on `tiny`), and a donor serves a joiner its state at such a step
(`peer/state/state_transfer.py`), which the records hold.
"""
from __future__ import annotations

import functools
import hashlib
import io
import os
import queue
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

HASH_EVERY = 4  # steps between two state hashes of a replica: the hash costs well under 1% of the steps then
PIECE_BYTES = 16 << 20  # a tensor's bytes are hashed in pieces of this size, in parallel
HASH_THREADS = min(16, os.cpu_count() or 1)


def state_bytes(state: dict) -> bytes:
    """torch.save of the state, with every string interned first: pickle writes a string object it
    met before as a back-reference, so without this a state loaded from bytes (its dict keys are
    other string objects) serialises differently from its equal original, and a joiner's
    snapshots would never match its donor's."""
    buf = io.BytesIO()
    torch.save(_interned(state), buf)
    return buf.getvalue()


def _interned(obj: object) -> object:
    if isinstance(obj, str):
        return sys.intern(obj)
    if isinstance(obj, dict):
        return {_interned(k): _interned(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_interned(x) for x in obj)
    return obj


def state_sha256(state: dict) -> str:
    """The state hash (the walk above), hex."""
    parts: list[bytes | torch.Tensor] = []
    _walk(state, parts)
    tensors = [p for p in parts if isinstance(p, torch.Tensor)]
    pieces = [(i, t[a:a + PIECE_BYTES]) for i, t in enumerate(tensors)
              for a in range(0, max(t.numel(), 1), PIECE_BYTES)]
    staging = _staging() if any(t.is_cuda for t in tensors) else None
    with ThreadPoolExecutor(max_workers=min(HASH_THREADS, len(pieces)) or 1) as pool:
        digests = list(pool.map(lambda job: _piece_digest(job[1], staging), pieces))
    per_tensor: list[list[bytes]] = [[] for _ in tensors]
    for (i, _), d in zip(pieces, digests):
        per_tensor[i].append(d)
    h, k = hashlib.sha256(), 0
    for p in parts:
        if isinstance(p, torch.Tensor):
            h.update(hashlib.sha256(b"".join(per_tensor[k])).digest())
            k += 1
        else:
            h.update(p)
    return h.hexdigest()


def _piece_digest(piece: torch.Tensor, staging: queue.Queue | None) -> bytes:
    if not piece.is_cuda:
        return hashlib.sha256(piece.numpy()).digest()
    buf = staging.get()  # a pinned buffer of its own while it copies and hashes
    try:
        host = buf[:piece.numel()]
        host.copy_(piece)
        return hashlib.sha256(host.numpy()).digest()
    finally:
        staging.put(buf)


@functools.cache
def _staging() -> queue.Queue:
    """HASH_THREADS pinned host buffers of PIECE_BYTES, made once per process that hashes a GPU's state:
    an H100 host copied a stage's state into pageable memory at 1.3 GB/s and into pinned at 55 GB/s
    (docs/results/hash_cost.py, docs/img/hash-cost-h100.json)."""
    free: queue.Queue = queue.Queue()
    for _ in range(HASH_THREADS):
        free.put(torch.empty(PIECE_BYTES, dtype=torch.uint8, pin_memory=True))
    return free


def _walk(obj: object, parts: list) -> None:
    """The walk's headers as bytes, and each tensor's bytes as a flat uint8 tensor (still on its device)."""
    if isinstance(obj, torch.Tensor):
        parts.append(f"T{obj.dtype}{tuple(obj.shape)}\0".encode())
        parts.append(obj.detach().contiguous().reshape(-1).view(torch.uint8))
    elif isinstance(obj, dict):
        parts.append(f"D{len(obj)}\0".encode())
        for key in sorted(obj, key=repr):
            _walk(key, parts)
            _walk(obj[key], parts)
    elif isinstance(obj, (list, tuple)):
        parts.append(f"L{len(obj)}\0".encode())
        for item in obj:
            _walk(item, parts)
    else:
        parts.append(f"S{obj!r}\0".encode())
