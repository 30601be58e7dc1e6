"""`swarm unban PEER...`: the holder of the swarm key lifts peers' bans for the run.

The leading head bans a replica it convicted (false, withheld or too slow work:
`peer/checks/spot_checks.py`); the banned peer stops with a sentence that says why, and every
other peer refuses it for the rest of the run. An operator who finds the ban mistaken (a card
that computed wrongly and was fixed, a link that was slow for a while) signs a `Pardons` record
with the swarm key (`swarm/dht/records.py`); every peer reads it with the leader lease within
seconds, and the leader no longer names the peer (`swarm/replicas/run_bans.py`). The peer then
starts again with the same `--identity`. A head whose lease the coordinator revoked (it fed other
data than the run's) stays out of the lease: that is not a ban this lifts.

No coordinator need be up: the key file signs the pardon, not a coordinator, and peers read it from the DHT. With
none up for longer than the run spec lives there, the spec is the peers' signed copy (`swarm/dht/spec_fetch.py`),
asked for with a ticket this command signs for its own node (a private swarm re-serves it to ticket holders only);
the output then says that no coordinator holds the seat.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass, field

from swarm.dht import ActiveCoordinator, Pardons, SwarmDHT, close_node, start_dht
from swarm.dht.record_service import spec_asker
from swarm.dht.spec_fetch import read_spec
from swarm.options import opt
from swarm.trust.admission import PEER_ID, Ticket, existing_swarm_key
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from swarm.trust.state_dir import WHERE
from swarm.user_errors import Refused

log = logging.getLogger(__name__)

PARDON_TTL_S = 86400.0  # the longest a swarm record may live; every peer that read it in time keeps what it lifted
TICKET_S = 600.0  # this command's own ticket: long enough to ask the peers for the run spec


@dataclass
class UnbanOptions:
    """What `swarm unban` is told; each field is also its flag."""

    initial_peers: list[str] = opt(None, "any peer of the swarm (the coordinator prints its address)",
                                   metavar="MADDR", required=True)
    key: str | None = opt(None, "the swarm key file, as the coordinator runs with it (default: swarm.key in the "
                          "state folder, the coordinator's default)", metavar="FILE")
    state_dir: str | None = opt(None, f"the state folder of the default key (default: {WHERE})", metavar="DIR")
    peers: list[str] = field(default_factory=list)  # the positional PEER ids


def check_unban(opts: UnbanOptions) -> SigningKey:
    """The swarm key; ValueError (one sentence) for a missing key or a malformed peer id."""
    key = existing_swarm_key(opts.key, opts.state_dir)
    for peer in opts.peers:
        if not PEER_ID.fullmatch(peer):
            raise ValueError(f"{peer!r} is not a peer id; `swarm status` lists banned peers by id.")
    return key


async def unban(opts: UnbanOptions) -> int:
    key = check_unban(opts)
    identity = Identity.generate()  # known here, so that this node's ticket can name it
    dht = await asyncio.to_thread(start_dht, opts.initial_peers, ["/ip4/127.0.0.1/tcp/0"], identity, True)
    asking = None
    try:
        sdht = SwarmDHT(dht, swarm_key=key)
        ticket = Ticket.issue(key, identity.peer_id, time.time() + TICKET_S)
        peers, asking = await spec_asker(dht, opts.initial_peers, ticket.to_bytes())
        found = await read_spec(sdht, None, peers)
        if found is None:
            raise Refused("no run spec found in the DHT or at the peers asked: is --initial-peers the address of "
                          "the coordinator or of a running peer of the swarm?")
        signed, spec = found
        if signed.fingerprint != key.fingerprint():
            raise Refused(f"this swarm's run spec is signed by key {signed.fingerprint}, not by {key.fingerprint()} "
                          f"(--key): only the swarm key's holder lifts bans.")
        await sdht.adopt(spec)
        seat = ActiveCoordinator(sdht, spec.run_hash)
        lapsed = await seat.lapsed()
        earlier = await sdht.fetch_pardons(spec.run_hash)
        now = time.time()
        pardons = Pardons(spec.run_hash, {**(earlier.peers if earlier else {}), **{p: now for p in opts.peers}})
        if not await sdht.publish_pardons(pardons, PARDON_TTL_S):
            raise Refused("the DHT did not store the pardon; run the same command again in a moment.")
        lease = await sdht.fetch_lease(spec.run_hash)
    finally:
        if asking is not None:
            await asking.close()
        await close_node(dht)
    if lapsed:
        print("note: no coordinator holds the seat; the pardon needs none (the swarm key signed it), and every peer "
              "reads it from the DHT all the same.", file=sys.stderr)
    for peer in opts.peers:
        print(f"lifted {peer}'s ban in run {spec.run_hash}: every peer reads it within seconds; start that peer "
              f"again with the same --identity.")
        if lease is not None and peer in lease.revoked:
            print(f"note: {peer} lost its lease for feeding other data than the run's; it may serve a stage again, "
                  f"but it never leads.", file=sys.stderr)
    return 0
