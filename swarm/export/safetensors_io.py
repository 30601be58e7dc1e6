"""Safetensors files that are the same bytes for the same tensors, written atomically.

`safetensors` lays out the tensors deterministically but writes the `__metadata__` map in
hash-map order, which changes from process to process; the same export would then hash
differently each time. `canonical_bytes` re-emits the header with the metadata keys
sorted (the format allows any key order and pads the header with spaces to 8 bytes), and
`write_atomic` replaces a file only once it is complete.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

MISSING = ("{what} needs the {package} package, which subspace-swarm's own install brings: run "
           "`pip install -e .` in the clone (or `pip install {package}`) and try again.")


def safetensors_module():
    try:
        import safetensors.torch as st
    except ImportError as e:
        raise ImportError(MISSING.format(what="reading or writing an exported model", package="safetensors")) from e
    return st


def canonical_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """The safetensors serialization of `tensors` with the header keys in a fixed order."""
    raw = safetensors_module().save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata=metadata)
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    ordered = {"__metadata__": dict(sorted(meta.items()))} if meta else {}
    ordered.update(sorted(header.items()))
    text = json.dumps(ordered, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + raw[8 + n:]


def write_atomic(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` whole: a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def read_safetensors(path: str | Path, device: str = "cpu") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of a safetensors file."""
    safetensors_module()
    from safetensors import safe_open
    with safe_open(str(path), framework="pt", device=device) as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def read_metadata(path: str | Path) -> dict[str, str]:
    """The `__metadata__` of a safetensors file, without reading its tensors."""
    not_one = f"{path} is not a safetensors file; pass the folder written by `swarm export` or its model.safetensors."
    with open(path, "rb") as f:
        head = f.read(8)
        (n,) = struct.unpack("<Q", head) if len(head) == 8 else (-1,)
        if not 2 <= n <= min(os.fstat(f.fileno()).st_size - 8, 100 << 20):  # a random file's "length" is huge
            raise ValueError(not_one)
        try:
            header = json.loads(f.read(n))
        except ValueError:  # not JSON, or not UTF-8
            raise ValueError(not_one) from None
    if not isinstance(header, dict):
        raise ValueError(not_one)
    return dict(header.get("__metadata__") or {})
