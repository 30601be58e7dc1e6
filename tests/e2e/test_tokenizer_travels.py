"""The tokenizer travels with the run, between real processes: a coordinator started on a BPE token folder
serves its tokenizer.json, and a head whose copy of the folder holds the shards but not the tokenizer
fetches it at start (checked against the signed run spec's sha256) and keeps it in its folder."""
from __future__ import annotations

import shutil
import time

import pytest

from peer.data.run_tokenizer import TOKENIZER_NAME
from peer.data.run_tokens import with_tokens
from peer.data.shards import prepare
from peer.data.tokenizer import train_bpe
from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from tests.peer.test_tokenizer import corpus_text


def test_a_head_fetches_the_runs_tokenizer_from_the_coordinator(tmp_path, session_fork_server):
    (tmp_path / "a.txt").write_text(corpus_text(6, 3000), encoding="utf-8")
    tok = train_bpe(tmp_path / "a.txt", 400, tmp_path / "tokenizer.json")
    prepare(tmp_path / "a.txt", tok, tmp_path / "recorded", shard_tokens=20_000, progress=False)
    shutil.copytree(tmp_path / "recorded", tmp_path / "head")
    (tmp_path / "head" / TOKENIZER_NAME).unlink()  # the head's machine got the shards only
    spec = with_tokens(preset("tiny", stages=3), str(tmp_path / "recorded"))
    swarm = LocalSwarm(LocalOptions(spec, workdir=str(tmp_path / "run"), threads=1, quiet=True),
                       fork_server=session_fork_server)
    try:
        swarm.start_coordinator(serving=False)  # it reads the recorded folder's tokenizer.json and serves it
        (tmp_path / "recorded").rename(tmp_path / "elsewhere")  # the recorded path is on no other machine
        swarm.start_peer(0, "--tokens", str(tmp_path / "head"))
        kept, log = tmp_path / "head" / TOKENIZER_NAME, swarm.dir / "stage0.log"
        deadline = time.monotonic() + 60
        while not (log.exists() and "kept the run's tokenizer" in log.read_text()):
            if time.monotonic() > deadline:
                pytest.fail(f"the head kept no tokenizer within 60 s; its log ends with:\n{log.read_text()[-3000:]}")
            swarm._check_alive()
            time.sleep(0.1)  # poll the log another process writes
        assert kept.read_bytes() == (tmp_path / "tokenizer.json").read_bytes()
        assert "fetched the run's tokenizer" in log.read_text() and tok.sha256[:12] in log.read_text()
    finally:
        swarm.stop(grace=5.0)
