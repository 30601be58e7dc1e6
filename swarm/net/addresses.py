"""Which of a peer's addresses others can use, and what it announces.

A peer listening on 0.0.0.0 is visible at every address of its machine: 127.0.0.1, its LAN
address, maybe a public one. Only some of those mean anything to the other peers, and which
depends on where the swarm is: the swarm's **scope** is the widest scope among the addresses
of its initial peers (loopback < private < public). An address is usable if its own scope is
at least the swarm's: in a swarm of one machine every address works; in a LAN swarm the LAN
and public addresses do; in a public swarm only public ones (and relay circuits through a
public relay). DNS names count as public.

`--public-ip IP` announces /ip4/IP/tcp/PORT for every TCP port the peer listens on (a port
forwarded to it on the router), `--announce-maddrs` announces exactly the addresses given.

The binary form of a multiaddr: hivemind's Python `Multiaddr` writes a /p2p/ peer id as a
CID, but p2pd reads the raw multihash, so addresses that name a peer (relay circuits) are
encoded here (`daemon_maddr`) before they go to p2pd's control socket.
"""
from __future__ import annotations

import ipaddress
import re
import warnings
from collections.abc import Iterable, Sequence

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    from hivemind.p2p import PeerID
    from hivemind.utils.multiaddr import Multiaddr

__all__ = ["LOOPBACK", "PRIVATE", "PUBLIC", "scope_of", "swarm_scope", "usable", "is_circuit", "announce_addresses",
           "without_peer", "daemon_maddr", "tcp_ports", "check_initial_peers", "AddressError"]

LOOPBACK, PRIVATE, PUBLIC = 0, 1, 2
SCOPE_NAMES = {LOOPBACK: "loopback", PRIVATE: "private", PUBLIC: "public"}
_P2P_CODE = b"\xa5\x03"  # varint 421: /p2p/
_PEER_PART = re.compile(r"/(?:p2p|ipfs)/([^/]+)")


class AddressError(ValueError):
    """An address flag that cannot work; the message says what to pass instead."""


def _parts(maddr: str) -> list[str]:
    return [p for p in maddr.split("/") if p]


def check_initial_peers(maddrs: Iterable[str]) -> None:
    """Refuse, in one sentence, an initial peer that p2pd could not dial: every one must be a
    multiaddr that ends in the peer id of a node (`/p2p/12D3Koo...`)."""
    for m in maddrs:
        found = _PEER_PART.findall(m)
        try:
            Multiaddr(m)
            if not found or not m.rstrip("/").endswith(found[-1]) or not PeerID.from_base58(found[-1]).to_bytes():
                raise ValueError(m)
        except Exception:
            raise AddressError(f"--initial-peers {m!r} does not name a peer: pass the full address the coordinator "
                               "prints, like /ip4/203.0.113.7/tcp/31337/p2p/12D3KooW...") from None


def is_circuit(maddr: str) -> bool:
    return "/p2p-circuit" in maddr


def scope_of(maddr: str) -> int:
    """LOOPBACK, PRIVATE or PUBLIC: who can dial this address. A relay circuit has its relay's scope."""
    parts = _parts(maddr)
    for kind, value in zip(parts, parts[1:]):
        if kind in ("dns", "dns4", "dns6", "dnsaddr"):
            return LOOPBACK if value == "localhost" else PUBLIC
        if kind in ("ip4", "ip6"):
            ip = ipaddress.ip_address(value)
            if ip.is_loopback:
                return LOOPBACK
            if ip.is_unspecified:
                return LOOPBACK  # a listen address, never one to dial
            # CGNAT (100.64/10) is private to a carrier, not dialable from outside: is_global says so
            return PUBLIC if ip.is_global else PRIVATE
    return LOOPBACK  # unix sockets and the like


def swarm_scope(initial_peers: Iterable[str]) -> int:
    """The widest scope among the initial peers' addresses (PUBLIC for a swarm that has none yet)."""
    scopes = [scope_of(m) for m in initial_peers]
    return max(scopes) if scopes else PUBLIC


def usable(maddrs: Iterable[str], scope: int) -> list[str]:
    """The addresses that peers of a swarm of this scope can dial, in the order given, without duplicates."""
    seen, out = set(), []
    for m in maddrs:
        if m not in seen and scope_of(m) >= scope:
            seen.add(m)
            out.append(m)
    return out


def without_peer(maddr: str) -> str:
    """The address without its trailing /p2p/<peer id> (the part that names the peer itself)."""
    return re.sub(r"/(?:p2p|ipfs)/[^/]+$", "", maddr)


def tcp_ports(maddrs: Iterable[str]) -> list[int]:
    ports = []
    for m in maddrs:
        parts = _parts(m)
        for kind, value in zip(parts, parts[1:]):
            if kind == "tcp" and int(value) not in ports:
                ports.append(int(value))
    return ports


def announce_addresses(host_maddrs: Sequence[str], public_ip: str | None = None,
                       announce_maddrs: Sequence[str] = ()) -> list[str]:
    """What p2pd should announce instead of its listen addresses ([] = let it announce those).

    `public_ip` gives /ip4|ip6/IP/tcp/PORT for every fixed TCP port in `host_maddrs`, so it
    needs a fixed port (the one forwarded on the router).
    """
    out = []
    for m in announce_maddrs:
        try:
            Multiaddr(m)
        except Exception:
            raise AddressError(f"--announce-maddrs {m!r} is not a multiaddr; write it like "
                               f"/ip4/203.0.113.7/tcp/31337.") from None
        if 0 in tcp_ports([m]):
            raise AddressError(f"--announce-maddrs {m} has port 0; announce the port others should dial.")
        out.append(m)
    if public_ip:
        try:
            ip = ipaddress.ip_address(public_ip)
        except ValueError:
            raise AddressError(f"--public-ip {public_ip!r} is not an IP address; pass the router's public "
                               f"address, e.g. 203.0.113.7.") from None
        ports = [p for p in tcp_ports(host_maddrs) if p]
        if not ports:
            raise AddressError("--public-ip needs a fixed listen port to forward: pass --host-maddrs "
                               "/ip4/0.0.0.0/tcp/31337 and forward TCP 31337 on your router to this machine.")
        out += [f"/ip{ip.version}/{ip}/tcp/{port}" for port in ports]
    return list(dict.fromkeys(out))


def daemon_maddr(maddr: str) -> Multiaddr:
    """`maddr` in the binary form p2pd reads (peer ids as raw multihashes, not CIDs)."""
    pieces = _PEER_PART.split(maddr)
    out = b""
    for i, piece in enumerate(pieces):
        if i % 2:
            digest = PeerID.from_base58(piece).to_bytes()
            out += _P2P_CODE + _varint(len(digest)) + digest
        elif piece:
            out += Multiaddr(piece).to_bytes()
    return Multiaddr(out)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)
