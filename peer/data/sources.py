"""Text sources for tokenizing: a text file, a folder, jsonl with a `text` field, parquet with a
`text` column (local files only), read as a stream of pieces so memory stays bounded however large
the source.

A *document* is a whole text file (.txt, .md, or any other file that is not .jsonl/.parquet), one
jsonl line or one parquet row; empty documents are skipped. A folder contributes its .txt, .md,
.jsonl and .parquet files, hidden folders skipped, in sorted order of their relative paths, so the
stream is the same on every machine. A large text file is cut into pieces of at most `PIECE_BYTES`
at the start of a line that begins with a printable ASCII character: with the byte-level
pre-tokenizer that `train_bpe` uses such a point always starts a new pre-token, so the pieces
encode to exactly the tokens of the whole file (a line longer than a piece is cut at a character
boundary, where a BPE token may differ).

Every piece says where it starts (`key`: a byte offset in a text or jsonl file, a row in a parquet
file), so `peer/data/shards.py` can resume in the middle of a file.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .corpus import DataError

__all__ = ["PIECE_BYTES", "SOURCE_SUFFIXES", "Piece", "iter_pieces", "iter_texts", "source_files"]

SOURCE_SUFFIXES = (".txt", ".md", ".jsonl", ".parquet")
PIECE_BYTES = 256 << 10
TEXT_FIELD = "text"
PARQUET_BATCH_ROWS = 1024


@dataclass(frozen=True)
class Piece:
    text: str
    starts_document: bool
    key: int  # where the piece starts in its file: byte offset (text, jsonl) or row (parquet)


def source_files(src: str | os.PathLike[str]) -> list[Path]:
    """The files of a source, in stream order (DataError if it is missing or holds none)."""
    root = Path(src)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise DataError(f"data source {str(src)!r} does not exist (a text, jsonl or parquet file, or a folder "
                        f"of them, on this machine).")
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found += [Path(dirpath) / n for n in filenames if Path(n).suffix.lower() in SOURCE_SUFFIXES]
    if not found:
        raise DataError(f"data folder {str(src)!r} holds no {'/'.join(SOURCE_SUFFIXES)} files.")
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def iter_pieces(path: Path, start: int = 0, piece_bytes: int | None = None) -> Iterator[Piece]:
    """The non-empty pieces of one file from `start` (a key an earlier piece of it gave); a text
    file's pieces hold at most `piece_bytes` (default `PIECE_BYTES`, read when called)."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _jsonl_pieces(path, start)
    if suffix == ".parquet":
        return _parquet_pieces(path, start)
    return _text_pieces(path, start, piece_bytes or PIECE_BYTES)


def iter_texts(paths: Sequence[Path]) -> Iterator[str]:
    """Every piece's text of `paths` in order (what a tokenizer is trained on); DataError if none."""
    any_text = False
    for path in paths:
        for piece in iter_pieces(path):
            any_text = True
            yield piece.text
    if not any_text:
        raise DataError(f"the data ({', '.join(map(str, paths[:3]))}{', ...' if len(paths) > 3 else ''}) "
                        f"holds no text.")


def _open(path: Path):
    try:
        return open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot read data file {str(path)!r}: {exc.strerror or exc}.") from exc


def _cut(buf: bytes) -> int:
    """Where to end a full piece: after the last newline followed by printable ASCII, else at the
    last character boundary (never 0: a piece always makes progress)."""
    j = buf.rfind(b"\n", 0, len(buf) - 1)
    while j >= 0:
        if 0x21 <= buf[j + 1] <= 0x7E:
            return j + 1
        j = buf.rfind(b"\n", 0, j)
    # No such line start: cut before the last character (it may be incomplete), found by stepping
    # back over UTF-8 continuation bytes; a buffer of nothing else is left to fail decoding.
    p = len(buf) - 1
    while p > 0 and (buf[p] & 0xC0) == 0x80:
        p -= 1
    return p if p > 0 else len(buf)


def _text_pieces(path: Path, start: int, piece_bytes: int) -> Iterator[Piece]:
    with _open(path) as f:
        f.seek(start)
        offset = start
        while True:
            buf = f.read(piece_bytes)
            if not buf:
                return
            n = len(buf) if len(buf) < piece_bytes else _cut(buf)
            try:
                text = buf[:n].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"data file {str(path)!r} is not UTF-8 text (bad byte at offset "
                                f"{offset + exc.start}).") from exc
            yield Piece(text, offset == 0, offset)
            offset += n
            f.seek(offset)


def _line_number(path: Path, offset: int) -> int:
    """1-based number of the line starting at byte `offset` (only computed for an error message)."""
    count, done = 1, 0
    with open(path, "rb") as f:
        while done < offset:
            block = f.read(min(1 << 20, offset - done))
            if not block:
                break
            count += block.count(b"\n")
            done += len(block)
    return count


def _jsonl_pieces(path: Path, start: int) -> Iterator[Piece]:
    with _open(path) as f:
        f.seek(start)
        offset = start
        for line in f:
            here, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise DataError(f"line {_line_number(path, here)} of {str(path)!r} is not JSON; each line of a "
                                f".jsonl file must be an object with a {TEXT_FIELD!r} field.") from None
            if not isinstance(record, dict) or not isinstance(record.get(TEXT_FIELD), str):
                raise DataError(f"line {_line_number(path, here)} of {str(path)!r} has no {TEXT_FIELD!r} string "
                                f"field; each line of a .jsonl file must be an object with one.")
            if record[TEXT_FIELD]:
                yield Piece(record[TEXT_FIELD], True, here)


def _parquet_pieces(path: Path, start: int) -> Iterator[Piece]:
    import pyarrow as pa  # only here: a run without parquet files never imports pyarrow
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"data file {str(path)!r} is not a parquet file that pyarrow can read ({exc}).") from exc
    with pf:
        schema = pf.schema_arrow
        if TEXT_FIELD not in schema.names:
            raise DataError(f"parquet file {str(path)!r} has no {TEXT_FIELD!r} column (it has: "
                            f"{', '.join(schema.names) or 'none'}).")
        kind = schema.field(TEXT_FIELD).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
            raise DataError(f"the {TEXT_FIELD!r} column of parquet file {str(path)!r} holds {kind}, not strings.")
        row = 0
        for group in range(pf.num_row_groups):
            rows = pf.metadata.row_group(group).num_rows
            if row + rows <= start:  # whole row groups before the resume point are not read at all
                row += rows
                continue
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=[group], columns=[TEXT_FIELD]):
                for text in batch.column(0).to_pylist():
                    if row >= start and text:
                        yield Piece(text, True, row)
                    row += 1
