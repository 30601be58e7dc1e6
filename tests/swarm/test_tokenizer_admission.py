"""Who gets a private swarm's tokenizer (swarm/data/tokenizer_fetch.py `admits`): a peer its DHT view admits,
or one whose request carries a valid ticket of this swarm (a head asks at start, before it announces); a
stranger, a forged ticket or another peer's ticket is refused."""
from __future__ import annotations

import hashlib

import pytest

from peer.data.tokenizer_share import TokenizerShare, fetch_tokenizer
from swarm.data.tokenizer_fetch import admits
from swarm.trust.admission import Admission, AdmissionPolicy, Ticket
from swarm.trust.keys import SigningKey

HEAD, OTHER, KNOWN, THIRD = ("12D3KooWHead" + "a" * 40, "12D3KooWOther" + "b" * 39, "12D3KooWKnown" + "c" * 39,
                              "12D3KooWThird" + "d" * 39)


class PrivateView:
    """A private swarm's DHT view, as `SwarmDHT` gives it: `admitted` knows KNOWN's announced ticket only."""

    def __init__(self, key: SigningKey) -> None:
        self.admission = Admission(AdmissionPolicy(True, key.public_bytes(), "12D3KooWCoordinator"))

    async def admitted(self, peer: str) -> bool:
        return peer == KNOWN or self.admission.knows(peer)


async def test_a_private_swarm_serves_ticket_holders_only():
    key = SigningKey.generate()
    data = b'{"model": {"type": "BPE"}}' * 100
    sha = hashlib.sha256(data).hexdigest()
    share = TokenizerShare("run", data, admits(PrivateView(key)))

    def asking_as(sender: str):
        async def request(peer: str, kind: str, body: bytes, timeout: float) -> bytes:
            return await share.on_request(body, sender)
        return request

    head_ticket = Ticket.issue(key, HEAD).to_bytes()
    assert await fetch_tokenizer(asking_as(HEAD), ["coordinator"], "run", sha, ticket=head_ticket) == data
    assert await fetch_tokenizer(asking_as(KNOWN), ["coordinator"], "run", sha) == data  # announced already
    forged = Ticket.issue(SigningKey.generate(), THIRD).to_bytes()  # signed by another key
    for sender, ticket in [(OTHER, b""), (OTHER, head_ticket), (THIRD, forged)]:
        with pytest.raises(Exception, match="ticket holders only"):
            await fetch_tokenizer(asking_as(sender), ["coordinator"], "run", sha, ticket=ticket)
