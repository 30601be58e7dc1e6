"""The direct TCP channel (swarm/net/direct.py) in one process over 127.0.0.1: tickets, tags, refusals."""

from __future__ import annotations

import asyncio
import struct

import pytest

from swarm.net.direct import (
    CONNECTIONS_PER_TICKET,
    MAGIC,
    NONCE_BYTES,
    TAG_BYTES,
    DirectConnection,
    DirectDialer,
    DirectRefused,
    DirectServer,
    Ticket,
    dial_hosts,
)

LIMIT = 1 << 20


class Host:
    """The transport side of a direct server: an echo handler and a failing one, with what they saw."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bytes]] = []
        self.counted: list[tuple[str, str, str, int]] = []

    def request_limit(self, kind: str) -> int | None:
        return LIMIT if kind in ("echo", "boom") else None

    async def answer(self, kind: str, peer: str, body: bytes) -> tuple[int, bytes]:
        self.calls.append((kind, peer, body))
        return (0, body[::-1]) if kind == "echo" else (1, b"the stage is on fire.")

    def count(self, peer: str, kind: str, direction: str, nbytes: int) -> None:
        self.counted.append((peer, kind, direction, nbytes))

    async def arrived(self, nbytes: int, kind: str = "", peer: str = "") -> None:
        pass

    async def shaped_write(self, writer: asyncio.StreamWriter, frame: tuple[bytes, ...]) -> None:
        for part in frame:
            writer.write(part)
        await writer.drain()


@pytest.fixture
async def server():
    host = Host()
    srv = DirectServer(host, "127.0.0.1", 0)
    await srv.start()
    try:
        yield srv, host
    finally:
        await srv.close()


def dialer_for(srv: DirectServer, peer: str, hosts: list[str] | None = None) -> DirectDialer:
    async def ask(_peer: str) -> bytes:  # stands in for the libp2p request, which authenticates `peer`
        return srv.ticket(peer, ["127.0.0.1"] if hosts is None else hosts).to_bytes()

    return DirectDialer(ask, connect_timeout_s=2.0, retry_after_s=60.0)


async def dialed(dialer: DirectDialer, peer: str) -> DirectConnection:
    with pytest.raises(DirectRefused):  # a peer not found out yet: libp2p carries this one, a probe starts
        await dialer.connection(peer)
    assert await dialer.probe(peer)
    return await dialer.connection(peer)


async def exchange(conn: DirectConnection, kind: str, body: bytes) -> tuple[int, bytes]:
    conn.writer.write(b"".join(conn.request_frame(kind, body)))
    await conn.writer.drain()
    status, reply, _ = await conn.read_reply(LIMIT)
    return status, reply


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 5.0) == b""
    except ConnectionError:
        return True


async def test_requests_reach_the_handler_as_the_ticket_s_peer_on_one_pooled_connection(server):
    srv, host = server
    dialer = dialer_for(srv, "12D3KooWalice")
    body = bytes(range(256)) * 1024
    conn = await dialed(dialer, "12D3KooWalice")
    probed = conn
    assert await exchange(conn, "echo", body) == (0, body[::-1])
    assert await exchange(conn, "boom", b"x") == (1, b"the stage is on fire.")  # a refusal keeps the connection
    assert await exchange(conn, "echo", b"again") == (0, b"niaga")
    assert conn.seq == 3
    dialer.give_back("12D3KooWalice", conn)
    assert await dialer.connection("12D3KooWalice") is conn is probed  # the probe's connection, pooled
    assert [(k, p) for k, p, _ in host.calls] == [("echo", "12D3KooWalice"), ("boom", "12D3KooWalice"),
                                                  ("echo", "12D3KooWalice")]
    request_bytes = 1 + len("echo") + 4 + len(body) + TAG_BYTES
    assert host.counted[0] == ("12D3KooWalice", "echo", "in", request_bytes)
    assert host.counted[1] == ("12D3KooWalice", "echo", "out", 5 + len(body) + TAG_BYTES)
    dialer.close()


async def raw_connection(srv: DirectServer, ticket: Ticket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                                                    bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(MAGIC + ticket.token)
    await writer.drain()
    return reader, writer, await reader.readexactly(NONCE_BYTES)


async def test_an_altered_frame_and_a_replayed_one_are_refused_before_the_handler_runs(server):
    srv, host = server
    ticket = srv.ticket("12D3KooWbob", ["127.0.0.1"])
    reader, writer, nonce = await raw_connection(srv, ticket)
    conn = DirectConnection(reader, writer, ticket.key, nonce)
    good = b"".join(conn.request_frame("echo", b"pay 1 coin"))
    assert await exchange(conn, "echo", b"pay 1 coin") == (0, b"nioc 1 yap")

    # on a new connection (a new nonce) the same bytes do not verify: a replay
    reader2, writer2, _ = await raw_connection(srv, ticket)
    writer2.write(good)
    await writer2.drain()
    assert await closed_by_server(reader2)

    # one flipped byte of the body
    reader3, writer3, nonce3 = await raw_connection(srv, ticket)
    frame = bytearray(b"".join(DirectConnection(reader3, writer3, ticket.key, nonce3).request_frame("echo",
                                                                                                b"pay 1 coin")))
    frame[1 + 4 + 4 + 4] ^= 1
    writer3.write(bytes(frame))
    await writer3.drain()
    assert await closed_by_server(reader3)

    # a frame tagged with another key (a peer that did not get this ticket)
    reader4, writer4, nonce4 = await raw_connection(srv, ticket)
    writer4.write(b"".join(DirectConnection(reader4, writer4, b"k" * 32, nonce4).request_frame("echo", b"pay 9 coins")))
    await writer4.drain()
    assert await closed_by_server(reader4)
    assert [body for _, _, body in host.calls] == [b"pay 1 coin"]  # only the genuine frame was handled
    for w in (writer, writer2, writer3, writer4):
        w.close()


async def test_unknown_tickets_kinds_not_served_and_oversized_frames_close_the_connection(server):
    srv, host = server
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(MAGIC + b"\0" * 16)
    await writer.drain()
    assert await closed_by_server(reader)  # no nonce for a token it never gave out
    writer.close()

    ticket = srv.ticket("12D3KooWcarol", ["127.0.0.1"])
    srv.ticket("12D3KooWcarol", ["127.0.0.1"])  # asking again replaces the ticket: the old token is dead
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(MAGIC + ticket.token)
    await writer.drain()
    assert await closed_by_server(reader)
    writer.close()

    fresh = srv.ticket("12D3KooWcarol", ["127.0.0.1"])
    for kind, length in (("secrets", 10), ("echo", LIMIT + 1)):
        reader, writer, _ = await raw_connection(srv, fresh)
        writer.write(struct.pack(">B", len(kind)) + kind.encode() + struct.pack(">I", length))
        await writer.drain()
        assert await closed_by_server(reader)  # refused on its header, before any body is read
        writer.close()
    assert host.calls == []


async def test_a_ticket_opens_at_most_its_share_of_connections_and_a_closed_one_frees_its_place(server):
    """A peer holding sockets open against the server gets CONNECTIONS_PER_TICKET of them (a client pools 4 a
    peer), not more; another peer's ticket is not counted against it; one closed frees a place."""
    srv, host = server
    ticket, other = srv.ticket("12D3KooWdave", ["127.0.0.1"]), srv.ticket("12D3KooWerin", ["127.0.0.1"])
    held = [await raw_connection(srv, ticket) for _ in range(CONNECTIONS_PER_TICKET)]  # each got its nonce
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(MAGIC + ticket.token)
    await writer.drain()
    assert await closed_by_server(reader)  # one more on the same ticket: closed before a nonce
    writer.close()
    r, w, nonce = await raw_connection(srv, other)  # another peer's ticket still opens one
    assert await exchange(DirectConnection(r, w, other.key, nonce), "echo", b"hi") == (0, b"ih")
    held[0][1].close()
    deadline = asyncio.get_running_loop().time() + 10
    while True:  # poll: the server sees the close and frees the place
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(MAGIC + ticket.token)
        await writer.drain()
        try:
            nonce = await asyncio.wait_for(reader.readexactly(NONCE_BYTES), 5.0)
            break
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            assert asyncio.get_running_loop().time() < deadline, "the closed connection's place was never freed"
            await asyncio.sleep(0.05)
    assert await exchange(DirectConnection(reader, writer, ticket.key, nonce), "echo", b"back") == (0, b"kcab")
    for _, w_, _ in held[1:]:
        w_.close()
    w.close()
    writer.close()


