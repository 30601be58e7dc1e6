"""The state hash (peer/runner/state_hash.py): the walk its docstring states, with each tensor's bytes
hashed in pieces on a pool of threads; recomputed here from the formula, it is the same; any
changed byte, shape, dtype or key changes it; a state that went through bytes keeps it."""
from __future__ import annotations

import hashlib

import pytest
import torch

import peer.runner.state_hash as state_hash
from peer.runner.state_hash import state_bytes, state_sha256
from peer.state.state_transfer import load_state_bytes


def by_the_formula(state: dict, piece: int) -> str:
    h = hashlib.sha256()

    def feed(obj: object) -> None:
        if isinstance(obj, torch.Tensor):
            h.update(f"T{obj.dtype}{tuple(obj.shape)}\0".encode())
            raw = obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            cuts = [raw[a:a + piece] for a in range(0, max(len(raw), 1), piece)]
            h.update(hashlib.sha256(b"".join(hashlib.sha256(c).digest() for c in cuts)).digest())
        elif isinstance(obj, dict):
            h.update(f"D{len(obj)}\0".encode())
            for key in sorted(obj, key=repr):
                feed(key)
                feed(obj[key])
        elif isinstance(obj, (list, tuple)):
            h.update(f"L{len(obj)}\0".encode())
            for item in obj:
                feed(item)
        else:
            h.update(f"S{obj!r}\0".encode())
    feed(state)
    return h.hexdigest()


def a_state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"module": {"w": torch.randn(40, 30, generator=g), "b": torch.randn(30, generator=g).bfloat16()},
            "optimizer": {"state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.randn(1000, generator=g)}},
                          "param_groups": [{"lr": 1e-3, "params": [0, 1]}]},
            "empty": torch.zeros(0), "step": 12, "name": "stage", "none": None}


@pytest.mark.parametrize("piece", [64, 1000, 64 << 20])  # many pieces a tensor, a few, one
def test_the_hash_is_the_stated_walk_whatever_the_piece_size(piece, monkeypatch):
    monkeypatch.setattr(state_hash, "PIECE_BYTES", piece)
    state = a_state()
    assert state_sha256(state) == by_the_formula(state, piece)


def test_any_changed_byte_shape_dtype_or_key_changes_the_hash(monkeypatch):
    monkeypatch.setattr(state_hash, "PIECE_BYTES", 256)
    base = state_sha256(a_state())
    changed = []
    for at in (0, 63, 64, 999):  # first piece, a piece's last and next element, the last piece
        s = a_state()
        s["optimizer"]["state"][0]["exp_avg"][at] += 1e-6
        changed.append(s)
    s = a_state()
    s["module"]["w"] = s["module"]["w"].reshape(30, 40)
    changed.append(s)
    s = a_state()
    s["module"]["b"] = s["module"]["b"].half()  # same size, other dtype
    changed.append(s)
    s = a_state()
    s["module"]["v"] = s["module"].pop("w")
    changed.append(s)
    hashes = [state_sha256(c) for c in changed]
    assert base not in hashes and len(set(hashes)) == len(hashes)


def test_a_state_through_bytes_keeps_its_hash():
    state = a_state()
    assert state_sha256(load_state_bytes(state_bytes(state))) == state_sha256(state)
