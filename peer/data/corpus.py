"""The corpus a head peer trains on: loading it (embedded, the standard library, a file or a
folder) and splitting it into training tokens and a held-out validation tail.

Loading is deterministic: the same path gives the same tokens on every machine (files in
sorted order, hidden folders skipped), which `peer/data/batches.py`'s microbatches rely on to be
regenerated anywhere from (seed, step, index). Byte-level corpora are kept as uint8.
"""

from __future__ import annotations

import math
import operator
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "CORPUS_SUFFIXES",
    "DEFAULT_SEQ_LEN",
    "EMBEDDED_CORPUS_NAME",
    "VAL_FRACTION",
    "VAL_MIN_SEQUENCES",
    "Corpus",
    "DataError",
    "load_corpus",
]

# File kinds picked up when --data names a directory: prose and code, never binaries.
CORPUS_SUFFIXES = (".txt", ".md", ".py")
EMBEDDED_CORPUS_NAME = "pydoc_data.topics"
# Separator between documents (topics, files) so one never runs into the next mid-line.
DOCUMENT_SEPARATOR = b"\n"
# Held-out tail of the corpus used for validation loss.
VAL_FRACTION = 0.05
# ...but never fewer windows than this, so that tiny corpora still get a real val set.
VAL_MIN_SEQUENCES = 4
# Sequence length assumed by `Corpus.train`/`Corpus.val` when none is given; a
# BatchSource re-splits with its own seq_len, so this only matters for the properties.
DEFAULT_SEQ_LEN = 256


class DataError(ValueError):
    """The corpus cannot be used: missing, empty, unreadable, or too short."""


def nonneg_int(name: str, value: object) -> int:
    """Return `value` as an int, refusing bools, floats and negatives.

    bool is an int subclass; accepting True as step 1 would hide caller bugs.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    result = operator.index(value)  # type: ignore[arg-type]
    if result < 0:
        raise ValueError(f"{name} must be >= 0, got {result}")
    return result


def positive_int(name: str, value: object) -> int:
    result = nonneg_int(name, value)
    if result < 1:
        raise ValueError(f"{name} must be >= 1, got {result}")
    return result


def bytes_to_uint8(data: bytes) -> torch.Tensor:
    """Bytes as a 1-D uint8 tensor (one byte per token: 8x smaller than int64)."""
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    # bytearray gives frombuffer a writable buffer (no warning); the tensor keeps it alive.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@dataclass(frozen=True, eq=False)  # eq=False: comparing tensors with == is not a bool
class Corpus:
    """A tokenized corpus and its train/validation split.

    `tokens` is 1-D; byte-level corpora are stored as uint8 (one byte per token) and
    widened to int64 only per microbatch. The validation split is the last
    `VAL_FRACTION` of the tokens, but at least `VAL_MIN_SEQUENCES` windows of
    `seq_len + 1`; `train` and `val` are views, not copies.
    """

    tokens: torch.Tensor
    name: str
    seq_len: int = DEFAULT_SEQ_LEN

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, torch.Tensor) or self.tokens.dim() != 1:
            raise DataError(f"corpus {self.name!r}: tokens must be a 1-D tensor")
        dtype = self.tokens.dtype
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise DataError(f"corpus {self.name!r}: tokens must be integers, got {dtype}")
        positive_int("seq_len", self.seq_len)
        self.split()  # fail at load time, not at the first batch, if it is too short

    def __len__(self) -> int:
        return int(self.tokens.numel())

    def val_size(self, seq_len: int | None = None) -> int:
        """How many tokens the validation tail holds for windows of `seq_len + 1`."""
        window = (self.seq_len if seq_len is None else positive_int("seq_len", seq_len)) + 1
        return max(math.ceil(len(self) * VAL_FRACTION), VAL_MIN_SEQUENCES * window)

    def split(self, seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(train, val) views for windows of `seq_len + 1` tokens (default: `self.seq_len`)."""
        seq_len = self.seq_len if seq_len is None else positive_int("seq_len", seq_len)
        window = seq_len + 1
        n_val = self.val_size(seq_len)
        n_train = len(self) - n_val
        if n_train < window:
            need = window + VAL_MIN_SEQUENCES * window
            raise DataError(
                f"corpus {self.name!r} has {len(self)} tokens, too short for seq_len {seq_len}: "
                f"it needs at least {need} (one training window plus {VAL_MIN_SEQUENCES} "
                f"validation windows of {window} tokens)"
            )
        return self.tokens[:n_train], self.tokens[n_train:]

    @property
    def train(self) -> torch.Tensor:
        return self.split()[0]

    @property
    def val(self) -> torch.Tensor:
        return self.split()[1]


