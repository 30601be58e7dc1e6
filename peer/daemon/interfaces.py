"""The two small interfaces a peer is handed: something that moves messages, and something
that finds and announces peers. `swarm/` implements both over hivemind; `peer/daemon/loopback.py`
implements them in memory for fast tests. The daemon knows nothing else of the network.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

Handler = Callable[[bytes, str], Awaitable[bytes]]  # (request body, sender peer id) -> reply body

STATES = ("joining", "syncing", "online", "paused", "leaving")


class LinkError(RuntimeError):
    """A message could not be delivered (timeout, connection, or the remote refused the frame); `peer`: the
    last peer it was offered to, where one was."""

    def __init__(self, reason: str = "", peer: str | None = None) -> None:
        super().__init__(reason)
        self.peer = peer


@dataclass(frozen=True)
class Refusal:
    """Why a peer may not send a message here. `code` "retry" asks the sender to send it again
    shortly, to the same peer and without counting a failure: this peer's view of the swarm may
    lag the sender's (an announcement it has not read yet)."""

    reason: str
    code: str = "refused"


Admit = Callable[[str, str], Awaitable["Refusal | None"]]  # (sender, message kind) -> why not, or None


class Signer(Protocol):
    """This peer's identity key, and every peer's public one: a boundary message's sender signs what it
    sent (protocol/boundary_sig.py), its receiver and the leader check it. `swarm/` signs with the libp2p
    identity (swarm/trust/boundary_signer.py); `peer/daemon/loopback.py` with an Ed25519 key per name."""

    def sign(self, data: bytes) -> bytes: ...

    def verify(self, peer_id: str, data: bytes, signature: bytes) -> bool:
        """True only if `signature` is `peer_id`'s over `data`; False for anything else, never an exception."""
        ...


class MessageLink(Protocol):
    peer_id: str
    signer: Signer | None  # None: this link's messages go unsigned, and a signed message is taken unchecked

    async def serve(self, kind: str, handler: Handler) -> None: ...

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes: ...


@dataclass(frozen=True)
class RollbackOrder:
    """The swarm key's order, in its lease, to undo a caught head's steps (peer/state/rollback.py): the
    `id`-th revocation took the lease from `liar`, whose signed record of step `caught` (counted
    from 1) showed other data; roll the swarm back to the snapshot step `to` (steps done)."""

    id: int
    to: int
    caught: int
    liar: str


@dataclass
class PeerStatus:
    """What a peer says of itself in its announcement (refreshed by heartbeat)."""

    stage: int
    state: str = "joining"  # one of STATES
    throughput: float = 0.0  # tokens/s over the last steps (a claim: routers measure for themselves)
    queue: int = 0
    basis_version: int = 0
    step: int = 0
    leads: bool = False  # a head that drives the steps says so (peer/step/leadership.py)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PeerInfo:
    """One announced peer of a stage, as the directory sees it."""

    peer_id: str
    stage: int
    state: str
    step: int
    throughput: float  # claimed; for placement and display only
    leads: bool = False  # the head says it drives the steps (peer/step/leadership.py)


class PeerDirectory(Protocol):
    async def announce(self, status: PeerStatus) -> None: ...

    async def pick(self, stage: int, exclude: set[str] = ...) -> str:
        """A live peer serving `stage`, best first (counted as one request in flight to it until
        `release`); raises LinkError if none appears in time."""
        ...

    def release(self, peer: str, seconds: float | None) -> None:
        """A request to `peer` from `pick` is over: answered after `seconds`, or abandoned (None)."""
        ...

    def report_failure(self, peer: str, bad_data: bool = False) -> None:
        """Tell the router a peer failed, so it is avoided for a while (much longer if it sent
        numbers no honest peer sends: a retry would only meet it again)."""
        ...

    def forgive_failure(self, peer: str) -> None:
        """`peer` is avoided only for failing (it did not answer in time), and has since been shown alive: take
        it back now. A ban for bad data, or for the run, stays."""
        ...

    def ban(self, peer: str, why: str = "") -> None:
        """`peer` was caught passing off other numbers as its work (peer/checks/spot_checks.py): never pick
        it, list it or take its messages again in this run."""
        ...

    def is_banned(self, peer: str) -> bool:
        """Whether `peer` is left out here: banned (`ban`), a head whose lease the swarm key revoked, or (a
        router) avoided for a while for failing or for bad data."""
        ...

    def refuses(self, peer: str) -> bool:
        """Whether `peer`'s messages are refused here: banned (`ban`), a revoked head, or banned for bad data
        while that lasts; not a peer avoided only for failing (a missed answer is no wrong message)."""
        ...

    async def members(self, stage: int) -> list[PeerInfo]:
        """The peers announced online for `stage` right now (fresh, not from a cache), by peer id."""
        ...

    async def lease_order(self, fresh: bool = False) -> list[str] | None:
        """The heads that may lead, in order, from the swarm key's newest lease (`peer/step/leadership.py`);
        None if the swarm has no coordinator to grant one; [] while it has granted none yet. `fresh`: read
        it now, not from a copy up to a few seconds old (a head that waits for a lease to name it)."""
        ...

    async def rollback_order(self) -> RollbackOrder | None:
        """The rollback the swarm key's newest lease orders, or None (`LeaderLease.rollback_id`)."""
        ...
