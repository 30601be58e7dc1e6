"""A stage's state as bytes (what a donor serves a joiner and a snapshot holds), and the hash
that names its content: what every replica reports after each applied step (the leader votes
on it per stage, `peer/state_votes.py`, and the swarm key vouches for the agreed one) and what a
joiner recomputes from the state it loaded.

    state hash = sha256 over the state dict, walked in a canonical order:
                 dict   -> "D" n, then each (key, value) sorted by repr(key)
                 list   -> "L" n, then each item
                 tensor -> "T" dtype shape, then its bytes (contiguous, CPU)
                 other  -> "S" repr(value)        (str, int, float, bool, None)

Over values, not over torch.save bytes: those are the same for equal states only because
`state_bytes` interns every string first (pickle writes a string object it met before as a
back-reference, and a state loaded from bytes has other string objects than its original); the
walk does not depend on that, and skips the serialisation.

Cost (the 2-core dev machine, CPU, one thread, loaded, both Adam moments present;
docs/security.md, "Vouched state"): `tiny` 11-26 ms a stage (5.6-6.4 MB), 4.8% of a `tiny` step
of both stages in one process (0.39 s); `small` 186-214 ms a stage (138-154 MB), 0.42% of its
step (56.6 s). So a replica hashes its state after every `HASH_EVERY`-th step only (steps
applied % k == 0: 1.2% on `tiny`), and a donor serves a joiner its state at such a step
(`peer/state_transfer.py`), which the records hold.
"""
from __future__ import annotations

import hashlib
import io
import sys

import torch

HASH_EVERY = 4  # steps between two state hashes of a replica: the hash costs well under 1% of the steps then


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
    h = hashlib.sha256()
    _feed(h, state)
    return h.hexdigest()


def _feed(h, obj: object) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}\0".encode())
        for key in sorted(obj, key=repr):
            _feed(h, key)
            _feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}\0".encode())
        for item in obj:
            _feed(h, item)
    else:
        h.update(f"S{obj!r}\0".encode())
