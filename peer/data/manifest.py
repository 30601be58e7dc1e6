"""`manifest.json`, the record of a prepared token folder (`peer/data/shards.py` writes it, last;
`peer/data/token_store.py` reads it): which tokenizer made the tokens, how they are stored, each
shard's name, token count and sha256, the validation split, and the manifest's own hash.

`manifest_sha256` is the sha256 of the manifest's other fields as canonical JSON (sorted keys, no
spaces); through the shard hashes it names the tokens themselves, so a run spec that pins it pins
the exact data. It holds nothing about where the source text was, so two machines that prepare the
same text with the same tokenizer and arguments get the same hash.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .corpus import DataError

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST_NAME", "Manifest", "TOKENIZER_NAME", "ShardRecord", "dtype_for",
           "sha256_file"]

FORMAT = "subspace-swarm token shards"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# A copy of the tokenizer file (BPE), kept beside the manifest and outside its hash (peer/data/run_tokenizer.py)
TOKENIZER_NAME = "tokenizer.json"
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def dtype_for(vocab_size: int) -> str:
    """The smallest stored type that holds every id: uint16 up to 65,536 tokens, else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def sha256_file(path: str | os.PathLike[str], chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def canonical_sha256(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ShardRecord:
    name: str
    tokens: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """A prepared folder: tokens are the shards' concatenation; the last `val_tokens` are validation."""

    tokenizer_sha256: str
    vocab_size: int
    eos_id: int | None
    dtype: str
    shards: tuple[ShardRecord, ...]
    val_tokens: int
    documents: int
    version: int = FORMAT_VERSION

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def train_tokens(self) -> int:
        return self.total_tokens - self.val_tokens

    @property
    def numpy_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    def body(self) -> dict:
        return {"format": FORMAT, "version": self.version,
                "tokenizer": {"sha256": self.tokenizer_sha256, "vocab_size": self.vocab_size, "eos_id": self.eos_id},
                "dtype": self.dtype, "byte_order": "little", "total_tokens": self.total_tokens,
                "documents": self.documents,
                "validation": {"tokens": self.val_tokens, "rule": "the last `tokens` tokens of the concatenation"},
                "shards": [asdict(s) for s in self.shards]}

    @property
    def manifest_sha256(self) -> str:
        return canonical_sha256(self.body())

    def to_bytes(self) -> bytes:
        return (json.dumps({**self.body(), "manifest_sha256": self.manifest_sha256}, indent=1) + "\n").encode()

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Manifest:
        """The manifest at `path` (DataError, one sentence naming it, if it is missing, unreadable,
        of another format or edited since it was written)."""
        name = str(path)
        try:
            raw = json.loads(Path(path).read_bytes())
        except FileNotFoundError:
            raise DataError(f"{name!r} does not exist: the folder is not a prepared token folder, or its "
                            f"preparation has not finished; run `swarm data prepare`.") from None
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read token manifest {name!r} ({exc}); prepare the folder again.") from exc
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise DataError(f"{name!r} is not a token manifest written by `swarm data prepare`.")
        if raw.get("version") != FORMAT_VERSION:
            raise DataError(f"token manifest {name!r} has format version {raw.get('version')}, this program reads "
                            f"version {FORMAT_VERSION}; prepare the folder again with this version.")
        try:
            tok, val = raw["tokenizer"], raw["validation"]
            shards = tuple(ShardRecord(str(s["name"]), int(s["tokens"]), str(s["sha256"])) for s in raw["shards"])
            manifest = cls(str(tok["sha256"]), int(tok["vocab_size"]), tok["eos_id"], str(raw["dtype"]), shards,
                           int(val["tokens"]), int(raw["documents"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"token manifest {name!r} lacks or mangles a field ({exc}); prepare the folder "
                            f"again.") from exc
        if manifest.dtype not in DTYPES or any(os.path.basename(s.name) != s.name for s in shards):
            raise DataError(f"token manifest {name!r} names an unknown dtype or a shard outside its folder.")
        if raw.get("manifest_sha256") != manifest.manifest_sha256:
            raise DataError(f"token manifest {name!r} was edited after it was written (its manifest_sha256 does "
                            f"not match its content); prepare the folder again.")
        return manifest
