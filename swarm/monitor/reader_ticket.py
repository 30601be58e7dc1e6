"""`ReaderTicket`: how a reading tool (`swarm status`, `swarm dashboard`) gets into a private swarm that has no
coordinator up.

The run spec and the lease then live only at the peers, which re-serve them to ticket holders only
(`swarm/dht/record_share.py`). A ticket (`swarm admit`) names one peer id and the peers check that the asker is that
id, so the tool's DHT node runs under the identity the ticket was issued to (`--identity FILE --ticket TICKET`),
the way a peer does. Give the tool an identity of its own (`swarm identity monitor.id`, then `swarm admit` its id):
a peer's file is locked while that peer runs, and two nodes under one id would confuse the peers' routing.
"""
from __future__ import annotations

from dataclasses import dataclass

from swarm.trust.admission import Ticket, read_ticket
from swarm.trust.identity import Identity


@dataclass(frozen=True)
class ReaderTicket:
    """The identity a reading tool's DHT node runs under (None: a fresh one) and the ticket it asks peers with."""

    identity: Identity | None = None
    ticket: Ticket | None = None

    @classmethod
    def read(cls, identity: str | None, ticket: str | None) -> ReaderTicket:
        """From `--identity FILE` and `--ticket TICKET|FILE`; ValueError (one sentence) if they do not go together."""
        found = read_ticket(ticket)
        if found is not None and not identity:
            raise ValueError(f"--ticket admits peer {found.peer_id} only: pass --identity with the identity file it "
                             f"was issued to.")
        ident = Identity.load_or_create(identity) if identity else None
        if found is not None and ident is not None and found.peer_id != ident.peer_id:
            raise ValueError(f"the ticket is for peer {found.peer_id}, but --identity {identity} is peer "
                             f"{ident.peer_id}; pass the identity file the ticket was issued to.")
        return cls(ident, found)

    def request_bytes(self) -> bytes:
        """The ticket as a record request carries it (b"": none)."""
        return self.ticket.to_bytes() if self.ticket is not None else b""