async def test_a_peer_that_cannot_be_dialed_is_left_to_libp2p(server):
    srv, _ = server
    probe = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    dead_port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()

    async def ask(peer: str) -> bytes:
        return Ticket(b"t" * 16, b"k" * 32, dead_port, ["127.0.0.1"]).to_bytes()

    dialer = DirectDialer(ask, connect_timeout_s=2.0, retry_after_s=60.0)
    with pytest.raises(DirectRefused):
        await dialer.connection("12D3KooWdave")
    assert not await dialer.probe("12D3KooWdave")
    assert not dialer.reachable("12D3KooWdave")
    with pytest.raises(DirectRefused):  # no second dial while it is marked unreachable
        await dialer.connection("12D3KooWdave")

    async def no_ticket(peer: str) -> bytes:
        raise RuntimeError("this peer does not serve 'direct'")  # an older peer, or one with the channel off

    dialer = DirectDialer(no_ticket)
    assert not await dialer.probe("12D3KooWerin")
    assert not dialer.reachable("12D3KooWerin")


def test_dial_hosts_widest_scope_first_without_circuits_or_listen_addresses():
    maddrs = ["/ip4/127.0.0.1/tcp/4001", "/ip4/192.168.1.7/tcp/4001", "/ip4/0.0.0.0/tcp/4001",
              "/ip4/93.184.216.34/tcp/4001", "/ip4/198.51.100.1/tcp/4001/p2p/12D3KooWrelay/p2p-circuit",
              "/ip4/192.168.1.7/udp/4001/quic"]
    assert dial_hosts(maddrs) == ["93.184.216.34", "192.168.1.7", "127.0.0.1"]


