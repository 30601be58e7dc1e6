"""An attacker for the live tests: a hivemind node in the test process that joins a swarm's
DHT with an identity of its own, announces itself for whatever stages it likes (as anyone may
in a public swarm), and sends whatever bytes it likes to the swarm's peers."""
from __future__ import annotations

import asyncio

import msgpack
import torch

from protocol.codecs import WirePacker
from protocol.spec import RunSpec
from protocol.wire import ErrorReply, Header, WireLimits, decode_message, encode_activation, encode_gradient
from swarm import __version__
from swarm.dht import StageAnnouncement, SwarmDHT, close_node, start_dht
from swarm.net import Transport, TransportError
from swarm.trust.identity import Identity
from swarm.trust.work import proof_for


class Attacker:
    def __init__(self, maddrs: list[str], above: str | None = None, below: str | None = None) -> None:
        self.maddrs, self.above = maddrs, above  # above: get a peer id sorting after this one (not the leader)
        self.below = below  # below: a peer id sorting before this one (never the highest of a stage)

    async def __aenter__(self) -> Attacker:
        self.identity = Identity.generate()
        while (self.above is not None and self.identity.peer_id <= self.above
               or self.below is not None and self.identity.peer_id >= self.below):
            self.identity = Identity.generate()
        self.dht = await asyncio.to_thread(start_dht, self.maddrs, ["/ip4/127.0.0.1/tcp/0"], self.identity, True)
        self.p2p = self.transport = None
        self.sdht = SwarmDHT(self.dht, self.identity)
        self.spec = RunSpec.from_json((await self.sdht.fetch_run_spec()).spec_json)
        await self.sdht.adopt(self.spec)
        # pays the proof of work the run asks of an id (none where it asks none), as a stock peer does
        self.sdht.work = await proof_for(None, self.identity.peer_id, self.spec.run_hash,
                                         self.sdht.admission.policy.work_bits)
        self.p2p = await self.dht.replicate_p2p()
        self.transport = Transport(self.p2p, f"subspace-swarm-{self.spec.run_hash}", timeout=30)
        self.peer_id = self.identity.peer_id
        return self

    async def __aexit__(self, *exc) -> None:
        await close_node(self.dht, self.p2p, self.transport)

    async def announce(self, stage: int, state: str = "online", throughput: float = 1e9, step: int = 0) -> None:
        """Claim to serve `stage` (with a huge throughput, to draw traffic)."""
        ann = StageAnnouncement(self.peer_id, self.spec.run_hash, stage, [], throughput, 0, 0, state, __version__,
                                step=step)
        # a store can fail on a loaded machine (the DHT's own RPCs time out): an attacker, like a
        # peer's heartbeat, simply stores again
        deadline = asyncio.get_running_loop().time() + 30.0
        while not await self.sdht.announce(ann, 60):
            assert asyncio.get_running_loop().time() < deadline, "the DHT never stored our announcement"
            await asyncio.sleep(0.5)  # poll: retry the store

    async def until_member(self, peer: str, kind: str, timeout: float = 60.0) -> None:
        """Wait until `peer` counts this node as a member for `kind` (its view of the DHT has caught
        up with our announcement): probe with a message it must refuse for another reason."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            code, reason = await self.send(peer, kind, b"\x93\xc1probe")
            if "only peers announced" not in reason:
                return
            assert asyncio.get_running_loop().time() < deadline, f"{peer[-8:]} never saw our announcement"
            await asyncio.sleep(0.2)  # poll: announcements take a moment to reach the peer

    async def send(self, peer: str, kind: str, body: bytes) -> tuple[str, str]:
        """("accepted" | the refusal code | "transport", text) for one message."""
        try:
            reply = await self.transport.request(peer, kind, body)
        except TransportError as e:
            return "transport", str(e)
        if reply == b"":
            return "accepted", ""
        try:
            msg = decode_message(reply, WireLimits.for_spec(self.spec))
        except Exception:  # a reply that is not an error message (e.g. a control reply): it was served
            return "served", repr(msgpack.unpackb(reply, raw=False) if reply[:1] != b"\x00" else reply[:40])
        return (msg.code, msg.reason) if isinstance(msg, ErrorReply) else ("accepted", "")

    # ---------------------------------------------------------------- message makers
    def activation(self, step: int, stage: int, mb: int = 0, attempt: int = 0, scale: float = 1.0,
                   width: int | None = None, **header) -> bytes:
        spec = self.spec
        B, T, w = spec.microbatch_size, spec.seq_len, width or spec.boundary_width
        h = Header(header.get("run", spec.run_hash), step, mb, header.get("basis_version", 0), spec.codec, stage,
                   attempt)
        tokens = torch.randint(0, spec.vocab, (B, T + 1))
        return encode_activation(h, tokens, WirePacker.for_spec(spec).pack(torch.randn(B, T, w) * scale), spec.vocab)

    def gradient(self, step: int, stage: int, mb: int = 0, attempt: int = 0,
                 values: torch.Tensor | None = None) -> bytes:
        spec = self.spec
        B, T, w = spec.microbatch_size, spec.seq_len, spec.boundary_width
        h = Header(spec.run_hash, step, mb, 0, spec.codec, stage, attempt)
        return encode_gradient(h, WirePacker.for_spec(spec).pack(torch.randn(B, T, w) if values is None else values),
                               1.0)
