"""`swarm tokenizer train` and `swarm data prepare` (swarm/data/cli.py), run in-process through
`swarm.cli.main`: what they write and print, their flags' help, and user errors as one `error:` line
with exit code 2."""
from __future__ import annotations

import argparse
import hashlib
import json

import pytest

from peer.data.manifest import MANIFEST_NAME, Manifest
from peer.data.token_store import TokenStore
from peer.data.tokenizer import load_tokenizer
from swarm.cli import build_parser, main
from tests.peer.test_tokenizer import corpus_text


@pytest.fixture
def texts(tmp_path):
    root = tmp_path / "texts"
    root.mkdir()
    (root / "a.txt").write_text(corpus_text(3, 400), encoding="utf-8")
    (root / "b.jsonl").write_text("".join(json.dumps({"text": corpus_text(s, 5)}) + "\n" for s in range(10)))
    return root


def test_train_then_prepare(texts, tmp_path, capsys):
    tok_file = tmp_path / "tok.json"
    assert main(["tokenizer", "train", "--data", str(texts), "--vocab", "350", "--out", str(tok_file), "--quiet"]) == 0
    out = capsys.readouterr().out
    digest = hashlib.sha256(tok_file.read_bytes()).hexdigest()
    assert f"wrote {tok_file}: byte-level BPE" in out and f"sha256 {digest}" in out
    assert load_tokenizer(tok_file).sha256 == digest

    folder = tmp_path / "tokens"
    argv = ["data", "prepare", "--data", str(texts), "--tokenizer", str(tok_file), "--out", str(folder),
            "--shard-tokens", "500", "--val-tokens", "200", "--quiet"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    m = Manifest.read(folder / MANIFEST_NAME)
    assert f"manifest_sha256 {m.manifest_sha256}" in out and f"{m.total_tokens} tokens of 11 documents" in out
    assert m.val_tokens == 200 and all(s.tokens == 500 for s in m.shards[:-1]) and len(m.shards) > 2
    assert TokenStore(folder, tokenizer_sha256=digest).total_tokens == m.total_tokens
    assert main(argv) == 0  # the same command again: the folder is complete, nothing is redone
    assert Manifest.read(folder / MANIFEST_NAME) == m


def test_prepare_with_bytes_by_default(texts, tmp_path, capsys):
    assert main(["data", "prepare", "--data", str(texts / "a.txt"), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    m = Manifest.read(tmp_path / "o" / MANIFEST_NAME)
    assert m.vocab_size == 256 and m.total_tokens == (texts / "a.txt").stat().st_size and len(m.shards) == 1


def _error(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_user_errors_are_one_line_and_exit_code_2(texts, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    missing = tmp_path / "missing"
    assert str(missing) in _error(["tokenizer", "train", "--data", str(missing), "--out", str(tmp_path / "t.json")],
                                  capsys)
    assert "at least 257" in _error(["tokenizer", "train", "--data", str(texts), "--vocab", "100", "--out",
                                     str(tmp_path / "t.json")], capsys)
    assert str(bad) in _error(["data", "prepare", "--data", str(texts), "--tokenizer", str(bad), "--out",
                               str(tmp_path / "o")], capsys)
    (texts / "c.jsonl").write_text('{"no": "text"}\n')
    err = _error(["data", "prepare", "--data", str(texts), "--out", str(tmp_path / "o2"), "--quiet"], capsys)
    assert "line 1 of" in err and "c.jsonl" in err
    assert not (tmp_path / "o2" / MANIFEST_NAME).exists()
    with pytest.raises(SystemExit) as e:  # argparse's own errors: also exit code 2
        main(["data", "prepare", "--data", str(texts), "--out", str(tmp_path / "o3"), "--shard-tokens", "0"])
    assert e.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_every_flag_states_its_default():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parsers = [sub.choices["tokenizer"], sub.choices["data"]]
    leaves = [p for parent in parsers for a in parent._actions if isinstance(a, argparse._SubParsersAction)
              for p in a.choices.values()]
    assert sorted(p.prog for p in leaves) == ["swarm data prepare", "swarm tokenizer train"]
    for p in leaves:
        assert p.description
        for action in p._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help and "(default: " in action.help, (p.prog, action.option_strings)
