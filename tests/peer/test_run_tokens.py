"""The prepared token folder a run trains on, recorded in its run spec (peer/data/run_tokens.py): what
is recorded, the vocabulary it sets, what heads and `swarm eval` read, and the one-sentence refusals
of other tokens, another tokenizer, a folder not on this machine and --data together with --tokens."""
from __future__ import annotations

import asyncio
import shutil

import pytest

from peer.data.batches import BatchSource
from peer.data.corpus import DataError
from peer.data.run_corpus import with_corpus
from peer.data.run_tokens import (
    check_data_flags,
    recorded_tokens,
    run_token_store,
    token_batches,
    with_tokens,
)
from peer.data.shards import prepare
from peer.data.token_store import TokenStore
from peer.data.tokenizer import train_bpe
from protocol.spec import preset
from tests.peer.test_tokenizer import corpus_text


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A BPE tokenizer, a folder it prepared, a folder of other text it prepared, and a folder of bytes."""
    root = tmp_path_factory.mktemp("run_tokens")
    (root / "a.txt").write_text(corpus_text(1, 600), encoding="utf-8")
    (root / "b.txt").write_text(corpus_text(2, 600), encoding="utf-8")
    tok = train_bpe(root / "a.txt", 320, root / "tokenizer.json")
    for name, src, tokenizer in [("tokens", "a.txt", tok), ("other", "b.txt", tok), ("bytes", "a.txt", "byte")]:
        prepare(root / src, tokenizer, root / name, shard_tokens=700, val_tokens=300, progress=False)
    return root, tok


def one_sentence(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text.endswith(".") and text.count(". ") == 0, text
    return text


def test_the_record_pins_the_folder_and_sets_the_tokenizers_vocab(made, monkeypatch):
    root, tok = made
    monkeypatch.chdir(root)
    spec = with_tokens(preset("tiny"), "tokens")  # a relative path is recorded absolute
    store = TokenStore(root / "tokens")
    assert recorded_tokens(spec) == {"path": str(root / "tokens"), "manifest_sha256": store.manifest.manifest_sha256,
                                     "tokenizer_sha256": tok.sha256, "vocab": tok.vocab_size,
                                     "tokens": store.train_tokens}
    assert spec.vocab == tok.vocab_size == store.manifest.vocab_size > 256
    assert spec.run_hash != preset("tiny").run_hash  # other data, another run
    assert with_tokens(preset("tiny"), None) == preset("tiny") and recorded_tokens(preset("tiny")) is None


def test_a_head_reads_the_recorded_folder(made):
    root, tok = made
    spec = with_tokens(preset("tiny"), str(root / "tokens"))
    assert run_token_store(spec, None).folder == root / "tokens"
    batches = token_batches(spec)
    want = BatchSource(TokenStore(root / "tokens"), spec.seq_len, spec.microbatch_size, spec.data_seed)
    for step, index in [(0, 0), (0, 1), (5, 1)]:
        got = batches(step, index)
        assert got.shape == (spec.microbatch_size, spec.seq_len + 1) and int(got.max()) < spec.vocab
        assert got.equal(want.microbatch(step, index))
    assert token_batches(preset("tiny")) is None and run_token_store(preset("tiny"), None) is None


def test_other_tokens_or_another_tokenizer_are_refused(made):
    root, _ = made
    spec = with_tokens(preset("tiny"), str(root / "tokens"))
    with pytest.raises(DataError) as err:
        run_token_store(spec, str(root / "other"))
    assert "other tokens than this run's" in one_sentence(err) and "--tokens DIR" in str(err.value)
    with pytest.raises(DataError) as err:
        run_token_store(spec, str(root / "bytes"))
    assert "tokenizer" in one_sentence(err) and "--tokens DIR" in str(err.value)
    # `swarm eval --tokens`: other text is fine, as long as the run's tokenizer made it
    assert run_token_store(spec, str(root / "other"), same_tokens=False).folder == root / "other"
    with pytest.raises(DataError, match="tokenizer"):
        run_token_store(spec, str(root / "bytes"), same_tokens=False)
    with pytest.raises(DataError) as err:  # a head with --tokens in a run that pins none
        run_token_store(preset("tiny"), str(root / "tokens"))
    assert "without --tokens" in one_sentence(err)


def test_a_recorded_folder_absent_here_asks_for_a_copy(made, tmp_path):
    root, _ = made
    shutil.copytree(root / "tokens", tmp_path / "there")
    spec = with_tokens(preset("tiny"), str(tmp_path / "there"))
    (tmp_path / "there").rename(tmp_path / "copy")
    with pytest.raises(DataError) as err:
        run_token_store(spec, None)
    text = one_sentence(err)
    assert str(tmp_path / "there") in text and "not on this machine" in text
    assert "pass --tokens DIR with a copy of the run's prepared folder" in text
    assert run_token_store(spec, str(tmp_path / "copy")).folder == tmp_path / "copy"  # the same tokens elsewhere


def test_data_and_tokens_together_are_refused(made, capsys):
    root, _ = made
    with pytest.raises(DataError) as err:
        check_data_flags(str(root / "a.txt"), str(root / "tokens"))
    assert "pass one of them" in one_sentence(err)
    check_data_flags(None, str(root / "tokens"))
    check_data_flags(str(root / "a.txt"), None)
    with pytest.raises(DataError) as err:  # a --run-spec that records a corpus, and --tokens
        with_tokens(with_corpus(preset("tiny"), str(root / "a.txt")), str(root / "tokens"))
    assert "already records a --data corpus" in one_sentence(err)

    from swarm.cli import main
    from swarm.coordinator import CoordinatorOptions
    from swarm.node import PeerOptions, run_peer
    for argv in (["local", "--data", str(root / "a.txt"), "--tokens", str(root / "tokens"), "--steps", "1"],
                 ["eval", "--model", str(root / "no-model"), "--data", str(root / "a.txt"), "--tokens",
                  str(root / "tokens")]):
        assert main(argv) == 2  # refused before any process starts or any file is read
        err_text = capsys.readouterr().err.strip()
        assert err_text.startswith("error: --data and --tokens") and "\n" not in err_text
    with pytest.raises(DataError, match="pass one of them"):
        CoordinatorOptions(preset("tiny"), data="a.txt", tokens="tokens").check()
    with pytest.raises(DataError, match="pass one of them"):  # before any daemon starts
        asyncio.run(run_peer(PeerOptions(initial_peers=["/ip4/127.0.0.1/tcp/1"], data="a.txt", tokens="tokens")))


def test_a_folder_too_short_for_one_window_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("a few words\n" * 10, encoding="utf-8")
    prepare(tmp_path / "a.txt", "byte", tmp_path / "small", val_tokens=20, progress=False)
    with pytest.raises(DataError) as err:
        with_tokens(preset("tiny"), str(tmp_path / "small"))
    assert "seq_len + 1 = 65" in one_sentence(err)


def test_eval_scores_the_recorded_folder_or_another_of_the_runs_tokenizer(made):
    import torch

    from peer.runner.pipeline import InProcessPipeline
    from swarm.export.evaluate import evaluate
    from swarm.export.exporter import export_run
    from swarm.export.load import load_model
    from tests.swarm.export_helpers import gathered

    root, tok = made
    spec = with_tokens(preset("tiny", stages=3), str(root / "tokens"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pipe = InProcessPipeline(spec)
        pipe.train_step(0, token_batches(spec))
        export_run(gathered(pipe), root / "model")
    finally:
        torch.set_num_threads(threads)
    model = load_model(root / "model")
    result = evaluate(model, batches=2)
    assert result.source == f"validation split of {root / 'tokens'}"
    assert result.corpus == "the token folder this run trained on" and result.tokens == 2 * 8 * 64
    other = evaluate(model, batches=2, tokens=str(root / "other"))
    assert other.corpus == "--tokens" and other.source == f"validation split of {root / 'other'}"
    with pytest.raises(DataError, match="tokenizer"):
        evaluate(model, batches=2, tokens=str(root / "bytes"))
    # --data: text encoded with the run's tokenizer, the one the export keeps beside its weights
    assert (root / "model" / "tokenizer.json").read_bytes() == (root / "tokenizer.json").read_bytes()
    assert model.tokenizer.sha256 == tok.sha256
    scored = evaluate(model, batches=2, data=str(root / "a.txt"))
    assert scored.corpus == "--data, encoded with the run's tokenizer"
    from peer.data.corpus import Corpus
    from swarm.export.evaluate import loss_on
    ids = tok.encode((root / "a.txt").read_text(encoding="utf-8"))
    want = BatchSource(Corpus(ids, "a.txt", spec.seq_len), spec.seq_len, spec.microbatch_size,
                       spec.data_seed).val_batches(2)
    assert int(max(int(b.max()) for b in want)) >= 256  # BPE ids, not bytes
    assert scored.loss == pytest.approx(loss_on(model, want)[0], rel=1e-6)
