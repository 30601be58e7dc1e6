"""Tests for peer/data/shards.py and sources.py: a text, jsonl or parquet source prepared into token
shards gives the tokens of encoding it directly; an interrupted preparation resumes to the same bytes;
bad input is one sentence naming the file and leaves no manifest. Reading: tests/peer/test_token_store.py."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from peer.data import sources
from peer.data.corpus import DataError, load_corpus
from peer.data.manifest import MANIFEST_NAME, TOKENIZER_NAME, Manifest
from peer.data.shards import PROGRESS_NAME, prepare
from peer.data.token_store import TokenStore
from peer.data.tokenizer import ByteTokenizer, train_bpe
from tests.peer.test_tokenizer import corpus_text

DOCS = [corpus_text(s, 15) for s in range(40)] + ["  leading spaces\n\n\n and runs   of\twhite space ✓\r\n"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    (root / "a.txt").write_text("".join(DOCS), encoding="utf-8")
    return train_bpe(root, 400, root / "tokenizer.json")


def expected(tok, docs: list[str]) -> np.ndarray:
    """What prepare must store: each document's encoding, separated by end-of-text."""
    parts = []
    for i, doc in enumerate(docs):
        if i:
            parts.append(np.array([tok.eos_id]))
        parts.append(tok.encode(doc).numpy())
    return np.concatenate(parts)


def stored(folder) -> np.ndarray:
    m = Manifest.read(folder / MANIFEST_NAME)
    return np.concatenate([np.fromfile(folder / s.name, dtype=m.numpy_dtype) for s in m.shards]).astype(np.int64)


def folder_bytes(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != "verified.json"}


def write_parquet(path, docs, column="text", row_group_size=7) -> None:
    pq.write_table(pa.table({column: docs, "id": list(range(len(docs)))}), path, row_group_size=row_group_size)


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_prepare_stores_the_tokens_of_encoding_directly(tok, tmp_path, kind):
    src = tmp_path / "src"
    src.mkdir()
    if kind == "txt":  # a folder of text files: one document each, in sorted order
        for i, doc in enumerate(DOCS):
            (src / f"{i:03d}.{'md' if i % 2 else 'txt'}").write_text(doc, encoding="utf-8")
    elif kind == "jsonl":
        (src / "docs.jsonl").write_text("".join(json.dumps({"text": d, "n": 1}) + "\n\n" for d in DOCS))
    else:
        write_parquet(src / "part-0.parquet", DOCS[:20] + [None, ""])  # null and empty rows are skipped
        write_parquet(src / "part-1.parquet", DOCS[20:])
    m = prepare(src, tok, tmp_path / "out", shard_tokens=300, val_tokens=100, progress=False)
    want = expected(tok, DOCS)
    assert np.array_equal(stored(tmp_path / "out"), want)
    assert m.total_tokens == want.size and m.documents == len(DOCS) and m.val_tokens == 100
    assert m.dtype == "uint16" and m.tokenizer_sha256 == tok.sha256 and m.vocab_size == tok.vocab_size
    assert [s.tokens for s in m.shards[:-1]] == [300] * (len(m.shards) - 1) and 0 < m.shards[-1].tokens <= 300
    assert Manifest.read(tmp_path / "out" / MANIFEST_NAME) == m
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_a_large_text_file_is_read_in_pieces_that_encode_like_the_whole(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "PIECE_BYTES", 256)
    text = "".join(DOCS) + "x" * 700 + "\n" + "é" * 300  # a line longer than a piece is cut at a character
    (tmp_path / "big.txt").write_text(text, encoding="utf-8")
    pieces = list(sources.iter_pieces(tmp_path / "big.txt"))
    assert len(pieces) > 20 and "".join(p.text for p in pieces) == text
    assert [p.starts_document for p in pieces] == [True] + [False] * (len(pieces) - 1)
    exact = "".join(DOCS)
    (tmp_path / "exact.txt").write_text(exact, encoding="utf-8")  # cut only at line starts: exact tokens
    prepare(tmp_path / "exact.txt", tok, tmp_path / "out", shard_tokens=500, progress=False)
    assert np.array_equal(stored(tmp_path / "out"), tok.encode(exact).numpy())


def test_bytes_of_one_file_are_the_corpus_load_corpus_reads(tmp_path):
    (tmp_path / "src").mkdir()
    for name, doc in [("a.txt", DOCS[0]), ("b.md", DOCS[1]), ("c.txt", "")]:
        (tmp_path / "src" / name).write_text(doc, encoding="utf-8")
    m = prepare(tmp_path / "src", "byte", tmp_path / "out", shard_tokens=333, progress=False)
    corpus = load_corpus(tmp_path / "src", seq_len=8)  # documents joined by a newline, empty ones skipped
    assert np.array_equal(stored(tmp_path / "out"), corpus.tokens.numpy())
    assert m.tokenizer_sha256 == ByteTokenizer.sha256 and m.eos_id is None and m.documents == 2


class FakeWideTokenizer:
    """A 70,000-token vocabulary (ids stored as uint32), without training one."""

    vocab_size, eos_id, name, sha256 = 70_000, 69_999, "wide", "f" * 64

    def encode_batch(self, texts):
        return [np.frombuffer(t.encode(), dtype=np.uint8).astype(np.int64) + 65_600 for t in texts]


