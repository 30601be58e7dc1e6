"""Which text a run trains on, written into its run spec so that heads and `swarm eval` agree.

`swarm coordinator --data PATH` (and `swarm local --data PATH`) records the corpus in the
spec's `extra["data"]`: `{"path": absolute path (or "stdlib"), "sha256": sha256 of the
corpus bytes as `peer.data.corpus.load_corpus` builds them, "tokens": their count}`. The path only
means something on the machine that recorded it; the hash says whether another copy is the
same text. A spec without the entry trained on the embedded corpus (or on whatever its heads
were given: runs older than this record).

- a head (`swarm peer`) without `--data` reads the recorded path; with `--data` or without,
  it refuses a corpus whose hash is not the recorded one (two heads on different text would
  not be one run);
- `swarm eval` scores the recorded corpus, `--data` overriding; a recorded path absent on
  this machine is one sentence that says to pass `--data`.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

import torch

from protocol.spec import RunSpec

from .batches import BatchSource
from .corpus import EMBEDDED_CORPUS_NAME, STDLIB_CORPUS_NAME, Corpus, DataError, load_corpus

KEY = "data"


def corpus_sha256(corpus: Corpus) -> str:
    return hashlib.sha256(corpus.tokens.cpu().numpy().tobytes()).hexdigest()


def _where(path: str) -> str:
    return path if path == STDLIB_CORPUS_NAME and not os.path.exists(path) else os.path.abspath(path)


def with_corpus(spec: RunSpec, path: str | None) -> RunSpec:
    """`spec` with the corpus at `path` recorded (unchanged for None: the embedded corpus)."""
    if not path:
        return spec
    corpus = load_corpus(path, seq_len=spec.seq_len)  # DataError (one sentence) if it is missing or too short
    record = {"path": _where(path), "sha256": corpus_sha256(corpus), "tokens": len(corpus)}
    return spec.replace(extra={**spec.extra, KEY: record})


def recorded(spec: RunSpec) -> dict | None:
    record = spec.extra.get(KEY)
    return record if isinstance(record, dict) and isinstance(record.get("path"), str) else None


def describe_record(record: dict) -> str:
    return f"{record['path']} (sha256 {str(record.get('sha256', ''))[:12]})"


def run_corpus(spec: RunSpec, data: str | None, what: str = "--data", seq_len: int | None = None
               ) -> tuple[Corpus, str]:
    """The corpus to read for `spec` and where it came from: `data` if given, else the recorded
    one, else the embedded corpus. Raises DataError (one sentence) if the recorded path is not on
    this machine. The hash is not checked here (see `check_corpus`)."""
    record, seq_len = recorded(spec), seq_len or spec.seq_len
    if data:
        return load_corpus(data, seq_len=seq_len), what
    if record is None:
        return load_corpus(None, seq_len=seq_len), "the embedded corpus (the run recorded no other)"
    path = record["path"]
    if not os.path.exists(path) and path != STDLIB_CORPUS_NAME:
        raise DataError(f"this run trained on {describe_record(record)}, which is not on this machine; pass "
                        f"{what} PATH with a copy of that text.")
    return load_corpus(path, seq_len=seq_len), "the corpus this run trained on"


def check_corpus(spec: RunSpec, corpus: Corpus, what: str = "--data") -> None:
    """DataError unless `corpus` is the text the spec records (any text if it records none)."""
    record = recorded(spec)
    if record is None or corpus_sha256(corpus) == record.get("sha256"):
        return
    name = "the embedded corpus" if corpus.name == EMBEDDED_CORPUS_NAME else corpus.name
    raise DataError(f"{name} is not the text this run trains on, {describe_record(record)}: its sha256 differs; "
                    f"pass {what} PATH with a copy of that text.")


def run_batches(spec: RunSpec, data: str | None = None) -> Callable[[int, int], torch.Tensor]:
    """(step, microbatch index) -> that microbatch's token ids, from the run's corpus (`run_corpus`), as
    every head regenerates them (peer/data/batches.py)."""
    corpus, _ = run_corpus(spec, data)
    return BatchSource(corpus, spec.seq_len, spec.microbatch_size, spec.data_seed).microbatch
