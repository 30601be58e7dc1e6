"""The run's tokenizer fetched over two real p2pd daemons (swarm/data/tokenizer_fetch.py): a peer whose
copy of the token folder lacks tokenizer.json gets it from the coordinator (as `swarm peer` does at start),
keeps it in its folder, checked against the run spec's hash, and then serves it itself; a server that sends
other bytes is refused in one sentence."""
from __future__ import annotations

import hashlib
import random
import shutil
import string

import pytest
from hivemind.p2p import P2P

from peer.data.run_tokenizer import TOKENIZER_NAME
from peer.data.run_tokens import with_tokens
from peer.data.shards import prepare
from peer.data.tokenizer import train_bpe
from peer.data.tokenizer_share import TokenizerFetchError, TokenizerShare, fetch_tokenizer
from protocol.spec import preset
from protocol.tokenizer_wire import KIND_TOKENIZER
from swarm.data.tokenizer_fetch import share_run_tokenizer
from swarm.net.transport import Transport
from tests.peer.test_tokenizer import corpus_text

LOCAL = ["/ip4/127.0.0.1/tcp/0"]
pytestmark = pytest.mark.e2e  # two real p2pd daemons


class NoAnnouncements:
    """The DHT side share_run_tokenizer reads: no stage announced yet (the coordinator alone is asked)."""

    async def all_stage_peers(self, run: str, n_stages: int) -> dict:
        return {}

    async def admitted(self, peer: str) -> bool:
        return True


@pytest.fixture
async def daemons():
    started: list[P2P] = []
    transports: list[Transport] = []

    async def start(initial: list[str] | None = None) -> tuple[P2P, Transport]:
        p2p = await P2P.create(initial_peers=initial or [], host_maddrs=LOCAL)
        started.append(p2p)
        # the coordinator's frame limit for a tiny run: replies of a chunk must fit it
        transports.append(Transport(p2p, "test", max_frame_bytes=(1 << 16) + 4096, timeout=10.0))
        return p2p, transports[-1]

    try:
        yield start
    finally:
        for t in transports:
            await t.close()
        for p2p in started:
            await p2p.shutdown()


def varied_text(seed: int, words: int) -> str:
    """Words of random letters: enough distinct pairs for a vocabulary of thousands."""
    rng = random.Random(seed)
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(words))


async def test_a_head_without_the_tokenizer_fetches_keeps_and_serves_it(tmp_path, daemons):
    (tmp_path / "a.txt").write_text(corpus_text(5, 500) + varied_text(5, 20_000), encoding="utf-8")
    tok = train_bpe(tmp_path / "a.txt", 3000, tmp_path / "tokenizer.json")  # ~100 KB: several chunks
    prepare(tmp_path / "a.txt", tok, tmp_path / "recorded", shard_tokens=5000, val_tokens=300, progress=False)
    spec = with_tokens(preset("tiny"), str(tmp_path / "recorded"))
    (tmp_path / "recorded").rename(tmp_path / "coordinator")  # the recorded path is on no machine here
    shutil.copytree(tmp_path / "coordinator", tmp_path / "head")
    (tmp_path / "head" / TOKENIZER_NAME).unlink()  # the head copied the shards, not the tokenizer

    server_p2p, server = await daemons()
    maddrs = [str(m) for m in await server_p2p.get_visible_maddrs()]
    client_p2p, client = await daemons(maddrs)
    server_id, client_id = server_p2p.peer_id.to_base58(), client_p2p.peer_id.to_base58()
    spec = spec.replace(extra={**spec.extra, "coordinator_peer": server_id})

    served = await share_run_tokenizer(spec, server, NoAnnouncements(), str(tmp_path / "coordinator"), fetch=False)
    assert served == tmp_path / "coordinator" / TOKENIZER_NAME
    kept = await share_run_tokenizer(spec, client, NoAnnouncements(), str(tmp_path / "head"), own_id=client_id)
    assert kept == tmp_path / "head" / TOKENIZER_NAME
    assert kept.read_bytes() == (tmp_path / "tokenizer.json").read_bytes()
    assert len(kept.read_bytes()) > 2 * (1 << 15)  # it came in several chunks

    # the head serves it in turn: any peer that has it may
    data = await fetch_tokenizer(server.request, [client_id], spec.run_hash, tok.sha256)
    assert hashlib.sha256(data).hexdigest() == tok.sha256

    # a server that claims the pinned file and serves other bytes is refused in one sentence
    liar = TokenizerShare(spec.run_hash, data.replace(b"merges", b"MERGES"))
    liar.sha256 = tok.sha256
    await server.unserve(KIND_TOKENIZER)
    await server.serve(KIND_TOKENIZER, liar.on_request)
    with pytest.raises(TokenizerFetchError) as err:
        await fetch_tokenizer(client.request, [server_id], spec.run_hash, tok.sha256)
    text = str(err.value)
    assert "\n" not in text and "sent a tokenizer whose sha256 is" in text and "the signed run spec pins" in text
