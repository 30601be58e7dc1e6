"""Tokenizers a run can train with: one small interface, the byte tokenizer and a BPE tokenizer
in the Hugging Face `tokenizers` format (a `tokenizer.json` file), and `train_bpe` to make one.

The interface (`Tokenizer`): `vocab_size`, `encode(text)` (1-D int64 tensor), `encode_batch(texts)`
(numpy arrays, what `peer/data/shards.py` writes), `decode(ids)`, `eos_id` (the end-of-text token
that separates documents, or None) and `sha256`, the hash a prepared token folder and a run spec
pin: for a BPE tokenizer the sha256 of its file's bytes, so `sha256sum tokenizer.json` says the
same; for bytes the hash of a fixed description of the encoding.

Training is deterministic: the same text and vocabulary size give the same file byte for byte.
Checked with tokenizers 0.23.3 (tests/peer/test_tokenizer.py): the trainer breaks count ties by
token id, its alphabet is sorted, and the result does not depend on TOKENIZERS_PARALLELISM or
RAYON_NUM_THREADS (1, 2, 8 and 16 threads gave the same bytes), so nothing needs pinning beyond
feeding the text in a fixed order (`peer/data/sources.py`: files sorted by path).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np
import torch

from .corpus import DataError, bytes_to_uint8

__all__ = ["BYTE_VOCAB_SIZE", "EOS_TOKEN", "BpeTokenizer", "ByteTokenizer", "Tokenizer", "load_tokenizer",
           "train_bpe"]

BYTE_VOCAB_SIZE = 256
BYTE_NAME = "byte"
# The end-of-text token train_bpe adds (GPT-2's spelling); a loaded file's is found among these.
EOS_TOKEN = "<|endoftext|>"
EOS_CANDIDATES = (EOS_TOKEN, "<|end_of_text|>", "</s>", "<eos>")
# Smallest BPE vocabulary: the 256 byte symbols plus the end-of-text token.
MIN_BPE_VOCAB = BYTE_VOCAB_SIZE + 1


class Tokenizer(Protocol):
    """What the data side needs of a tokenizer."""

    vocab_size: int
    eos_id: int | None
    sha256: str
    name: str

    def encode(self, text: str) -> torch.Tensor: ...

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]: ...

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str: ...


def _id_list(ids: torch.Tensor | Sequence[int]) -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.dim() > 1:
            raise ValueError(f"decode takes 1-D ids, got shape {tuple(ids.shape)}")
        return ids.reshape(-1).tolist()
    return list(ids)


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as token ids: vocabulary 256, nothing to download or train."""

    vocab_size: int = BYTE_VOCAB_SIZE
    eos_id: ClassVar[None] = None  # documents are separated by a newline, as load_corpus does
    name: ClassVar[str] = BYTE_NAME
    # Not a file: the hash of a description of the encoding, so that a manifest pins "bytes" too.
    sha256: ClassVar[str] = hashlib.sha256(b"subspace-swarm byte tokenizer: token id = UTF-8 byte value, "
                                           b"vocabulary 256").hexdigest()

    def __post_init__(self) -> None:
        if self.vocab_size != BYTE_VOCAB_SIZE:
            raise ValueError(f"a byte tokenizer has vocab_size {BYTE_VOCAB_SIZE}")

    def encode(self, text: str) -> torch.Tensor:
        """`text` as a 1-D int64 tensor of its UTF-8 bytes (int64: what nn.Embedding takes)."""
        return bytes_to_uint8(text.encode("utf-8")).long()

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """Token ids back to text; bytes that are not valid UTF-8 become U+FFFD.

        A model's samples can cut a multi-byte character in half, so decoding must not
        raise on them.
        """
        try:
            raw = bytes(_id_list(ids))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"byte token ids must be ints in [0, {BYTE_VOCAB_SIZE})") from exc
        return raw.decode("utf-8", errors="replace")


