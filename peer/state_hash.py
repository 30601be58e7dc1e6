"""A stage's state as bytes (what a donor serves a joiner and a snapshot holds), and the hash
that names its content: what every replica reports after each applied step (the leader votes
on it per stage, `peer/state_votes.py`, and the swarm key vouches for the agreed one) and what a
joiner recomputes from the state it loaded.

    state hash = sha256 over the state dict, walked in a canonical order:
                 dict   -> "D" n, then each (key, value) sorted by repr(key)
                 list   -> "L" n, then each item
                 tensor -> "T" dtype shape, then its bytes (contiguous, CPU)
                 other  -> "S" repr(value)        (str, int, float, bool, None)

Not sha256(torch.save(...)): pickle writes a string it has met before as a back-reference, so
two equal states serialise to different bytes when one of them was loaded (its dict keys are
other string objects): a joiner's state after `load_state_dict` equals its donor's in every
value, yet not in torch.save bytes. The walk sees values only.

Cost (measured on the 2-core dev machine, CPU, one thread, after an optimizer step, so with both
Adam moments): see docs/security.md, "Vouched state". It is far below 1% of a step, so every step
is hashed; `StepCommit.hash_every` hashes every k-th step instead.
"""
from __future__ import annotations

import hashlib
import io

import torch


def state_bytes(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


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
