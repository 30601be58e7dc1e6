"""The tokenizer a run trains with, as its run spec pins it: found on this machine, checked, loaded.

A run on a prepared token folder (peer/data/run_tokens.py) records its tokenizer's sha256 in
`extra["tokens"]["tokenizer_sha256"]`; that hash, not a path, names the tokenizer. `swarm data prepare`
keeps a copy of the tokenizer file in the folder it prepares (`tokenizer.json`, beside the manifest,
outside the manifest's hash), so the folder is all a machine needs; a folder that lacks it (copied
without it, or prepared before the copy was kept) gets it from the swarm (peer/data/tokenizer_share.py),
checked against the same hash, and keeps it there.

- `run_tokenizer_sha256(spec)`: the hash, or None for a run on bytes (nothing to find or fetch);
- `find_run_tokenizer(spec, folders)`: the first `tokenizer.json` of the given folders, then of the
  recorded folder, whose hash is the run's (a file there of another hash is an error: one sentence);
- `load_run_tokenizer(spec, ...)`: the tokenizer itself (`ByteTokenizer` for a run on bytes);
- `keep_tokenizer(data, sha256, folder)`: fetched bytes checked and written into a folder.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from protocol.spec import RunSpec

from .corpus import DataError
from .manifest import TOKENIZER_NAME, sha256_file
from .run_tokens import recorded_tokens
from .tokenizer import BpeTokenizer, ByteTokenizer, atomic_write_bytes

__all__ = ["TOKENIZER_NAME", "find_run_tokenizer", "keep_tokenizer", "load_run_tokenizer", "run_tokenizer_sha256",
           "token_folders"]

def run_tokenizer_sha256(spec: RunSpec) -> str | None:
    """The sha256 of the tokenizer file `spec` pins, or None for a run on bytes."""
    record = recorded_tokens(spec)
    sha = record.get("tokenizer_sha256") if record is not None else None
    return sha if isinstance(sha, str) and sha != ByteTokenizer.sha256 else None


def token_folders(spec: RunSpec, folder: str | os.PathLike[str] | None = None) -> list[Path]:
    """The run's token folders on this machine: `folder` (a `--tokens DIR`), then the recorded path,
    those that exist."""
    record = recorded_tokens(spec)
    names = [folder, record["path"] if record is not None else None]
    return list(dict.fromkeys(Path(n) for n in names if n and Path(n).is_dir()))


FETCH_HINT = "remove it and the peer fetches the run's tokenizer from the swarm"


def wrong_file(path: Path, digest: str, want: str, hint: str = FETCH_HINT) -> DataError:
    return DataError(f"{str(path)!r} has sha256 {digest[:12]}, not this run's tokenizer ({want[:12]}, pinned by the "
                     f"signed run spec); {hint}.")


def find_run_tokenizer(spec: RunSpec, folders: Iterable[str | os.PathLike[str]] = ()) -> Path | None:
    """The run's tokenizer file on this machine, or None (also for a run on bytes). Looked for as
    `tokenizer.json` in `folders`, then in the recorded token folder; DataError (one sentence) for a
    file there whose sha256 is not the run's."""
    want = run_tokenizer_sha256(spec)
    if want is None:
        return None
    record = recorded_tokens(spec)
    candidates = [Path(f) / TOKENIZER_NAME for f in folders if f]
    candidates.append(Path(record["path"]) / TOKENIZER_NAME)
    for path in dict.fromkeys(candidates):
        if path.is_file():
            digest = sha256_file(path)
            if digest != want:
                raise wrong_file(path, digest, want)
            return path
    return None


def load_run_tokenizer(spec: RunSpec, path: str | os.PathLike[str] | None = None, data: bytes | None = None
                       ) -> ByteTokenizer | BpeTokenizer:
    """The tokenizer of `spec`: `ByteTokenizer` for a run on bytes, else the BPE in `data` (bytes), `path`, or
    found by `find_run_tokenizer`, checked against the run's hash; DataError (one sentence) if it is not
    on this machine or is another tokenizer."""
    want = run_tokenizer_sha256(spec)
    if want is None:
        return ByteTokenizer()
    if data is None:
        found = Path(path) if path is not None else find_run_tokenizer(spec)
        if found is None or not found.is_file():
            raise DataError(f"this run's tokenizer (sha256 {want[:12]}) is not on this machine; pass the run's "
                            f"tokenizer.json, or get it from the running swarm (a head fetches it into its token "
                            f"folder, `swarm export --initial-peers` into the export).")
        data = found.read_bytes()
        path = found
    digest = hashlib.sha256(data).hexdigest()
    if digest != want:
        raise wrong_file(Path(path or "the tokenizer given"), digest, want, "pass the run's own tokenizer.json")
    return BpeTokenizer(path or TOKENIZER_NAME, data)


def keep_tokenizer(data: bytes, sha256: str, folder: str | os.PathLike[str]) -> Path:
    """Write `data`, which must hash to `sha256`, to `folder/tokenizer.json` atomically; its path."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise DataError(f"the tokenizer bytes have sha256 {digest[:12]}, not the run's {sha256[:12]}; they were "
                        f"not kept.")
    path = Path(folder) / TOKENIZER_NAME
    atomic_write_bytes(path, data)
    return path