class BpeTokenizer:
    """A Hugging Face `tokenizer.json` (byte-level BPE or any model `tokenizers` reads)."""

    def __init__(self, path: str | os.PathLike[str], data: bytes | None = None) -> None:
        """The tokenizer in file `path`, or in `data` (its bytes, e.g. fetched from the swarm; `path` then
        only names it)."""
        from tokenizers import Tokenizer as HfTokenizer

        self.name = str(path)
        if data is None:
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                raise DataError(f"cannot read tokenizer file {self.name!r}: {exc.strerror or exc}.") from exc
        self.data = data
        try:
            tok = HfTokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception for JSON it cannot read
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DataError(f"{self.name!r} is not a tokenizer.json that the tokenizers library can read "
                            f"({reason}); pass a file written by `swarm tokenizer train` or 'byte'.") from exc
        self.sha256 = hashlib.sha256(data).hexdigest()
        # Text that happens to contain "<|endoftext|>" is encoded as text: only the separator that
        # peer/data/shards.py puts between documents may carry the end-of-text id.
        tok.encode_special_tokens = True
        self._tok = tok
        vocab = tok.get_vocab(with_added_tokens=True)
        if not vocab:
            raise DataError(f"tokenizer file {self.name!r} has an empty vocabulary; train one with "
                            f"`swarm tokenizer train`.")
        self.vocab_size = max(vocab.values()) + 1
        special = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        self.eos_id: int | None = next((special[c] for c in EOS_CANDIDATES if c in special), None)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor(self._tok.encode(text, add_special_tokens=False).ids, dtype=torch.long)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._tok.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.array(e.ids, dtype=np.int64) for e in encodings]

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        values = _id_list(ids)
        if any(not 0 <= v < self.vocab_size for v in values):
            raise ValueError(f"token ids must be ints in [0, {self.vocab_size})")
        return self._tok.decode(values, skip_special_tokens=False)


def load_tokenizer(spec: str | os.PathLike[str]) -> ByteTokenizer | BpeTokenizer:
    """'byte' for the byte tokenizer, else the path of a tokenizer.json (DataError, one sentence, if
    it is missing or not a tokenizer)."""
    if str(spec) == BYTE_NAME:
        return ByteTokenizer()
    if not Path(spec).is_file():
        raise DataError(f"tokenizer file {str(spec)!r} does not exist; pass 'byte' or a tokenizer.json "
                        f"written by `swarm tokenizer train`.")
    return BpeTokenizer(spec)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` so that no reader ever sees a half-written file: a temporary name in
    the same folder, fsync, then rename (atomic on POSIX)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def train_bpe(files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], vocab_size: int,
              out_path: str | os.PathLike[str], *, progress: bool = False) -> BpeTokenizer:
    """Train a byte-level BPE with `vocab_size` tokens (end-of-text included, id 0) on the text of
    `files` (text files, folders, jsonl, parquet: `peer/data/sources.py`), write it to `out_path`
    atomically and return it loaded. A corpus too small for that many merges gives fewer tokens."""
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from .sources import iter_texts, source_files

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < MIN_BPE_VOCAB:
        raise DataError(f"a byte-level BPE needs a vocabulary of at least {MIN_BPE_VOCAB} (256 bytes and the "
                        f"end-of-text token), got {vocab_size}.")
    sources = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    if not sources:
        raise DataError("train_bpe was given no files to train on.")
    paths = [p for src in sorted(map(str, sources)) for p in source_files(src)]
    tok = HfTokenizer(models.BPE())
    # No regex-free mode and no prefix space: the GPT-2 split, and text encodes the same wherever it starts.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(iter_texts(paths), trainer)
    out = Path(out_path)
    if out.parent and not out.parent.is_dir():
        raise DataError(f"cannot write the tokenizer to {str(out)!r}: folder {str(out.parent)!r} does not exist.")
    atomic_write_bytes(out, tok.to_str(pretty=True).encode("utf-8"))
    return BpeTokenizer(out)
