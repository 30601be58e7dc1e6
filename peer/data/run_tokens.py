"""Which prepared token folder a run trains on, written into its run spec so that heads, the
coordinator's data check and `swarm eval` read the same tokens with the same tokenizer.

`swarm coordinator --tokens DIR` (and `swarm local --tokens DIR`) records a folder made by
`swarm data prepare` in the spec's `extra["tokens"]`: `{"path": absolute path, "manifest_sha256",
"tokenizer_sha256", "vocab": the tokenizer's vocabulary size, "tokens": training tokens}`, and sets
the spec's `vocab` to that vocabulary (the embedding and output layer are that wide). The manifest
hash names the exact tokens (`peer/data/manifest.py`), so a copy of the folder on another machine
is the same data if and only if its manifest hash is the recorded one; the path only means
something on the machine that recorded it.

- a head (`swarm peer`) without `--tokens` reads the recorded path; with it or without, it refuses a
  folder whose manifest or tokenizer hash is not the recorded one (two heads on different tokens
  would not be one run);
- `swarm eval` scores the recorded folder's validation split, `--tokens` overriding (any folder
  prepared with the run's tokenizer);
- a run records either a `--data` corpus (`peer/data/run_corpus.py`) or a token folder, never both.
"""
from __future__ import annotations

import os
from collections.abc import Callable

import torch

from protocol.spec import RunSpec

from .batches import BatchSource
from .corpus import DataError
from .manifest import MANIFEST_NAME, Manifest
from .run_corpus import recorded
from .token_store import TokenStore
from .tokenizer import BYTE_VOCAB_SIZE, ByteTokenizer

KEY = "tokens"


def check_data_flags(data: str | None, tokens: str | None) -> None:
    """DataError (a usage error: exit 2) for --data together with --tokens."""
    if data and tokens:
        raise DataError("--data and --tokens both name what the run trains on; pass one of them (--tokens DIR for "
                        "a folder made by `swarm data prepare`).")


def with_tokens(spec: RunSpec, folder: str | None) -> RunSpec:
    """`spec` with the prepared folder `folder` recorded and `vocab` set to its tokenizer's vocabulary
    (unchanged for None). The folder is read and every shard's hash checked before anything is recorded."""
    if not folder:
        return spec
    if recorded(spec) is not None:
        raise DataError("this run spec already records a --data corpus; a run trains on either --data or "
                        "--tokens, so drop one of them.")
    store = TokenStore(folder)  # DataError (one sentence) for a missing, unfinished or corrupt folder
    window = spec.seq_len + 1
    if store.train_tokens < window or store.val_tokens < window:
        raise DataError(f"token folder {folder!r} holds {store.train_tokens} training and {store.val_tokens} "
                        f"validation tokens, and each needs at least seq_len + 1 = {window}; prepare it from more "
                        f"text (or with a larger --val-tokens).")
    m = store.manifest
    if spec.vocab not in (BYTE_VOCAB_SIZE, m.vocab_size):  # a --vocab (or small-bpe) the tokenizer contradicts
        raise DataError(f"the run spec asks for a vocabulary of {spec.vocab}, but token folder {folder!r} was "
                        f"prepared with a tokenizer of {m.vocab_size}; drop --vocab (a run on a token folder takes its "
                        f"tokenizer's) or use a preset of vocabulary 256 or {m.vocab_size}.")
    record = {"path": os.path.abspath(folder), "manifest_sha256": m.manifest_sha256,
              "tokenizer_sha256": m.tokenizer_sha256, "vocab": m.vocab_size, "tokens": store.train_tokens}
    return spec.replace(vocab=m.vocab_size, extra={**spec.extra, KEY: record})


def recorded_tokens(spec: RunSpec) -> dict | None:
    record = spec.extra.get(KEY)
    return record if isinstance(record, dict) and isinstance(record.get("path"), str) else None


def describe_tokens(record: dict) -> str:
    return f"{record['path']} (manifest_sha256 {str(record.get('manifest_sha256', ''))[:12]})"


def run_token_store(spec: RunSpec, folder: str | None, same_tokens: bool = True) -> TokenStore | None:
    """The token store a head (or `swarm eval`) reads for `spec`: `folder` if given, else the recorded
    one; None if the spec records no folder and none is given. Its tokenizer must be the run's, and
    with `same_tokens` (a head) its manifest the recorded one; else one-sentence DataError."""
    record = recorded_tokens(spec)
    if record is None:
        if not folder:
            return None
        if same_tokens:  # a head on tokens the spec does not pin would train another run's data
            raise DataError("this run records no token folder (its coordinator was started without --tokens); "
                            "start this peer without --tokens.")
        if Manifest.read(os.path.join(folder, MANIFEST_NAME)).tokenizer_sha256 != ByteTokenizer.sha256:
            raise DataError(f"this run trained on bytes, but token folder {folder!r} was prepared with another "
                            f"tokenizer; prepare it with `swarm data prepare` without --tokenizer.")
        return TokenStore(folder)
    path = folder or record["path"]
    if not folder and not os.path.exists(path):
        raise DataError(f"this run trains on the token folder {describe_tokens(record)}, which is not on this "
                        f"machine; pass --tokens DIR with a copy of the run's prepared folder.")
    manifest = Manifest.read(os.path.join(path, MANIFEST_NAME))
    if manifest.tokenizer_sha256 != record.get("tokenizer_sha256"):
        want = str(record.get("tokenizer_sha256"))[:12]
        raise DataError(f"token folder {path!r} was prepared with the tokenizer of sha256 "
                        f"{manifest.tokenizer_sha256[:12]}, not this run's ({want}); pass --tokens DIR with a copy "
                        f"of the run's prepared folder.")
    if same_tokens and manifest.manifest_sha256 != record.get("manifest_sha256"):
        raise DataError(f"token folder {path!r} holds other tokens than this run's, {describe_tokens(record)}: its "
                        f"manifest_sha256 differs; pass --tokens DIR with a copy of the run's prepared folder.")
    return TokenStore(path, manifest_sha256=record["manifest_sha256"] if same_tokens else None)


def token_batches(spec: RunSpec, folder: str | None = None) -> Callable[[int, int], torch.Tensor] | None:
    """(step, microbatch index) -> that microbatch's token ids from the run's token folder, as every
    head draws them; None if the spec records no folder (the run reads a corpus: `run_corpus.run_batches`)."""
    store = run_token_store(spec, folder)
    if store is None:
        return None
    return BatchSource(store, spec.seq_len, spec.microbatch_size, spec.data_seed).microbatch