def test_a_vocabulary_over_65536_is_stored_as_uint32(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "ab"}\n{"text": "c"}\n')
    m = prepare(tmp_path / "a.jsonl", FakeWideTokenizer(), tmp_path / "out", val_tokens=1, progress=False)
    assert m.dtype == "uint32" and (tmp_path / "out" / "shard_00000.bin").stat().st_size == 4 * 4
    assert stored(tmp_path / "out").tolist() == [65_600 + 97, 65_600 + 98, 69_999, 65_600 + 99]
    assert TokenStore(tmp_path / "out").window(0, 4).tolist() == stored(tmp_path / "out").tolist()


class Interrupted(Exception):
    pass


def stop_after(k: int):
    def on_shard(n: int) -> None:
        if n == k:
            raise Interrupted
    return on_shard


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_resume_after_an_interruption_gives_the_same_bytes(tok, tmp_path, monkeypatch, kind):
    monkeypatch.setattr(sources, "PIECE_BYTES", 200)  # shards end mid-piece and mid-document
    src = tmp_path / "src"
    src.mkdir()
    if kind == "txt":
        for i in range(0, len(DOCS), 10):
            (src / f"{i:03d}.txt").write_text("".join(DOCS[i:i + 10]), encoding="utf-8")
    elif kind == "jsonl":
        for i in (0, 20):
            (src / f"{i}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS[i:i + 20]))
    else:
        write_parquet(src / "0.parquet", DOCS[:30])
        write_parquet(src / "1.parquet", DOCS[30:])
    args = dict(shard_tokens=301, val_tokens=50, progress=False)
    whole = prepare(src, tok, tmp_path / "whole", **args)
    out = tmp_path / "resumed"
    skips = []
    for k in (3, 7):
        with pytest.raises(Interrupted):
            prepare(src, tok, out, on_shard=stop_after(k), **args)
        assert not (out / MANIFEST_NAME).exists() and not list(out.glob("*.tmp"))
        skips.append(json.loads((out / PROGRESS_NAME).read_text())["position"]["skip"])
    assert any(skips)  # a shard ended inside a piece: the resumed run re-encodes it and skips what is stored
    done = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("shard_*.bin")}
    assert len(done) == 7
    (out / "shard_00007.bin.tmp").write_bytes(b"half a shard")  # what a killed run leaves behind
    assert prepare(src, tok, out, **args) == whole
    assert folder_bytes(out) == folder_bytes(tmp_path / "whole")
    # finished shards were not rewritten
    assert {n: ((out / n).stat().st_ino, (out / n).stat().st_mtime_ns) for n in done} == done
    assert prepare(src, tok, out, **args) == whole  # complete: returned as it is
    with pytest.raises(DataError, match="other arguments"):
        prepare(src, tok, out, **{**args, "shard_tokens": 98})


def test_bad_sources_are_one_sentence_naming_the_file_and_leave_no_manifest(tok, tmp_path):
    cases = {}
    (tmp_path / "lines.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    cases["lines.jsonl"] = "line 2 of .*lines.jsonl.* has no 'text' string field"
    (tmp_path / "notjson.jsonl").write_text('{"text": "fine"}\nnot json\n')
    cases["notjson.jsonl"] = "line 2 of .*notjson.jsonl.* is not JSON"
    write_parquet(tmp_path / "cols.parquet", ["a", "b"], column="body")
    cases["cols.parquet"] = "parquet file .*cols.parquet.* has no 'text' column \\(it has: body, id\\)"
    (tmp_path / "fake.parquet").write_text("not parquet at all")
    cases["fake.parquet"] = ".*fake.parquet.* is not a parquet file"
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    cases["latin1.txt"] = ".*latin1.txt.* is not UTF-8 text"
    (tmp_path / "empty").mkdir()
    cases["empty"] = "data folder .*empty.* holds no"
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_text("")
    (tmp_path / "blank" / "b.jsonl").write_text('{"text": ""}\n')
    cases["blank"] = "data source .*blank.* holds no text"
    cases["missing.txt"] = "data source .*missing.txt.* does not exist"
    for name, pattern in cases.items():
        out = tmp_path / f"out-{name}"
        with pytest.raises(DataError, match=pattern) as e:
            prepare(tmp_path / name, tok, out, shard_tokens=1, progress=False)
        assert "\n" not in str(e.value) and str(e.value).endswith(".")
        assert not (out / MANIFEST_NAME).exists() and not list(out.glob("*.tmp")), name
    (tmp_path / "notempty").mkdir()
    (tmp_path / "notempty" / "mine.txt").write_text("keep me")
    with pytest.raises(DataError, match="not empty"):
        prepare(tmp_path / "lines.jsonl", tok, tmp_path / "notempty", progress=False)
    with pytest.raises(DataError, match="val_tokens .* must be less than"):
        prepare(tmp_path / "notempty" / "mine.txt", "byte", tmp_path / "o2", val_tokens=7, progress=False)


def test_a_finished_folder_holds_its_shards_progress_manifest_and_tokenizer_and_nothing_else(tok, tmp_path):
    (tmp_path / "a.txt").write_text(DOCS[0])
    m = prepare(tmp_path / "a.txt", tok, tmp_path / "out", shard_tokens=10, progress=False)
    record = json.loads((tmp_path / "out" / PROGRESS_NAME).read_text())
    assert record["done"] is True and len(record["shards"]) == len(m.shards) > 1
    assert sorted(os.listdir(tmp_path / "out")) == sorted([MANIFEST_NAME, PROGRESS_NAME, TOKENIZER_NAME,
                                                           *(s.name for s in m.shards)])
    # a copy of the tokenizer file, byte for byte: the hash the manifest and a run spec pin
    assert (tmp_path / "out" / TOKENIZER_NAME).read_bytes() == tok.data and m.tokenizer_sha256 == tok.sha256