@pytest.mark.e2e
async def test_a_transport_sends_large_frames_direct_small_ones_and_to_peers_without_it_over_libp2p():
    from hivemind.p2p import P2P

    from swarm.net.transport import REQUEST_OVERHEAD, Transport, TransportError

    local = ["/ip4/127.0.0.1/tcp/0"]
    daemons, transports, seen = [], [], []

    async def echo(body: bytes, peer: str) -> bytes:
        seen.append(peer)
        return body

    async def boom(body: bytes, peer: str) -> bytes:
        raise RuntimeError("the stage is on fire")

    def sent(t: Transport, peer: str, kind: str) -> int:
        return sum(c.bytes for c in t.counters() if (c.peer, c.kind, c.direction) == (peer, kind, "out"))

    try:
        daemons.append(await P2P.create(host_maddrs=local))
        first = [str(m) for m in await daemons[0].get_visible_maddrs()]
        for _ in range(2):
            daemons.append(await P2P.create(host_maddrs=local, initial_peers=first))
        server, client, plain = (Transport(p, "test", max_frame_bytes=4 << 20, timeout=20.0) for p in daemons)
        transports += [server, client, plain]
        await server.enable_direct()
        await client.enable_direct(min_bytes=64 << 10)
        for t in (server, plain):
            await t.serve("echo", echo)
        await server.serve("boom", boom)
        sid, cid, pid = (p.peer_id.to_base58() for p in daemons)

        big = bytes(range(256)) * 4096
        libp2p_frame = REQUEST_OVERHEAD + len(big)
        assert await client.request(sid, "echo", big) == big  # over libp2p while the peer is found out
        assert sent(client, sid, "echo") == libp2p_frame
        assert await client.direct_ready(sid)
        assert await client.request(sid, "echo", big) == big
        direct_frame = 1 + len("echo") + 4 + len(big) + TAG_BYTES
        assert sent(client, sid, "echo") == libp2p_frame + direct_frame  # the direct framing, not libp2p's
        assert server.bytes_received("echo") == libp2p_frame + direct_frame and seen == [cid, cid]
        assert await client.request(sid, "echo", b"hi") == b"hi"  # small: libp2p
        assert sent(client, sid, "echo") == libp2p_frame + direct_frame + REQUEST_OVERHEAD + 2
        with pytest.raises(TransportError) as info:
            await client.request(sid, "boom", big)
        assert info.value.reason == "remote" and "on fire" in str(info.value)
        assert await client.request(sid, "echo", big[::-1]) == big[::-1]  # the refusal left the channel working
        assert sent(client, sid, "echo") == libp2p_frame + 2 * direct_frame + REQUEST_OVERHEAD + 2

        for _ in range(2):  # `plain` has no direct channel: libp2p carries it, before the probe and after
            assert await client.request(pid, "echo", big) == big
            assert not await client.direct_ready(pid)
        assert sent(client, pid, "echo") == 2 * libp2p_frame
    finally:
        for t in transports:
            await t.close()
        for p in daemons:
            await p.shutdown()
