"""A reading tool's identity and ticket for a private swarm with no coordinator up (swarm/monitor/reader_ticket.py):
they must go together, and a bad pair is one sentence before any daemon starts. The tools reading a real private
swarm with them: tests/e2e/test_no_coordinator_joiners.py."""
from __future__ import annotations

import pytest

from swarm.cli import main
from swarm.monitor.reader_ticket import ReaderTicket
from swarm.trust.admission import Ticket
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey


def test_a_ticket_goes_with_the_identity_it_names(tmp_path):
    key = SigningKey.generate()
    mine = Identity.load_or_create(tmp_path / "monitor.id")
    ticket = Ticket.issue(key, mine.peer_id)
    reader = ReaderTicket.read(str(tmp_path / "monitor.id"), ticket.encode())
    assert reader.identity.peer_id == mine.peer_id and reader.ticket == ticket
    assert reader.request_bytes() == ticket.to_bytes()

    (tmp_path / "ticket.txt").write_text(ticket.encode() + "\n")  # or the file `swarm admit` was redirected to
    assert ReaderTicket.read(str(tmp_path / "monitor.id"), str(tmp_path / "ticket.txt")).ticket == ticket

    assert ReaderTicket.read(None, None) == ReaderTicket() and ReaderTicket().request_bytes() == b""
    with pytest.raises(ValueError, match=f"admits peer {mine.peer_id} only: pass --identity"):
        ReaderTicket.read(None, ticket.encode())
    with pytest.raises(ValueError, match="the ticket is for peer .* but --identity .* is peer"):
        ReaderTicket.read(str(tmp_path / "other.id"), ticket.encode())


@pytest.mark.parametrize("with_identity", [False, True], ids=["no identity", "another identity"])
def test_status_and_dashboard_refuse_a_bad_pair_in_one_sentence(tmp_path, capsys, with_identity):
    ticket = Ticket.issue(SigningKey.generate(), Identity.generate().peer_id).encode()
    pair = ["--ticket", ticket] + (["--identity", str(tmp_path / "other.id")] if with_identity else [])
    peers = ["--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"]
    for command in (["status"], ["dashboard", "--port", "0"]):
        assert main([*command, *peers, *pair]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "--identity" in err, err
