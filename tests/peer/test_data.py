"""Tests for peer/data/corpus.py and peer/data/batches.py: corpus loading,
byte tokenizer, deterministic microbatches."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.data.batches import BatchSource, ByteTokenizer, shard_indices, unigram_entropy_bits, unigram_entropy_nats
from peer.data.corpus import EMBEDDED_CORPUS_NAME, VAL_MIN_SEQUENCES, Corpus, DataError, load_corpus

SEQ_LEN = 32
BATCH = 4


@pytest.fixture(scope="module")
def embedded() -> Corpus:
    return load_corpus(None, seq_len=SEQ_LEN)


@pytest.fixture(scope="module")
def source(embedded: Corpus) -> BatchSource:
    return BatchSource(embedded, SEQ_LEN, BATCH, seed=1234)


def _is_window_of(row: torch.Tensor, tokens: torch.Tensor) -> bool:
    """True if `row` equals tokens[s : s + len(row)] for some start s."""
    windows = tokens.long().unfold(0, row.numel(), 1)
    return bool((windows == row).all(dim=1).any())


# ---------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips_utf8() -> None:
    tok = ByteTokenizer()
    text = "héllo, wörld ✓ 🙂"
    ids = tok.encode(text)
    assert tok.vocab_size == 256
    assert ids.dtype == torch.long and ids.dim() == 1
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode(ids.tolist()) == text
    assert tok.encode("").numel() == 0 and tok.decode(torch.empty(0, dtype=torch.long)) == ""


def test_tokenizer_decode_replaces_broken_utf8_and_rejects_bad_ids() -> None:
    tok = ByteTokenizer()
    cut = tok.encode("é")[:1]  # half of a two-byte character
    assert tok.decode(cut) == "\ufffd"
    with pytest.raises(ValueError):
        tok.decode([300])
    with pytest.raises(ValueError):
        tok.decode(torch.zeros(2, 2, dtype=torch.long))


# ------------------------------------------------------------------------------- corpus


def test_embedded_corpus_is_pydoc_topics(embedded: Corpus) -> None:
    from pydoc_data import topics

    expected = "\n".join(topics.topics[k] for k in sorted(topics.topics)).encode("utf-8")
    assert embedded.name == EMBEDDED_CORPUS_NAME
    assert embedded.tokens.dtype == torch.uint8
    assert len(embedded) == len(expected) > 100_000
    assert bytes(embedded.tokens.tolist()) == expected


def test_split_is_last_five_percent_and_views(embedded: Corpus) -> None:
    train, val = embedded.train, embedded.val
    assert train.numel() + val.numel() == len(embedded)
    assert val.numel() == math.ceil(0.05 * len(embedded))
    assert torch.equal(torch.cat([train, val]), embedded.tokens)
    # Views share the corpus storage: no copy of the corpus per split.
    assert train.data_ptr() == embedded.tokens.data_ptr()
    assert val.data_ptr() == embedded.tokens.data_ptr() + train.numel()


def test_split_keeps_a_few_val_sequences_on_small_corpora() -> None:
    corpus = Corpus(torch.arange(1000, dtype=torch.int64) % 256, "small", seq_len=SEQ_LEN)
    assert corpus.val.numel() == VAL_MIN_SEQUENCES * (SEQ_LEN + 1)  # > 5% of 1000


def test_load_single_file(tmp_path) -> None:
    text = "a plain file, taken byte for byte. " * 40
    f = tmp_path / "one.bin"
    f.write_text(text, encoding="utf-8")
    corpus = load_corpus(str(f), seq_len=16)
    assert corpus.name == str(f)
    assert bytes(corpus.tokens.tolist()) == text.encode()


def test_load_directory_recursive_sorted_filtered(tmp_path) -> None:
    body = "x" * 300
    (tmp_path / "b.md").write_text("B" + body)
    (tmp_path / "a.txt").write_text("A" + body)
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "sub" / "deep" / "c.py").write_text("C" + body)
    (tmp_path / "sub" / "empty.txt").write_text("")
    (tmp_path / "skip.json").write_text("J" + body)
    (tmp_path / "image.png").write_bytes(b"\x89PNG" + b"\x00" * 300)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "hidden.py").write_text("H" + body)

    corpus = load_corpus(tmp_path, seq_len=16)
    # Sorted by relative path: a.txt, b.md, sub/deep/c.py; empty files add nothing.
    expected = b"\n".join([("A" + body).encode(), ("B" + body).encode(), ("C" + body).encode()])
    assert bytes(corpus.tokens.tolist()) == expected
    assert corpus.tokens.dtype == torch.uint8


def test_missing_path_is_a_data_error(tmp_path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_corpus(str(tmp_path / "nope.txt"))


def test_empty_file_is_a_data_error(tmp_path) -> None:
    f = tmp_path / "empty.txt"
    f.write_bytes(b"")
    with pytest.raises(DataError, match="empty"):
        load_corpus(str(f))


def test_directory_without_corpus_files_is_a_data_error(tmp_path) -> None:
    (tmp_path / "data.json").write_text("{}")
    with pytest.raises(DataError, match="contains no"):
        load_corpus(str(tmp_path))


def test_directory_of_empty_files_is_a_data_error(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("")
    (tmp_path / "b.md").write_text("")
    with pytest.raises(DataError, match="empty"):
        load_corpus(str(tmp_path))


def test_unreadable_file_in_directory_is_a_data_error(tmp_path) -> None:
    (tmp_path / "ok.txt").write_text("fine " * 200)
    # A dangling link is unreadable even for root, unlike a chmod 000 file.
    os.symlink(tmp_path / "gone.txt", tmp_path / "broken.txt")
    with pytest.raises(DataError, match="cannot read"):
        load_corpus(str(tmp_path))


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_permission_denied_is_a_data_error(tmp_path) -> None:
    f = tmp_path / "secret.txt"
    f.write_text("secret " * 200)
    f.chmod(0)
    try:
        with pytest.raises(DataError, match="cannot read"):
            load_corpus(str(f))
    finally:
        f.chmod(0o600)


def test_too_short_corpus_is_a_data_error(tmp_path) -> None:
    f = tmp_path / "short.txt"
    window = 16 + 1
    f.write_bytes(b"z" * ((VAL_MIN_SEQUENCES + 1) * window - 1))
    with pytest.raises(DataError, match="too short"):
        load_corpus(str(f), seq_len=16)
    f.write_bytes(b"z" * ((VAL_MIN_SEQUENCES + 1) * window))  # exactly enough
    corpus = load_corpus(str(f), seq_len=16)
    assert corpus.train.numel() == window


def test_data_error_is_a_value_error() -> None:
    assert issubclass(DataError, ValueError)


def test_batch_source_refuses_too_short_tokens() -> None:
    with pytest.raises(DataError, match="too short"):
        BatchSource(torch.zeros(SEQ_LEN, dtype=torch.uint8), SEQ_LEN, BATCH, seed=0)
    corpus = Corpus(torch.zeros(10_000, dtype=torch.uint8), "zeros", seq_len=8)
    with pytest.raises(DataError, match="too short"):
        BatchSource(corpus, 5000, BATCH, seed=0)  # the corpus re-split at a longer seq_len


# ------------------------------------------------------------------------------ batches


def test_microbatch_shape_and_dtype(source: BatchSource) -> None:
    mb = source.microbatch(0, 0)
    assert mb.shape == (BATCH, SEQ_LEN + 1)
    assert mb.dtype == torch.long
    assert mb.is_contiguous()
    assert int(mb.min()) >= 0 and int(mb.max()) < 256
    assert source.tokens_per_microbatch == BATCH * SEQ_LEN


def test_microbatch_is_deterministic_across_instances(embedded: Corpus) -> None:
    a = BatchSource(embedded, SEQ_LEN, BATCH, seed=7)
    b = BatchSource(load_corpus(None, seq_len=SEQ_LEN), SEQ_LEN, BATCH, seed=7)
    for step, index in [(0, 0), (0, 3), (17, 1), (10_000, 7)]:
        assert torch.equal(a.microbatch(step, index), b.microbatch(step, index))
    # Call order does not matter: there is no hidden state between calls.
    later = a.microbatch(5, 2)
    a.microbatch(6, 0)
    assert torch.equal(a.microbatch(5, 2), later)


def test_microbatch_depends_on_step_index_and_seed(embedded: Corpus) -> None:
    src = BatchSource(embedded, SEQ_LEN, BATCH, seed=7)
    other_seed = BatchSource(embedded, SEQ_LEN, BATCH, seed=8)
    keys = [(s, i) for s in range(4) for i in range(4)]
    batches = {k: src.microbatch(*k) for k in keys}
    for k1 in keys:
        for k2 in keys:
            if k1 < k2:
                assert not torch.equal(batches[k1], batches[k2]), (k1, k2)
        assert not torch.equal(batches[k1], other_seed.microbatch(*k1))


def test_windows_are_contiguous_train_slices(source: BatchSource, embedded: Corpus) -> None:
    train = embedded.split(SEQ_LEN)[0]
    for index in range(3):
        mb = source.microbatch(2, index)
        inputs, targets = mb[:, :-1], mb[:, 1:]
        assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets = inputs shifted by one
        for row in mb:
            assert _is_window_of(row, train)


def test_windows_come_from_train_split_only() -> None:
    # Train is all 0s and val all 1s, so any val token in a batch would show.
    tokens = torch.cat([torch.zeros(900, dtype=torch.uint8), torch.ones(100, dtype=torch.uint8)])
    src = BatchSource(tokens[:900], 8, 16, seed=3, val_tokens=tokens[900:])
    for step in range(20):
        assert int(src.microbatch(step, 0).sum()) == 0
    for vb in src.val_batches(3):
        assert int(vb.min()) == 1


def test_microbatch_exact_window_positions() -> None:
    # tokens[i] = i (int64) makes each row's first element its start position.
    tokens = torch.arange(500, dtype=torch.long)
    src = BatchSource(tokens, 10, 8, seed=0)
    mb = src.microbatch(3, 1)
    expected = mb[:, :1] + torch.arange(11)
    assert torch.equal(mb, expected)
    assert int(mb[:, 0].max()) <= 500 - 11


def test_val_batches_deterministic_and_shaped(embedded: Corpus) -> None:
    a = BatchSource(embedded, SEQ_LEN, BATCH, seed=1).val_batches(5)
    b = BatchSource(embedded, SEQ_LEN, BATCH, seed=2).val_batches(5)
    val = embedded.split(SEQ_LEN)[1]
    assert len(a) == 5
    for x, y in zip(a, b):
        assert x.shape == (BATCH, SEQ_LEN + 1) and x.dtype == torch.long
        assert torch.equal(x, y)
        for row in x:
            assert _is_window_of(row, val)
    assert BatchSource(embedded, SEQ_LEN, BATCH, seed=1).val_batches(0) == []


def test_val_batches_need_val_tokens() -> None:
    src = BatchSource(torch.zeros(100, dtype=torch.uint8), 8, 2, seed=0)
    with pytest.raises(DataError, match="no validation tokens"):
        src.val_batches(1)


def test_bad_arguments_are_refused(embedded: Corpus) -> None:
    with pytest.raises(ValueError):
        BatchSource(embedded, 0, BATCH, seed=0)
    with pytest.raises(ValueError):
        BatchSource(embedded, SEQ_LEN, 0, seed=0)
    src = BatchSource(embedded, SEQ_LEN, BATCH, seed=0)
    with pytest.raises(ValueError):
        src.microbatch(-1, 0)
    with pytest.raises(TypeError):
        src.microbatch(1.5, 0)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ sharding


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=0, max_value=200), heads=st.integers(min_value=1, max_value=40))
def test_shard_indices_cover_every_index_exactly_once(n: int, heads: int) -> None:
    shards = [shard_indices(n, heads, rank) for rank in range(heads)]
    flat = [i for shard in shards for i in shard]
    assert sorted(flat) == list(range(n))
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1  # balanced
    for shard in shards:
        assert shard == sorted(shard)


@pytest.mark.parametrize(
    ("n", "heads", "rank", "expected"),
    [(8, 1, 0, list(range(8))), (8, 2, 1, [1, 3, 5, 7]), (5, 3, 2, [2]), (2, 4, 3, [])],
)
def test_shard_indices_round_robin(n: int, heads: int, rank: int, expected: list[int]) -> None:
    assert shard_indices(n, heads, rank) == expected


@pytest.mark.parametrize(("heads", "rank"), [(2, 2), (2, -1), (1, 5), (0, 0)])
def test_shard_indices_bad_rank(heads: int, rank: int) -> None:
    with pytest.raises(ValueError):
        shard_indices(8, heads, rank)


def test_head_shards_reproduce_single_process_batches(embedded: Corpus) -> None:
    # Two "head peers" with their own BatchSource regenerate exactly the batches that a
    # one-process reference would draw for the step.
    reference = BatchSource(embedded, SEQ_LEN, BATCH, seed=99)
    heads = [BatchSource(embedded, SEQ_LEN, BATCH, seed=99) for _ in range(2)]
    step, n_mb = 11, 6
    got = {i: heads[r].microbatch(step, i) for r in range(2) for i in shard_indices(n_mb, 2, r)}
    assert sorted(got) == list(range(n_mb))
    for i in range(n_mb):
        assert torch.equal(got[i], reference.microbatch(step, i))


# ------------------------------------------------------------------------------ entropy


def test_entropy_of_known_distributions() -> None:
    uniform = torch.arange(256, dtype=torch.uint8).repeat(4)
    assert unigram_entropy_bits(uniform) == pytest.approx(8.0)
    assert unigram_entropy_nats(uniform) == pytest.approx(math.log(256))
    # p = (1/2, 1/4, 1/4): H = 1.5 bits.
    tokens = torch.tensor([0, 0, 1, 2], dtype=torch.uint8)
    assert unigram_entropy_bits(tokens) == pytest.approx(1.5)
    assert unigram_entropy_nats(tokens) == pytest.approx(1.5 * math.log(2))
    assert unigram_entropy_bits(torch.full((10,), 65, dtype=torch.uint8)) == 0.0
    with pytest.raises(ValueError):
        unigram_entropy_nats(torch.empty(0, dtype=torch.uint8))


def test_embedded_corpus_entropy_is_english_like(embedded: Corpus) -> None:
    bits = unigram_entropy_bits(embedded.tokens)
    assert 4.0 < bits < 5.5  # English text bytes sit around 4.5 bits
    assert unigram_entropy_nats(embedded.tokens) == pytest.approx(bits * math.log(2))
