"""Reading a prepared token folder (`peer/data/shards.py`): the manifest checked, every shard's
size and sha256 checked, and windows of tokens read across shard boundaries, for
`peer/data/batches.py`'s `BatchSource` to draw microbatches from.

Windows are read with `os.pread` into a small buffer, not through memory maps: a mapped page that
has been read counts in the process's resident memory until the process ends, and on Linux with
large page-cache folios a few thousand random windows of a 300 MB memory-mapped store raised VmRSS
by the whole 300 MB; pread reads only the window and keeps the resident memory of data at the size
of one microbatch, whatever the corpus size. No file stays open between reads, so a store is safe to
use from any thread or forked process.

Hashing a 100 GB corpus takes minutes, so a shard whose hash matched is remembered in
`verified.json` by (size, mtime): a later start re-hashes only shards that changed since.
"""
from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .corpus import DataError, nonneg_int, positive_int
from .manifest import MANIFEST_NAME, Manifest, sha256_file
from .tokenizer import atomic_write_bytes

__all__ = ["STAMP_NAME", "TokenRange", "TokenStore"]

STAMP_NAME = "verified.json"


class TokenStore:
    """The tokens of a prepared folder: `window`, `gather` and the train/validation `split`.

    `tokenizer_sha256` (the tokenizer the caller will use) and `manifest_sha256` (what a run spec
    pins), when given, must match the folder's; `verify=False` skips the shard hashes (sizes are
    always checked).
    """

    def __init__(self, folder: str | os.PathLike[str], *, tokenizer_sha256: str | None = None,
                 manifest_sha256: str | None = None, verify: bool = True, progress: bool = False) -> None:
        self.folder = Path(folder)
        self.name = str(folder)
        self.manifest = Manifest.read(self.folder / MANIFEST_NAME)
        m = self.manifest
        if manifest_sha256 is not None and m.manifest_sha256 != manifest_sha256:
            raise DataError(f"token folder {self.name!r} has manifest_sha256 {m.manifest_sha256}, not the "
                            f"{manifest_sha256} this run pins: pass a copy of the run's prepared folder.")
        if tokenizer_sha256 is not None and m.tokenizer_sha256 != tokenizer_sha256:
            raise DataError(f"token folder {self.name!r} was prepared with the tokenizer of sha256 "
                            f"{m.tokenizer_sha256}, not the one given (sha256 {tokenizer_sha256}): prepare it again "
                            f"with this tokenizer, or use the tokenizer it was prepared with.")
        self._dtype = m.numpy_dtype
        self._paths = [self.folder / s.name for s in m.shards]
        self._counts = [s.tokens for s in m.shards]
        self._starts = [0]
        for count in self._counts:
            self._starts.append(self._starts[-1] + count)
        self._check_sizes()
        if verify:
            self._verify_hashes(progress)

    @property
    def total_tokens(self) -> int:
        return self._starts[-1]

    @property
    def val_tokens(self) -> int:
        return self.manifest.val_tokens

    @property
    def train_tokens(self) -> int:
        return self.total_tokens - self.val_tokens

    def split(self) -> tuple[TokenRange, TokenRange]:
        """(train, validation): the validation split is the manifest's last `val_tokens` tokens."""
        return TokenRange(self, 0, self.train_tokens), TokenRange(self, self.train_tokens, self.val_tokens)

    def _check_sizes(self) -> None:
        for path, count in zip(self._paths, self._counts):
            want = count * self._dtype.itemsize
            try:
                size = path.stat().st_size
            except OSError as exc:
                raise DataError(f"token shard {str(path)!r} cannot be read ({exc.strerror or exc}); copy the "
                                f"whole prepared folder again.") from exc
            if size != want:
                what = "truncated" if size < want else "longer than it should be"
                raise DataError(f"token shard {str(path)!r} is {what}: {size} bytes where the manifest says {want}; "
                                f"copy or prepare the folder again.")

    def _verify_hashes(self, progress: bool) -> None:
        stamp_path = self.folder / STAMP_NAME
        try:
            stamp = json.loads(stamp_path.read_bytes())
            known = stamp["shards"] if stamp.get("manifest_sha256") == self.manifest.manifest_sha256 else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            known = {}
        verified = {}
        for path, record in tqdm(list(zip(self._paths, self.manifest.shards)), desc="checking token shards",
                                 unit="shard", disable=not progress):
            st = path.stat()
            mark = [st.st_size, st.st_mtime_ns]
            if known.get(record.name) != mark:
                digest = sha256_file(path)
                if digest != record.sha256:
                    raise DataError(f"token shard {str(path)!r} is corrupt: its sha256 is {digest}, the manifest "
                                    f"says {record.sha256}; copy or prepare the folder again.")
            verified[record.name] = mark
        if verified != known:
            body = {"manifest_sha256": self.manifest.manifest_sha256, "shards": verified}
            try:
                atomic_write_bytes(stamp_path, json.dumps(body).encode())
            except OSError:
                pass  # a read-only copy of the folder: it is simply hashed again at the next start

    def _read(self, fds: dict[int, int], out: np.ndarray, start: int) -> None:
        """Fill `out` with the tokens from `start` on, shard by shard."""
        i = bisect.bisect_right(self._starts, start) - 1
        filled, size = 0, self._dtype.itemsize
        while filled < out.size:
            offset = start + filled - self._starts[i]
            n = min(out.size - filled, self._counts[i] - offset)
            if i not in fds:
                fds[i] = os.open(self._paths[i], os.O_RDONLY)
            data = os.pread(fds[i], n * size, offset * size)
            if len(data) != n * size:
                raise DataError(f"token shard {str(self._paths[i])!r} became shorter after it was checked; copy "
                                f"or prepare the folder again.")
            out[filled:filled + n] = np.frombuffer(data, dtype=self._dtype)
            filled += n
            i += 1

    def gather(self, starts: torch.Tensor | list[int], length: int) -> torch.Tensor:
        """Int64 tensor [len(starts), length]: row r is the tokens [starts[r], starts[r] + length)."""
        length = positive_int("length", length)
        rows = [nonneg_int("start", int(s)) for s in (starts.tolist() if isinstance(starts, torch.Tensor) else starts)]
        if rows and max(rows) + length > self.total_tokens:
            raise ValueError(f"a window of {length} tokens from {max(rows)} runs past the store's "
                             f"{self.total_tokens} tokens")
        out = np.empty((len(rows), length), dtype=self._dtype)
        fds: dict[int, int] = {}
        try:
            for r, start in enumerate(rows):
                self._read(fds, out[r], start)
        finally:
            for fd in fds.values():
                os.close(fd)
        return torch.from_numpy(out.astype(np.int64))

    def window(self, start: int, length: int) -> torch.Tensor:
        """Int64 tensor of the `length` tokens from `start`, across shard boundaries."""
        return self.gather([start], length)[0]


@dataclass(frozen=True, eq=False)
class TokenRange:
    """A contiguous part of a store (its train or validation split), indexed from 0."""

    store: TokenStore
    start: int
    length: int

    def numel(self) -> int:
        return self.length

    def gather(self, starts: torch.Tensor, length: int) -> torch.Tensor:
        """Windows of this range: [len(starts), length] int64, `starts` relative to the range."""
        if starts.numel() and int(starts.max()) + length > self.length:
            raise ValueError(f"a window of {length} tokens from {int(starts.max())} runs past this range's "
                             f"{self.length} tokens")
        return self.store.gather(starts + self.start, length)
