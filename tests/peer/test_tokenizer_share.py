"""The run's tokenizer travelling with the run (peer/data/run_tokenizer.py, peer/data/tokenizer_share.py,
protocol/tokenizer_wire.py): a prepared folder keeps a copy of its tokenizer, a peer finds it by the hash
the run spec pins, serves it in chunks, and a fetcher keeps only bytes of the pinned hash (a server that
sends others is named in one sentence, and the next one is asked)."""
from __future__ import annotations

import hashlib
import shutil

import msgpack
import pytest

from peer.data.corpus import DataError
from peer.data.run_tokenizer import (
    TOKENIZER_NAME,
    find_run_tokenizer,
    keep_tokenizer,
    load_run_tokenizer,
    run_tokenizer_sha256,
)
from peer.data.run_tokens import with_tokens
from peer.data.shards import prepare
from peer.data.tokenizer import ByteTokenizer, train_bpe
from peer.data.tokenizer_share import TokenizerFetchError, TokenizerShare, fetch_tokenizer
from protocol.spec import preset
from protocol.tokenizer_wire import CHUNK_BYTES, KIND_TOKENIZER, TokenizerRequest, encode_tokenizer_request
from protocol.wire import WireError
from tests.peer.test_tokenizer import corpus_text


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizer_share")
    (root / "a.txt").write_text(corpus_text(3, 800), encoding="utf-8")
    tok = train_bpe(root / "a.txt", 400, root / "tokenizer.json")
    prepare(root / "a.txt", tok, root / "tokens", shard_tokens=900, val_tokens=300, progress=False)
    prepare(root / "a.txt", "byte", root / "bytes", shard_tokens=9000, val_tokens=300, progress=False)
    return root, tok


def one_sentence(text: str) -> str:
    assert "\n" not in text and text.endswith(".") and text.count(". ") == 0, text
    return text


def test_a_prepared_folder_keeps_its_tokenizer_and_a_run_finds_it(made, tmp_path):
    root, tok = made
    kept = root / "tokens" / TOKENIZER_NAME
    assert kept.read_bytes() == (root / "tokenizer.json").read_bytes()
    assert not (root / "bytes" / TOKENIZER_NAME).exists()  # bytes need no file
    spec = with_tokens(preset("tiny"), str(root / "tokens"))
    assert run_tokenizer_sha256(spec) == tok.sha256
    assert find_run_tokenizer(spec) == kept
    loaded = load_run_tokenizer(spec)
    assert loaded.sha256 == tok.sha256 and loaded.decode(loaded.encode("hello world")) == "hello world"
    for byte_run in (preset("tiny"), with_tokens(preset("tiny"), str(root / "bytes"))):
        assert run_tokenizer_sha256(byte_run) is None and find_run_tokenizer(byte_run) is None
        assert isinstance(load_run_tokenizer(byte_run), ByteTokenizer)

    shutil.copytree(root / "tokens", tmp_path / "copy")
    (tmp_path / "copy" / TOKENIZER_NAME).write_text("{}")  # a copy holding another file
    with pytest.raises(DataError) as err:
        find_run_tokenizer(spec, [tmp_path / "copy"])
    assert "remove it" in one_sentence(str(err.value)) and tok.sha256[:12] in str(err.value)
    with pytest.raises(DataError) as err:
        keep_tokenizer(b"{}", tok.sha256, tmp_path / "copy")
    assert "not the run's" in one_sentence(str(err.value))
    assert keep_tokenizer(kept.read_bytes(), tok.sha256, tmp_path / "copy") == tmp_path / "copy" / TOKENIZER_NAME
    assert find_run_tokenizer(spec, [tmp_path / "copy"]) == tmp_path / "copy" / TOKENIZER_NAME


class FakeSwarm:
    """Peers answering `tok` requests in memory, through the same bytes a transport carries."""

    def __init__(self, servers: dict[str, TokenizerShare]) -> None:
        self.servers, self.asked = servers, []

    async def request(self, peer: str, kind: str, body: bytes, timeout: float) -> bytes:
        assert kind == KIND_TOKENIZER and timeout > 0
        self.asked.append(peer)
        if peer not in self.servers:
            raise ConnectionError(f"could not open a '{kind}' stream to {peer}")
        return await self.servers[peer].on_request(body, "fetcher")


async def test_a_tokenizer_of_many_chunks_is_fetched_whole_and_checked():
    data = bytes(range(256)) * (3 * CHUNK_BYTES // 256) + b"tail"  # 4 chunks, the last one short
    sha = hashlib.sha256(data).hexdigest()
    swarm = FakeSwarm({"good": TokenizerShare("run", data)})
    assert await fetch_tokenizer(swarm.request, ["good"], "run", sha) == data
    assert swarm.servers["good"].served == 4
    empty = TokenizerShare("run", b"")
    assert await fetch_tokenizer(FakeSwarm({"e": empty}).request, ["e"], "run", hashlib.sha256(b"").hexdigest()) == b""


async def test_a_server_with_other_bytes_is_named_and_the_next_one_asked():
    data = b'{"model": "the run\'s"}' * 3000
    sha = hashlib.sha256(data).hexdigest()
    liar = TokenizerShare("run", data[:-1] + b"X")
    liar.sha256 = sha  # claims the pinned file, serves another
    swarm = FakeSwarm({"liar0001": liar, "good0002": TokenizerShare("run", data)})
    assert await fetch_tokenizer(swarm.request, ["gone0000", "liar0001", "good0002"], "run", sha) == data
    assert swarm.asked[:2] == ["gone0000", "liar0001"]
    with pytest.raises(TokenizerFetchError) as err:
        await fetch_tokenizer(swarm.request, ["liar0001"], "run", sha)
    text = one_sentence(str(err.value))
    assert "liar0001 sent a tokenizer whose sha256 is" in text and "the signed run spec pins" in text
    with pytest.raises(TokenizerFetchError) as err:
        await fetch_tokenizer(swarm.request, [], "run", sha)
    assert "no peer to ask" in one_sentence(str(err.value))


async def test_a_server_refuses_another_run_another_file_past_the_end_and_strangers():
    data = b"x" * 100
    share = TokenizerShare("run", data)
    sha = share.sha256

    def body(run: str = "run", h: str = sha, i: int = 0) -> bytes:
        return encode_tokenizer_request(TokenizerRequest(run, h, i))

    for bad, why in [(body(run="other"), "another run"), (body(h="0" * 64), "holds the tokenizer of sha256"),
                     (body(i=1), "past the end"), (b"\xc1", "not valid msgpack"),
                     (msgpack.packb({"k": "tok", "r": "run", "h": "ZZ", "i": 0}), "64 lowercase hex")]:
        with pytest.raises(WireError, match=why):
            await share.on_request(bad, "peer")

    async def nobody(sender: str, ticket: bytes) -> bool:
        return False

    with pytest.raises(WireError, match="ticket holders"):
        await TokenizerShare("run", data, nobody).on_request(body(), "stranger")
