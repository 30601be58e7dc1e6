"""`swarm unban PEER...`: the holder of the swarm key lifts peers' bans for the run.

The leading head bans a replica it convicted (false, withheld or too slow work:
`peer/checks/spot_checks.py`); the banned peer stops with a sentence that says why, and every
other peer refuses it for the rest of the run. An operator who finds the ban mistaken (a card
that computed wrongly and was fixed, a link that was slow for a while) signs a `Pardons` record
with the swarm key (`swarm/dht/records.py`); every peer reads it with the leader lease within
seconds, and the leader no longer names the peer (`swarm/replicas/run_bans.py`). The peer then
starts again with the same `--identity`. A head whose lease the coordinator revoked (it fed other
data than the run's) stays out of the lease: that is not a ban this lifts.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass, field

from protocol.spec import RunSpec
from swarm.dht import Pardons, SwarmDHT, close_node, start_dht
from swarm.options import opt
from swarm.trust.admission import PEER_ID, existing_swarm_key
from swarm.trust.keys import SigningKey
from swarm.trust.state_dir import WHERE
from swarm.user_errors import Refused

log = logging.getLogger(__name__)

PARDON_TTL_S = 86400.0  # the longest a swarm record may live; every peer that read it in time keeps what it lifted


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
    dht = await asyncio.to_thread(start_dht, opts.initial_peers, ["/ip4/127.0.0.1/tcp/0"], None, True)
    try:
        sdht = SwarmDHT(dht, swarm_key=key)
        signed = await sdht.fetch_run_spec()
        if signed is None:
            raise Refused("no run spec found: is the coordinator running, and is --initial-peers its address?")
        if signed.fingerprint != key.fingerprint():
            raise Refused(f"this swarm's run spec is signed by key {signed.fingerprint}, not by {key.fingerprint()} "
                          f"(--key): only the swarm key's holder lifts bans.")
        spec = RunSpec.from_json(signed.spec_json)
        await sdht.adopt(spec)
        earlier = await sdht.fetch_pardons(spec.run_hash)
        now = time.time()
        pardons = Pardons(spec.run_hash, {**(earlier.peers if earlier else {}), **{p: now for p in opts.peers}})
        if not await sdht.publish_pardons(pardons, PARDON_TTL_S):
            raise Refused("the DHT did not store the pardon; run the same command again in a moment.")
        lease = await sdht.fetch_lease(spec.run_hash)
    finally:
        await close_node(dht)
    for peer in opts.peers:
        print(f"lifted {peer}'s ban in run {spec.run_hash}: every peer reads it within seconds; start that peer "
              f"again with the same --identity.")
        if lease is not None and peer in lease.revoked:
            print(f"note: {peer} lost its lease for feeding other data than the run's; it may serve a stage again, "
                  f"but it never leads.", file=sys.stderr)
    return 0
