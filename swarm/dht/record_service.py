"""Where the record share (`record_share.py`) meets the network: the libp2p protocol it is served on, its frame
bound, and whom a peer asks.

The protocol id is `/subspace-swarm/rec/1`, one namespace for every run (`RECORDS_NAMESPACE`), not the run's
`/subspace-swarm-<run hash>/<kind>/1`: a newcomer asks for the run spec before it knows the run. A request is at
most `MAX_REQUEST_BYTES` (refused before its body is read); a reply at most `record_frame_bytes(spec)`: the run
spec's bound, or one basis update of the run (d x k float32 and its header), whichever is larger.

    spec_asker      a newcomer, before it knows the run: asks its --initial-peers, then the peers its p2pd is
                    connected to (a temporary transport, closed once the spec is read)
    share_records   a peer of the run: serves what its `SwarmDHT.held` holds, and sets `SwarmDHT.record_peers` to
                    ask its --initial-peers, then the peers announced for the run's stages
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from protocol.record_wire import KIND_RECORDS, MAX_REQUEST_BYTES, reply_limit
from protocol.spec import RunSpec
from swarm.data.tokenizer_fetch import admits
from swarm.net.transport import Transport

from .record_share import ASK_TIMEOUT_S, PeerRecords, RecordShare

__all__ = ["RECORDS_NAMESPACE", "initial_ids", "record_frame_bytes", "share_records", "spec_asker"]

RECORDS_NAMESPACE = "subspace-swarm"
_PEER_PART = re.compile(r"/(?:p2p|ipfs)/([^/]+)")


def record_frame_bytes(spec: RunSpec | None = None) -> int:
    """The largest record frame: a run spec, a lease or the heads' work records, or (with `spec`) one of its basis
    updates."""
    basis = spec.d_model * spec.rank * 4 + 4096 if spec is not None else 0
    return max(reply_limit("spec"), reply_limit("lease"), reply_limit("work"), reply_limit("basis", basis))


def initial_ids(initial_peers: Sequence[str]) -> list[str]:
    """The peer ids that --initial-peers name (the last /p2p/ part of each address), in order."""
    return list(dict.fromkeys(found[-1] for m in initial_peers if (found := _PEER_PART.findall(m))))


async def spec_asker(dht, initial_peers: Sequence[str], ticket: bytes = b"") -> tuple[PeerRecords, Transport]:
    """Who a newcomer asks for the run spec when the DHT holds none, and the transport it asks over (close it
    once the spec is read; the P2P replica is the node's own, `dht.replicate_p2p()`, and stays)."""
    p2p = await dht.replicate_p2p()
    transport = Transport(p2p, RECORDS_NAMESPACE, max_frame_bytes=record_frame_bytes(), timeout=ASK_TIMEOUT_S)

    async def candidates() -> list[str]:  # the peers it was told to join through, then whoever p2pd reaches
        connected = [info.peer_id.to_base58() for info in await p2p.list_peers()]
        return list(dict.fromkeys(initial_ids(initial_peers) + connected))
    return PeerRecords(transport.request, candidates, ticket), transport


async def share_records(p2p, sdht, spec: RunSpec, initial_peers: Sequence[str], own_id: str) -> Transport:
    """Serve the records `sdht` holds to any admitted asker, and let `sdht` ask peers for those the DHT no longer
    holds (`SwarmDHT.record_peers`); returns the transport (close it when the peer stops)."""
    transport = Transport(p2p, RECORDS_NAMESPACE, max_frame_bytes=record_frame_bytes(spec), timeout=ASK_TIMEOUT_S)
    await transport.serve(KIND_RECORDS, RecordShare(sdht.held, admits(sdht)).on_request, max_bytes=MAX_REQUEST_BYTES)

    async def candidates() -> list[str]:  # the peers it joined through, then the run's announced peers
        announced = await sdht.all_stage_peers(spec.run_hash, spec.n_stages)
        ids = initial_ids(initial_peers) + [a.peer_id for s in sorted(announced) for a in announced[s]]
        return [p for p in dict.fromkeys(ids) if p != own_id]
    ticket = sdht.ticket.to_bytes() if sdht.ticket is not None else b""
    sdht.record_peers = PeerRecords(transport.request, candidates, ticket,
                                    basis_bytes=spec.d_model * spec.rank * 4 + 4096)
    return transport
