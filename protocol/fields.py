"""The checks every message decoder shares (control.py, spot_check.py, state_wire.py, snapshot_wire.py).

A decoder first reads untrusted bytes into a map under its size limits (`unpack_map`), then reads each
field through one of these: each refuses a wrong value with a `WireError` that names the field, so no
decoder repeats how an integer, a microbatch list or a peer list is checked.
"""
from __future__ import annotations

import msgpack
import torch

from protocol.wire import WireError, ext_hook, need, pack_tensor

MAX_GROUP = 64  # replicas of one stage that one message may name


def same(value: object, want: object) -> bool:
    """`value == want` for untrusted values: of the same type first (a tensor compared with a
    number is a tensor, and asking a tensor for its truth raises)."""
    return type(value) is type(want) and value == want


def unpack_map(data: bytes, max_bytes: int, what: str, max_bin: int = 0) -> dict:
    """The msgpack map in `data` (tensors decoded), refused if over `max_bytes` or any of the per-field limits
    (`max_bin`: the longest byte string allowed); `what` names the message in the error."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"{what} is not a byte string.")
    need(len(data) <= max_bytes, f"{what} of {len(data)} bytes is over the limit of {max_bytes}.")
    try:
        d = msgpack.unpackb(bytes(data), ext_hook=ext_hook, raw=False, strict_map_key=False,
                            max_str_len=4096, max_bin_len=max_bin, max_array_len=4 * MAX_GROUP + 4096,
                            max_map_len=MAX_GROUP + 16)
    except WireError:
        raise
    except Exception as e:  # any malformed bytes mean the same to the sender
        raise WireError(f"{what} is not valid msgpack ({type(e).__name__}).") from None
    need(isinstance(d, dict), f"{what} is not a msgpack map.")
    return d


def int_field(d: dict, key: str, name: str, hi: int = 2**53) -> int:
    """`d[key]`, an integer in [0, hi) (not a bool)."""
    v = d.get(key)
    need(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < hi, f"{name} must be an integer in [0, {hi}).")
    return v


def microbatch_list(v: object, n: int) -> list[int]:
    """`v`, distinct microbatch indices in [0, n), sorted."""
    need(isinstance(v, list) and len(v) <= n and all(isinstance(m, int) and not isinstance(m, bool) and 0 <= m < n
                                                     for m in v) and len(set(v)) == len(v),
         f"microbatches must be distinct integers in [0, {n}).")
    return sorted(v)


def peer_id(v: object) -> str:
    need(isinstance(v, str) and 0 < len(v) <= 128, "a peer id must be a short string.")
    return v


def peer_list(v: object) -> list[str]:
    """`v`, at most `MAX_GROUP` peer ids."""
    need(isinstance(v, list) and len(v) <= MAX_GROUP and all(isinstance(p, str) and 0 < len(p) <= 128 for p in v),
         f"a peer list must hold at most {MAX_GROUP} peer ids.")
    return list(v)


def check_run(d: dict, run: str, what: str) -> None:
    """Refuse a message `d` of another run than `run`."""
    need(same(d.get("r"), run), f"{what} is for another run.")


def flag_field(d: dict, key: str, what: str) -> bool:
    """`d[key]`, true or false; false when left out (`with_flag`)."""
    need(isinstance(d.get(key, False), bool), f"{what} must be true or false.")
    return d.get(key, False)


def with_flag(d: dict, key: str, value: bool) -> dict:
    """`d` with `key: true` if `value`; a false flag is left out, so runs without it send what they did before."""
    return {**d, key: True} if value else d


def opt_tensor(t: torch.Tensor | None) -> msgpack.ExtType | None:
    """An optional tensor field: nil for None."""
    return None if t is None else pack_tensor(t)