def _embedded_corpus_bytes() -> bytes:
    try:
        from pydoc_data import topics  # stdlib; some distro builds strip it
    except ImportError as exc:
        raise DataError(
            "the embedded corpus pydoc_data.topics is missing from this Python; pass --data PATH"
        ) from exc
    # Sorted keys: dict order is an implementation detail, the corpus must not be.
    text = "\n".join(topics.topics[key] for key in sorted(topics.topics))
    return text.encode("utf-8")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read corpus file {str(path)!r}: {exc.strerror or exc}") from exc


STDLIB_CORPUS_NAME = "stdlib"
_STDLIB_SKIP = {"test", "tests", "site-packages", "dist-packages", "__pycache__", "idle_test"}


def _directory_files(root: Path, skip: set[str] = frozenset()) -> list[Path]:
    """Corpus files under `root`, in a fixed order (sorted relative POSIX paths).

    Hidden directories (.git, .venv, ...) are skipped: a project folder's virtualenv
    would otherwise swamp its own text with site-packages. Directory symlinks are not
    followed, so a link loop cannot hang the walk.
    """
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in skip]
        for filename in filenames:
            if Path(filename).suffix.lower() in CORPUS_SUFFIXES:
                found.append(Path(dirpath) / filename)
    # Sorting by the relative path string (not os.walk order) makes the corpus identical
    # on every machine and file system.
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def load_corpus(
    path: str | os.PathLike[str] | None = None, *, seq_len: int = DEFAULT_SEQ_LEN
) -> Corpus:
    """Load a byte-level corpus.

    `path` None means the embedded corpus (CPython's `pydoc_data.topics`); "stdlib" means
    the Python standard library's own sources, tests excluded (~13 MB on every machine with
    Python: a corpus for benchmarks of tens of millions of tokens, no download). A file is
    taken byte for byte; a directory contributes every `*.txt`, `*.md` and `*.py` file
    under it, recursively, in sorted order, separated by a newline. Raises `DataError`
    if the path is missing, holds nothing, cannot be read, or is too short for one
    training window plus the validation windows at `seq_len`.
    """
    seq_len = positive_int("seq_len", seq_len)
    if path is None:
        return Corpus(bytes_to_uint8(_embedded_corpus_bytes()), EMBEDDED_CORPUS_NAME, seq_len)

    p = Path(path)
    name = str(path)
    skip: set[str] = set()
    if name == STDLIB_CORPUS_NAME and not p.exists():
        p, skip = Path(sysconfig.get_paths()["stdlib"]), _STDLIB_SKIP
    if p.is_dir():
        files = _directory_files(p, skip)
        if not files:
            kinds = "/".join(CORPUS_SUFFIXES)
            raise DataError(f"corpus directory {name!r} contains no {kinds} files")
        data = DOCUMENT_SEPARATOR.join(b for b in (_read_bytes(f) for f in files) if b)
    elif p.exists():
        data = _read_bytes(p)
    else:
        raise DataError(f"corpus path {name!r} does not exist")
    if not data:
        raise DataError(f"corpus {name!r} is empty")
    return Corpus(bytes_to_uint8(data), name, seq_len)
