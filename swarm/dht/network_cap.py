"""At most a few stage announcements per network, and a few more per block of networks.

Proofs of work make an id cost CPU time; these caps bound how many ids address space can put on
a stage, whatever the attacker spends on compute. Every reader (`SwarmDHT.stage_peers`) walks a
stage's ids in the order it first saw them (then by peer id) and keeps id p iff

    kept(network(p)) < N   and   kept(block(p)) < M

where kept(x) counts the ids already kept in x, network(p) is p's IPv4 /24 or IPv6 /48 and
block(p) the IPv4 /16 or IPv6 /32 that holds it. N is `extra["ids_per_network"]` of the signed
run spec (coordinator flag `--ids-per-network`), M is `extra["ids_per_block"]`
(`--ids-per-block`); 0 or absent: that cap is off (a spec of an older coordinator has no M, so
its readers apply N alone, as before). So one stage holds at most N ids per network and M per
block: an attacker with k blocks fields at most k M ids per stage, however many /48s (65,536 in
a /32) or /24s (256 in a /16) those blocks hold.

Why these blocks: a /48 is what one site, and often one rented server or one tunnel-broker
account, gets (cheap: the per-network cap alone gave 4 ids per /48); a /32 is the usual size of
one RIR allocation to an ISP or hoster, so the /48s one provider hands out come from a few /32s.
The IPv4 /16 is the same idea for /24s, weaker: rented IPv4 addresses are spread over many /16s.
The cost to honest volunteers: at most M of them per stage behind one ISP's /16 or /32 are
counted (the first seen); docs/security.md ("Identities that cost") has the figures.

Only an address this node has seen the peer at counts: the remote address of a live libp2p
connection to that peer id (p2pd's own list: the handshake proves the id, and a TCP
connection's address cannot be forged the way an announced one can). The addresses in an
announcement are the writer's own claims, so they count for nothing here: an outsider that
announces fake ids "at" a victim's addresses cannot crowd the victim out, and cannot escape
the caps by claiming addresses in many networks, because once anyone here dials or hears
from its ids (a router's liveness probe, a DHT request) they are counted where they really
are. The ids over a cap are skipped (and logged once each). Not counted, because their network
is not known or not shared with strangers: peers not connected to this node (yet), loopback and
private addresses (LAN and one-machine swarms), and relay circuits (the address seen is the
relay's). docs/security.md says what that leaves open.
"""
from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Mapping, Sequence

__all__ = ["IPV4_BLOCK", "IPV4_PREFIX", "IPV6_BLOCK", "IPV6_PREFIX", "block_of", "cap_per_network", "network_of"]

IPV4_PREFIX, IPV6_PREFIX = 24, 48  # a network: N ids per stage
IPV4_BLOCK, IPV6_BLOCK = 16, 32  # a block of networks: M ids per stage


def network_of(maddr: str) -> str | None:
    """The /24 (IPv4) or /48 (IPv6) of a public, direct address, e.g. "203.0.114.0/24"; None for anything else
    (loopback, private, relay circuits, DNS names, junk)."""
    if not isinstance(maddr, str) or "/p2p-circuit" in maddr:
        return None
    parts = [p for p in maddr.split("/") if p]
    if len(parts) < 2 or parts[0] not in ("ip4", "ip6"):
        return None
    try:
        ip = ipaddress.ip_address(parts[1])
    except ValueError:
        return None
    if not ip.is_global:
        return None
    prefix = IPV4_PREFIX if ip.version == 4 else IPV6_PREFIX
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


def block_of(network: str) -> str:
    """The /16 (IPv4) or /32 (IPv6) that holds `network` (a `network_of` answer), e.g. "203.0.0.0/16"."""
    net = ipaddress.ip_network(network)
    return str(net.supernet(new_prefix=IPV4_BLOCK if net.version == 4 else IPV6_BLOCK))


def cap_per_network(peers: Sequence, limit: int, seen_at: Mapping[str, Sequence[str]],
                    first_seen: Mapping[str, float], per_block: int = 0) -> tuple[list, list]:
    """(kept, skipped): `peers` (anything with a `peer_id`, in their order) with at most `limit` per network
    and at most `per_block` per block (module docstring's rule; a cap <= 0 is off).

    `seen_at[peer_id]`: the addresses of this node's live connections to that peer; a peer's network is the
    lowest network among them (None: not counted), its block the block of that network. Ids are taken in
    order of `first_seen` (earliest first; never seen: last), then of peer id."""
    if limit <= 0 and per_block <= 0:
        return list(peers), []
    kept_in: Counter[str] = Counter()  # network or block -> ids kept there so far
    skipped: set[str] = set()
    for p in sorted(peers, key=lambda p: (first_seen.get(p.peer_id, float("inf")), p.peer_id)):
        networks = sorted({n for n in map(network_of, seen_at.get(p.peer_id, ())) if n is not None})
        if not networks:
            continue
        network, block = networks[0], block_of(networks[0])
        if 0 < limit <= kept_in[network] or 0 < per_block <= kept_in[block]:
            skipped.add(p.peer_id)
            continue
        kept_in[network] += 1
        kept_in[block] += 1  # a block's key ("/16", "/32") never equals a network's ("/24", "/48")
    return [p for p in peers if p.peer_id not in skipped], [p for p in peers if p.peer_id in skipped]
