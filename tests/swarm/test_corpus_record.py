"""The corpus a run trains on, recorded in its run spec: what heads and `swarm eval` read, and
`swarm generate`'s default length and sliding-window note."""
from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch

from peer.data.corpus import DataError, load_corpus
from peer.data.run_corpus import check_corpus, recorded, run_corpus, with_corpus
from swarm.cli import main
from swarm.export.evaluate import evaluate
from swarm.export.exporter import export_run
from swarm.export.generate import GenerateOptions, generate_text, run_generate
from swarm.export.load import load_model
from tests.swarm.export_helpers import gathered, tiny, trained

TEXT = "Volunteers train one model together over the internet, one stage each. " * 120


@pytest.fixture(scope="module")
def run_on_own_text(tmp_path_factory):
    """A run whose spec records a folder of text (as `swarm local --data DIR` does), exported natively."""
    root = tmp_path_factory.mktemp("own")
    (root / "texts").mkdir()
    (root / "texts" / "a.md").write_text(TEXT)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spec = with_corpus(tiny("subspace"), str(root / "texts"))
        export_run(gathered(trained(spec, steps=1)), root / "model")
    finally:
        torch.set_num_threads(threads)
    return root


def test_the_record_names_the_path_and_hash_of_the_corpus(tmp_path, monkeypatch):
    (tmp_path / "t.txt").write_text(TEXT)
    monkeypatch.chdir(tmp_path)
    spec = with_corpus(tiny(), "t.txt")  # a relative path is recorded absolute
    record = recorded(spec)
    corpus = load_corpus(tmp_path / "t.txt", seq_len=spec.seq_len)
    assert record == {"path": str(tmp_path / "t.txt"), "sha256": hashlib.sha256(TEXT.encode()).hexdigest(),
                      "tokens": len(corpus)}
    assert with_corpus(tiny(), None) == tiny() and recorded(tiny()) is None
    assert spec.run_hash != tiny().run_hash  # two runs on different text are different runs
    assert json.loads(spec.to_json())["extra"]["data"] == record
    with pytest.raises(DataError, match="does not exist"):
        with_corpus(tiny(), str(tmp_path / "missing"))


def test_a_head_reads_the_recorded_corpus_and_refuses_other_text(tmp_path):
    (tmp_path / "t.txt").write_text(TEXT)
    spec = with_corpus(tiny(), str(tmp_path / "t.txt"))
    corpus, origin = run_corpus(spec, None)  # a head without --data
    assert corpus.name == str(tmp_path / "t.txt") and origin == "the corpus this run trained on"
    check_corpus(spec, corpus)
    (tmp_path / "other.txt").write_text(TEXT.upper())
    other, _ = run_corpus(spec, str(tmp_path / "other.txt"))
    with pytest.raises(DataError, match=r"is not the text this run trains on, .*sha256 differs; pass --data"):
        check_corpus(spec, other)
    embedded, origin = run_corpus(tiny(), None)
    assert origin.startswith("the embedded corpus")
    check_corpus(tiny(), embedded)  # a spec that records nothing accepts any text, as before


def test_eval_scores_the_recorded_corpus_and_says_so(run_on_own_text, capsys):
    root = run_on_own_text
    result = evaluate(load_model(root / "model"), batches=2)
    assert result.source == f"validation split of {root / 'texts'}"
    assert result.corpus == "the corpus this run trained on"
    override = evaluate(load_model(root / "model"), data=str(root / "texts" / "a.md"), batches=2)
    assert override.corpus == "--data" and override.source == f"validation split of {root / 'texts' / 'a.md'}"
    # the folder holds one file: the same bytes, so the same batches and loss
    assert override.loss == pytest.approx(result.loss, rel=1e-9)
    assert main(["eval", "--model", str(root / "model"), "--batches", "2"]) == 0
    out = capsys.readouterr().out
    assert f"validation split of {root / 'texts'}: the corpus this run trained on" in out
    assert main(["eval", "--model", str(root / "model"), "--batches", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["corpus"] == "the corpus this run trained on"


def test_eval_of_a_corpus_that_moved_or_changed_asks_for_data(run_on_own_text, tmp_path, capsys):
    root = run_on_own_text
    moved = tmp_path / "moved"
    os.rename(root / "texts", moved)
    try:
        assert main(["eval", "--model", str(root / "model"), "--batches", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"trained on {root / 'texts'} (sha256 " in err
        assert "not on this machine; pass --data PATH" in err
        assert main(["eval", "--model", str(root / "model"), "--batches", "1", "--data", str(moved)]) == 0
        assert f"validation split of {moved}: --data" in capsys.readouterr().out
        (moved / "b.txt").write_text("new text")
        os.rename(moved, root / "texts")
        assert main(["eval", "--model", str(root / "model"), "--batches", "1"]) == 2
        assert "sha256 differs; pass --data PATH" in capsys.readouterr().err
    finally:
        if moved.exists():
            os.rename(moved, root / "texts")
        (root / "texts" / "b.txt").unlink(missing_ok=True)


def test_generate_defaults_to_the_context_and_says_when_the_window_slides(run_on_own_text, capsys):
    model_dir = run_on_own_text / "model"
    model = load_model(model_dir)
    assert model.max_len == 64
    text, note = run_generate(GenerateOptions(model=str(model_dir), prompt="Hello"))
    assert text == generate_text(model, "Hello", 64)  # the default: the model's context
    assert "exceed this model's context of 64 bytes" in note and "sliding window" in note
    assert run_generate(GenerateOptions(model=str(model_dir), prompt="Hello", max_new_tokens=59))[1] is None
    assert main(["generate", "--model", str(model_dir), "--prompt", "Hello", "--max-new-tokens", "10"]) == 0
    quiet = capsys.readouterr()
    assert quiet.out.startswith("Hello") and quiet.err == ""
    assert main(["generate", "--model", str(model_dir), "--prompt", "Hello"]) == 0
    assert "note: the prompt (5 bytes) and 64 new bytes exceed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "the window slides" in " ".join(capsys.readouterr().out.split())
