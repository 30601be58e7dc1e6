"""Tests for peer/data/tokenizer.py: the byte and BPE tokenizers behind one interface, loading a
tokenizer.json with one-sentence errors, and deterministic BPE training."""
from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest
import torch

from peer.data.batches import ByteTokenizer as ReExported
from peer.data.corpus import DataError
from peer.data.tokenizer import EOS_TOKEN, BpeTokenizer, ByteTokenizer, load_tokenizer, train_bpe

WORDS = ["swarm", "peer", "stage", "token", "über", "naïve", "日本", "loss", "gradient", "basis", "the", "of"]


def corpus_text(seed: int, lines: int) -> str:
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(lines)) + "\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    (root / "b.txt").write_text(corpus_text(1, 2000), encoding="utf-8")
    (root / "a.md").write_text("# Notes\n\n    indented code()\n" + corpus_text(2, 1000), encoding="utf-8")
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": corpus_text(s, 20)}) + "\n" for s in range(30)))
    return root


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> BpeTokenizer:
    return train_bpe(corpus, 400, tmp_path_factory.mktemp("tok") / "tokenizer.json")


def test_training_is_deterministic_byte_for_byte_with_or_without_parallelism(corpus, trained, tmp_path, monkeypatch):
    outs = []
    for parallel in ("true", "false"):
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", parallel)
        out = tmp_path / f"tok-{parallel}.json"
        train_bpe([corpus], 400, out)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == open(trained.name, "rb").read()
    assert not list(tmp_path.glob("*.tmp"))  # written under a temporary name, then renamed


def test_bpe_file_hash_vocab_and_end_of_text(trained):
    data = open(trained.name, "rb").read()
    assert trained.sha256 == hashlib.sha256(data).hexdigest()
    assert trained.eos_id == 0  # the special token comes first
    assert 300 < trained.vocab_size <= 400
    assert json.loads(data)["added_tokens"][0]["content"] == EOS_TOKEN
    merged = trained.encode("gradient gradient")
    assert merged.numel() < len("gradient gradient") // 2  # frequent words became few tokens


@pytest.mark.parametrize("text", ["", "the swarm", "héllo, wörld ✓ 🙂\n\n\tcode()  ", "日本 über naïve"])
def test_bpe_round_trips(trained, text):
    ids = trained.encode(text)
    assert ids.dtype == torch.long and ids.dim() == 1
    assert all(0 <= i < trained.vocab_size for i in ids.tolist())
    assert trained.decode(ids) == text
    assert trained.decode(ids.tolist()) == text
    (batch,) = trained.encode_batch([text])
    assert batch.tolist() == ids.tolist()


def test_text_that_spells_end_of_text_is_text_not_the_separator(trained):
    ids = trained.encode(f"a{EOS_TOKEN}b")
    assert trained.eos_id not in ids.tolist()
    assert trained.decode(ids) == f"a{EOS_TOKEN}b"
    assert trained.decode([trained.eos_id]) == EOS_TOKEN
    with pytest.raises(ValueError):
        trained.decode([trained.vocab_size])


def test_byte_tokenizer_implements_the_interface():
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and ReExported is ByteTokenizer
    assert tok.vocab_size == 256 and tok.eos_id is None and tok.name == "byte"
    assert len(tok.sha256) == 64 and tok.sha256 == ByteTokenizer().sha256
    (ids,) = tok.encode_batch(["é!"])
    assert ids.dtype == np.uint8 and ids.tolist() == list("é!".encode()) == tok.encode("é!").tolist()


def test_load_tokenizer_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(DataError, match=f"{missing}.*does not exist"):
        load_tokenizer(missing)
    for name, content in [("garbage.json", b"\x00\x01 not json"), ("other.json", b'{"model": {"type": "Nope"}}')]:
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(DataError, match=f"{path}.* is not a tokenizer.json") as e:
            load_tokenizer(path)
        assert str(e.value).count(". ") == 0 and "\n" not in str(e.value)  # one sentence


def test_train_refuses_a_tiny_vocabulary_and_text_that_is_not_there(corpus, tmp_path):
    with pytest.raises(DataError, match="at least 257"):
        train_bpe(corpus, 256, tmp_path / "t.json")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    with pytest.raises(DataError, match="holds no text"):
        train_bpe(tmp_path / "empty", 300, tmp_path / "t.json")
    with pytest.raises(DataError, match="does not exist"):
        train_bpe(tmp_path / "nowhere", 300, tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()
