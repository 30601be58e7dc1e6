"""`prepare`: a text source (`peer/data/sources.py`) tokenized into shards on disk, plus the
`manifest.json` a run spec can pin (`peer/data/manifest.py`); `peer/data/token_store.py` reads them.

A shard is raw little-endian uint16 (vocabulary <= 65,536) or uint32 holding `shard_tokens` tokens
(the last one fewer). The tokens are the documents' encodings, one after another, separated by the
tokenizer's end-of-text id, or by a newline for a tokenizer without one (bytes: the same tokens as
`load_corpus` reads from one file).

- Memory stays bounded: documents are streamed in pieces and encoded a batch of pieces at a time;
  tokens go straight to the shard's file.
- Nothing half-written looks complete: a shard is written under a temporary name and renamed when
  full; `manifest.json`, the only mark of a finished folder, is written last, the same way.
- The folder is all a head needs: a BPE tokenizer's file is copied into it (`tokenizer.json`, outside
  the manifest's hash; the run spec pins its sha256: peer/data/run_tokenizer.py), also by a re-run on a
  folder finished before the copy was kept.
- Resumable: after each finished shard `progress.json` records the shards so far and where in the
  source the next one starts (file, piece, tokens of that piece already stored). A re-run with the
  same arguments continues from there and never rewrites a finished shard; one with other
  arguments (or a changed source file) is refused.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .corpus import DataError
from .manifest import DTYPES, FORMAT_VERSION, MANIFEST_NAME, TOKENIZER_NAME, Manifest, ShardRecord, dtype_for
from .sources import Piece, iter_pieces, source_files
from .tokenizer import Tokenizer, atomic_write_bytes, load_tokenizer

__all__ = ["DEFAULT_SHARD_TOKENS", "PROGRESS_NAME", "default_val_tokens", "prepare"]

DEFAULT_SHARD_TOKENS = 64 << 20
PROGRESS_NAME = "progress.json"
# Validation: 5% of the tokens, at most 2**20 (plenty for a held-out loss, little taken from training).
VAL_FRACTION = 0.05
MAX_DEFAULT_VAL_TOKENS = 1 << 20
# A batch of pieces is encoded together (tokenizers encodes a batch on several threads). Its encodings
# cost ~100 bytes a token until they are written, so a batch of 1M characters stays near 100 MB.
BATCH_CHARS = 1 << 20
BATCH_PIECES = 4096


def default_val_tokens(total: int) -> int:
    return min(math.ceil(total * VAL_FRACTION), MAX_DEFAULT_VAL_TOKENS)


@dataclass
class _Position:
    """Where the next shard starts: file index, key of a piece in it, tokens of that piece (separator
    included) already stored, documents begun before that piece."""

    file: int = 0
    key: int = 0
    skip: int = 0
    documents: int = 0


class _ShardWriter:
    """One shard being written: tokens appended to `NAME.tmp`, hashed as they go, renamed when done."""

    def __init__(self, folder: Path, index: int, dtype: np.dtype) -> None:
        self.name = f"shard_{index:05d}.bin"
        self.final, self.tmp = folder / self.name, folder / f"{self.name}.tmp"
        self.dtype, self.tokens, self.digest = dtype, 0, hashlib.sha256()
        self.file = open(self.tmp, "wb")

    def write(self, ids: np.ndarray) -> None:
        data = ids.astype(self.dtype, copy=False).tobytes()
        self.file.write(data)
        self.digest.update(data)
        self.tokens += int(ids.size)

    def finish(self) -> ShardRecord:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.final)
        return ShardRecord(self.name, self.tokens, self.digest.hexdigest())

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)


def _batches(pieces: Iterator[Piece]) -> Iterator[list[Piece]]:
    batch: list[Piece] = []
    chars = 0
    for piece in pieces:
        batch.append(piece)
        chars += len(piece.text)
        if chars >= BATCH_CHARS or len(batch) >= BATCH_PIECES:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _piece_ids(files: list[Path], position: _Position, tok: Tokenizer, separator: np.ndarray
               ) -> Iterator[tuple[_Position, np.ndarray, int]]:
    """Each piece's token ids from `position` on, separator included, with where the piece starts
    and how many documents have begun once it is stored."""
    documents = position.documents
    for index in range(position.file, len(files)):
        start = position.key if index == position.file else 0
        for batch in _batches(iter_pieces(files[index], start)):
            for piece, ids in zip(batch, tok.encode_batch([p.text for p in batch])):
                at = _Position(index, piece.key, 0, documents)
                if piece.starts_document:
                    ids = np.concatenate([separator, ids]) if documents else ids
                    documents += 1
                yield at, ids, documents


def _arguments(src: Path, files: list[Path], tok: Tokenizer, shard_tokens: int, val_tokens: int | None) -> dict:
    """What a resumed preparation must share with the one it continues (source files by size and mtime)."""
    def stat(p: Path) -> dict:
        s = p.stat()
        name = p.relative_to(src).as_posix() if src.is_dir() else p.name
        return {"name": name, "size": s.st_size, "mtime_ns": s.st_mtime_ns}
    return {"version": FORMAT_VERSION, "tokenizer_sha256": tok.sha256, "shard_tokens": shard_tokens,
            "val_tokens": val_tokens, "source": [stat(p) for p in files]}


def _load_progress(out: Path, arguments: dict, itemsize: int) -> tuple[list[ShardRecord], _Position, bool]:
    """Shards already finished, where to go on, and whether the folder is complete."""
    path = out / PROGRESS_NAME
    if not path.exists():
        if any(out.iterdir()):
            raise DataError(f"output folder {str(out)!r} is not empty and holds no preparation to resume; choose "
                            f"an empty or new folder.")
        return [], _Position(), False
    try:
        record = json.loads(path.read_bytes())
        shards = [ShardRecord(**s) for s in record["shards"]]
        position = _Position(**record["position"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"cannot read {str(path)!r} ({exc}); remove the folder and prepare again.") from exc
    if record.get("arguments") != arguments:
        raise DataError(f"{str(out)!r} holds a preparation with other arguments or an older copy of the source; "
                        f"prepare into another folder, or remove this one to start over.")
    for shard in shards:  # sizes only: hashes are checked when the folder is read (token_store.py)
        size = (out / shard.name).stat().st_size if (out / shard.name).exists() else -1
        if size != shard.tokens * itemsize:
            raise DataError(f"finished shard {str(out / shard.name)!r} is missing or has the wrong size; remove "
                            f"{str(out)!r} and prepare again.")
    return shards, position, bool(record.get("done")) and (out / MANIFEST_NAME).exists()


def _save_progress(out: Path, arguments: dict, shards: list[ShardRecord], position: _Position,
                   done: bool = False) -> None:
    record = {"arguments": arguments, "shards": [s.__dict__ for s in shards],
              "position": position.__dict__, "done": done}
    atomic_write_bytes(out / PROGRESS_NAME, json.dumps(record, indent=1).encode())


def _keep_tokenizer(tok: Tokenizer, out: Path) -> None:
    """A copy of a BPE tokenizer's file in the folder, so that the folder is all a head needs (the run
    spec pins its hash; peer/data/run_tokenizer.py). Bytes need no file."""
    data = getattr(tok, "data", None)
    if data is not None and not (out / TOKENIZER_NAME).exists():
        atomic_write_bytes(out / TOKENIZER_NAME, data)


def prepare(src: str | os.PathLike[str], tokenizer: Tokenizer | str, out_dir: str | os.PathLike[str], *,
            shard_tokens: int = DEFAULT_SHARD_TOKENS, val_tokens: int | None = None, progress: bool = True,
            on_shard: Callable[[int], None] | None = None) -> Manifest:
    """Tokenize `src` into shards in `out_dir` and write its manifest; return the manifest.

    `val_tokens`: how many tokens at the end are validation (default `default_val_tokens`).
    `on_shard(n)` is called after each finished shard with the number finished so far. A folder
    already complete for the same arguments is returned as it is.
    """
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise DataError(f"shard_tokens must be a positive number of tokens, got {shard_tokens!r}.")
    if val_tokens is not None and (isinstance(val_tokens, bool) or not isinstance(val_tokens, int) or val_tokens < 0):
        raise DataError(f"val_tokens must be a number of tokens >= 0, got {val_tokens!r}.")
    src, out = Path(src), Path(out_dir)
    files = source_files(src)
    arguments = _arguments(src, files, tok, shard_tokens, val_tokens)
    dtype = dtype_for(tok.vocab_size)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create output folder {str(out)!r}: {exc.strerror or exc}.") from exc
    shards, position, done = _load_progress(out, arguments, DTYPES[dtype].itemsize)
    if done:
        _keep_tokenizer(tok, out)  # a folder prepared before the copy was kept gets it now
        return Manifest.read(out / MANIFEST_NAME)
    for leftover in out.glob("*.tmp"):  # an interrupted run's unfinished shard: never part of the result
        leftover.unlink()
    separator = (np.array([tok.eos_id], dtype=np.int64) if tok.eos_id is not None
                 else tok.encode_batch(["\n"])[0].astype(np.int64))
    writer = _ShardWriter(out, len(shards), DTYPES[dtype])
    bar = tqdm(desc=f"tokenizing {src.name}", unit="tok", unit_scale=True, disable=not progress,
               initial=sum(s.tokens for s in shards))
    documents, skip = position.documents, position.skip  # the first piece's tokens already stored
    try:
        for at, ids, begun in _piece_ids(files, position, tok, separator):
            stored, skip, documents = skip, 0, begun
            while stored < ids.size:
                take = min(ids.size - stored, shard_tokens - writer.tokens)
                writer.write(ids[stored:stored + take])
                stored += take
                bar.update(take)
                if writer.tokens == shard_tokens:
                    shards.append(writer.finish())
                    _save_progress(out, arguments, shards, dataclasses.replace(at, skip=stored))
                    writer = _ShardWriter(out, len(shards), DTYPES[dtype])
                    if on_shard is not None:
                        on_shard(len(shards))
        if writer.tokens:
            shards.append(writer.finish())
        else:
            writer.abort()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    total = sum(s.tokens for s in shards)
    if total == 0:
        raise DataError(f"data source {str(src)!r} holds no text (every document is empty).")
    val = default_val_tokens(total) if val_tokens is None else val_tokens
    if val >= total:
        raise DataError(f"val_tokens ({val}) must be less than the {total} tokens of {str(src)!r}.")
    manifest = Manifest(tok.sha256, tok.vocab_size, tok.eos_id, dtype, tuple(shards), val, documents)
    _save_progress(out, arguments, shards, _Position(len(files), 0, 0, documents), done=True)
    _keep_tokenizer(tok, out)
    atomic_write_bytes(out / MANIFEST_NAME, manifest.to_bytes())  # last: the mark of a finished folder
    return manifest
