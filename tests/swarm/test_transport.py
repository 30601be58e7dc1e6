"""Transport over two real p2pd daemons on 127.0.0.1: framing, counters, refusals, recovery."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

import pytest
from hivemind.p2p import P2P, PeerID

from swarm.net.home_link import HomeLink
from swarm.net.transport import REPLY_OVERHEAD, REQUEST_OVERHEAD, Transport, TransportError

LOCAL = ["/ip4/127.0.0.1/tcp/0"]
SERVER_LIMIT = 2 << 20
pytestmark = pytest.mark.e2e  # every test here runs over two real p2pd daemons


@dataclass
class Pair:
    server_p2p: P2P
    client_p2p: P2P
    server: Transport
    client: Transport

    @property
    def server_id(self) -> str:
        return self.server_p2p.peer_id.to_base58()

    @property
    def client_id(self) -> str:
        return self.client_p2p.peer_id.to_base58()


async def echo(body: bytes, peer: str) -> bytes:
    return body


async def boom(body: bytes, peer: str) -> bytes:
    raise RuntimeError("the stage is on fire")


@pytest.fixture
async def pair():
    daemons: list[P2P] = []
    transports: list[Transport] = []
    release = asyncio.Event()

    async def stall(body: bytes, peer: str) -> bytes:
        await release.wait()
        return b"late"

    try:
        server_p2p = await P2P.create(host_maddrs=LOCAL)
        daemons.append(server_p2p)
        maddrs = [str(m) for m in await server_p2p.get_visible_maddrs()]
        client_p2p = await P2P.create(initial_peers=maddrs, host_maddrs=LOCAL)
        daemons.append(client_p2p)
        server = Transport(server_p2p, "test", max_frame_bytes=SERVER_LIMIT, timeout=5.0)
        client = Transport(client_p2p, "test", max_frame_bytes=8 << 20, timeout=10.0)
        transports += [server, client]
        await server.serve("echo", echo)
        await server.serve("boom", boom)
        await server.serve("stall", stall)
        yield Pair(server_p2p, client_p2p, server, client)
    finally:
        release.set()
        for transport in transports:
            await transport.close()
        for p2p in daemons:
            await p2p.shutdown()


async def assert_still_serving(pair: Pair) -> None:
    assert await pair.client.request(pair.server_id, "echo", b"still here") == b"still here"


def counter(transport: Transport, peer: str, kind: str, direction: str):
    (match,) = [c for c in transport.counters() if (c.peer, c.kind, c.direction) == (peer, kind, direction)]
    return match


async def test_echo_one_mebibyte_and_exact_counters(pair):
    body = bytes(range(256)) * 4096
    assert len(body) == 1 << 20
    assert await pair.client.request(pair.server_id, "echo", body) == body

    request_wire, reply_wire = len(body) + REQUEST_OVERHEAD, len(body) + REPLY_OVERHEAD
    assert (REQUEST_OVERHEAD, REPLY_OVERHEAD) == (4, 5)
    assert counter(pair.client, pair.server_id, "echo", "out").bytes == request_wire
    assert counter(pair.client, pair.server_id, "echo", "in").bytes == reply_wire
    assert counter(pair.server, pair.client_id, "echo", "in").bytes == request_wire
    assert counter(pair.server, pair.client_id, "echo", "out").bytes == reply_wire
    assert all(c.messages == 1 for c in pair.client.counters() + pair.server.counters())
    assert pair.client.bytes_sent() == pair.server.bytes_received("echo") == request_wire
    assert pair.client.bytes_received("echo") == pair.server.bytes_sent() == reply_wire
    assert pair.client.bytes_sent("boom") == 0


async def test_empty_body_round_trip(pair):
    assert await pair.client.request(pair.server_id, "echo", b"") == b""
    assert pair.client.bytes_sent() == REQUEST_OVERHEAD
    assert pair.client.bytes_received() == REPLY_OVERHEAD


async def test_handler_exception_is_a_transport_error(pair):
    with pytest.raises(TransportError) as info:
        await pair.client.request(pair.server_id, "boom", b"x")
    err = info.value
    assert (err.kind, err.peer, err.reason) == ("boom", pair.server_id, "remote")
    assert "the stage is on fire" in str(err)
    await assert_still_serving(pair)


async def test_timeout_is_a_transport_error(pair):
    with pytest.raises(TransportError) as info:
        await pair.client.request(pair.server_id, "stall", b"x", timeout=0.5)
    assert info.value.reason == "timeout" and "0.5 s" in str(info.value)
    await assert_still_serving(pair)


async def test_unknown_peer_and_unknown_kind(pair):
    ghost = await P2P.create(host_maddrs=LOCAL)
    ghost_id = ghost.peer_id.to_base58()
    await ghost.shutdown()
    with pytest.raises(TransportError) as info:
        await pair.client.request(ghost_id, "echo", b"x", timeout=10.0)
    assert info.value.peer == ghost_id and info.value.reason in ("connection", "timeout")
    with pytest.raises(TransportError) as info:
        await pair.client.request("not-a-peer-id!", "echo", b"x")
    assert info.value.reason == "connection"
    with pytest.raises(TransportError) as info:
        await pair.client.request(pair.server_id, "nobody-serves-this", b"x")
    assert info.value.reason == "connection"
    await assert_still_serving(pair)


async def raw_exchange(pair: Pair, payload: bytes, *, eof: bool, proto: str | None = None) -> bytes:
    """Write raw bytes on a fresh stream; return the reply frame, or b"" if the stream closed."""
    proto = proto or pair.client.protocol_id("echo")
    _, reader, writer = await pair.client_p2p.call_binary_stream_handler(PeerID.from_base58(pair.server_id), proto)
    try:
        writer.write(payload)
        await writer.drain()
        if eof:
            writer.write_eof()  # p2pd turns this into a reset of the whole stream
        try:
            header = await asyncio.wait_for(reader.readexactly(REPLY_OVERHEAD), 10.0)
            (length,) = struct.unpack(">I", header[1:])
            return header + await asyncio.wait_for(reader.readexactly(length), 10.0)
        except (asyncio.IncompleteReadError, ConnectionError):
            return b""
    finally:
        writer.close()


def parse_error_reply(raw: bytes) -> str:
    assert len(raw) >= REPLY_OVERHEAD, f"no reply frame came back (got {raw!r})"
    status, length = struct.unpack(">BI", raw[:REPLY_OVERHEAD])
    assert status == 1 and len(raw) == REPLY_OVERHEAD + length, raw
    return raw[REPLY_OVERHEAD:].decode()


async def test_garbage_gets_an_error_reply(pair):
    raw = await raw_exchange(pair, b"\xde\xad\xbe\xef garbage garbage", eof=False)
    assert "over the limit" in parse_error_reply(raw)
    await assert_still_serving(pair)


@pytest.mark.parametrize("payload", [b"\x00\x00", b"\x00\x00\x00\x10abc"])
async def test_truncated_frame_gets_an_error_reply_or_close(pair, payload):
    raw = await raw_exchange(pair, payload, eof=True)
    if raw:  # the stream allowed a reply: it must be a well-formed refusal
        assert "ended" in parse_error_reply(raw) or "truncated" in parse_error_reply(raw)
    await assert_still_serving(pair)


async def test_oversized_frame_is_refused_before_its_body_is_read(pair):
    # Only the header is sent and the stream stays open: a reply can only come if the server
    # refused from the header alone instead of waiting for 10 MiB that will never arrive.
    raw = await raw_exchange(pair, struct.pack(">I", 10 << 20), eof=False)
    assert parse_error_reply(raw) == f"frame of {10 << 20} bytes is over the limit of {SERVER_LIMIT}."
    assert counter(pair.server, pair.client_id, "echo", "in").bytes == REQUEST_OVERHEAD
    await assert_still_serving(pair)


async def test_oversized_request_through_the_api(pair):
    with pytest.raises(TransportError) as info:  # the client's own limit, checked before sending
        await pair.client.request(pair.server_id, "echo", bytes(9 << 20))
    assert info.value.reason == "limit"
    with pytest.raises(TransportError) as info:  # under the client's limit, over the server's
        await pair.client.request(pair.server_id, "echo", bytes(3 << 20))
    assert info.value.reason == "remote"
    assert str(info.value).endswith(f"frame of {3 << 20} bytes is over the limit of {SERVER_LIMIT}.")
    await assert_still_serving(pair)


async def test_stalled_sender_is_refused_after_the_server_timeout(pair):
    impatient = Transport(pair.server_p2p, "impatient", timeout=0.5)
    await impatient.serve("echo", echo)
    try:
        raw = await raw_exchange(pair, b"\x00\x00\x00\x10abc", eof=False, proto=impatient.protocol_id("echo"))
        assert parse_error_reply(raw) == "the request was not received within 0.5 s."
    finally:
        await impatient.close()
    await assert_still_serving(pair)


class RecordingLink(HomeLink):
    """A HomeLink that also records every frame the transport passes through it."""

    def __init__(self, bandwidth: str | None, latency: str = "0") -> None:
        link = HomeLink.from_strings(bandwidth, latency)
        super().__init__(link.uplink, link.downlink)
        self.frames: list[tuple[str, int]] = []

    async def send(self, nbytes: int, on_sent=None) -> None:
        self.frames.append(("send", nbytes))
        await super().send(nbytes, on_sent)

    async def receive(self, nbytes: int) -> None:
        self.frames.append(("receive", nbytes))
        await super().receive(nbytes)


async def test_every_frame_in_and_out_goes_through_the_peers_one_link(pair):
    client_link, server_link = RecordingLink(None), RecordingLink(None)
    client = Transport(pair.client_p2p, "linked", link=client_link)
    server = Transport(pair.server_p2p, "linked", link=server_link)
    await server.serve("echo", echo)
    try:
        await client.request(pair.server_id, "echo", b"q" * 1000)
        await client.request(pair.server_id, "echo", b"r" * 10)
    finally:
        await client.close()
        await server.close()
    request, reply = 1000 + REQUEST_OVERHEAD, 1000 + REPLY_OVERHEAD
    small_request, small_reply = 10 + REQUEST_OVERHEAD, 10 + REPLY_OVERHEAD
    assert client_link.frames == [("send", request), ("receive", reply), ("send", small_request),
                                  ("receive", small_reply)]
    assert server_link.frames == [("receive", request), ("send", reply), ("receive", small_request),
                                  ("send", small_reply)]
    on_line, acks = client_link.packets.on_line, client_link.packets.acks
    assert client_link.stats()["uplink_bytes"] == on_line(request) + on_line(small_request) + acks(reply) \
        + acks(small_reply)


async def test_concurrent_requests_and_shaping(pair):
    link = RecordingLink("8mbit", "50ms")
    shaped = Transport(pair.client_p2p, "test", link=link)
    bodies = [bytes([i]) * 100_000 for i in range(4)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    replies = await asyncio.gather(*(shaped.request(pair.server_id, "echo", b) for b in bodies))
    elapsed = loop.time() - start
    assert replies == bodies
    # 4 x 100 kB at 1 MB/s queue on the one uplink: >= 0.4 s of serialization plus 50 ms latency,
    # and the 4 replies then queue on the one downlink behind each other.
    assert elapsed >= 0.4 + 0.05 - 0.01
    # line bytes at 1 MB/s: the four request frames in packets, and the acknowledgements of the replies
    packets = link.packets
    line = 4 * packets.on_line(100_000 + REQUEST_OVERHEAD) + 4 * packets.acks(100_000 + REPLY_OVERHEAD)
    assert link.uplink.busy_s == pytest.approx(line / 1e6)
    assert sorted(n for d, n in link.frames if d == "receive") == [100_000 + REPLY_OVERHEAD] * 4
    await shaped.close()


async def test_close_removes_handlers_and_ends_inflight(pair):
    pending = asyncio.create_task(pair.client.request(pair.server_id, "stall", b"x", timeout=10))
    await asyncio.sleep(0.3)
    await pair.server.close()
    with pytest.raises(TransportError):
        await pending
    with pytest.raises(TransportError) as info:
        await pair.client.request(pair.server_id, "echo", b"x", timeout=5)
    assert info.value.reason in ("connection", "remote")
    assert not pair.server._inflight
    with pytest.raises(ValueError):
        pair.client.protocol_id("bad/kind")


@pytest.mark.parametrize("ordered", [True, False])
async def test_ordered_frames_leave_one_at_a_time_and_arrive_in_turn(pair, ordered):
    """4 x 200 kB at 8 Mbit/s (0.2 s each): in turn, the first arrives after ~0.2 s and the others
    follow; sharing the uplink, all four arrive together after ~0.8 s (swarm/net/send_order.py)."""
    loop = asyncio.get_running_loop()
    arrivals: list[tuple[float, int]] = []

    async def note(body: bytes, peer: str) -> bytes:
        arrivals.append((loop.time(), body[0]))
        return b""

    server = Transport(pair.server_p2p, "order")
    client = Transport(pair.client_p2p, "order", link=HomeLink.from_strings("8mbit"),
                       ordered_kinds=("mb",) if ordered else ())
    await server.serve("mb", note)
    try:
        start = loop.time()
        await asyncio.gather(*(client.request(pair.server_id, "mb", bytes([i]) * 200_000) for i in range(4)))
    finally:
        await client.close()
        await server.close()
    first, last = arrivals[0][0] - start, arrivals[-1][0] - start
    assert last >= 0.8 - 0.01  # 800 kB through a 1 MB/s uplink either way
    if ordered:
        assert [i for _, i in arrivals] == [0, 1, 2, 3]
        assert first < 0.5 * last, (first, last)  # ~0.2 s against ~0.8 s
        assert client.send_order.rate == pytest.approx(1e6, rel=0.2)  # the link's rate, as the turns measured it
    else:
        assert first > 0.8 * last, (first, last)  # ~0.8 s each: the pipeline could not start early


async def test_on_a_link_whose_departures_are_unseen_a_link_bound_frame_holds_its_turn_until_its_reply(pair):
    """No shaper says when the last byte left (a real link: p2pd buffers the frame), so an ordered frame
    holds its turn until its reply while it is measured to be longer on the wire than 4 round trips;
    a shorter one is let go once written (swarm/net/send_order.py)."""
    loop = asyncio.get_running_loop()
    arrived: list[int] = []
    first_reply = asyncio.Event()

    async def note(body: bytes, peer: str) -> bytes:
        arrived.append(body[0])
        if body[0] == 0:
            await first_reply.wait()
        return b""

    async def until(condition, what: str) -> None:
        deadline = loop.time() + 10
        while not condition():
            assert loop.time() < deadline, what
            await asyncio.sleep(0.01)

    server = Transport(pair.server_p2p, "held")
    client = Transport(pair.client_p2p, "held", ordered_kinds=("mb",))
    await server.serve("mb", note)
    try:
        # nothing measured yet: frame 0 holds the turn while its reply is withheld, frame 1 waits in line
        sends = [asyncio.create_task(client.request(pair.server_id, "mb", bytes([i]) * 50_000)) for i in range(2)]
        await until(lambda: arrived == [0] and client.send_order.queued == 1, "frame 0 in, frame 1 in line")
        first_reply.set()
        await asyncio.wait_for(asyncio.gather(*sends), 10)
        assert arrived == [0, 1] and client.send_order.wire_rate is not None
        # measured as shorter on the wire than 4 round trips: the next frames go out without waiting for replies
        client.send_order.wire_rate, client.send_order.rtt = 1e12, 0.05
        first_reply.clear()
        arrived.clear()
        sends = [asyncio.create_task(client.request(pair.server_id, "mb", bytes([i]) * 50_000)) for i in range(2)]
        await until(lambda: sorted(arrived) == [0, 1], "frame 1 in while frame 0's reply is withheld")
        first_reply.set()
        await asyncio.wait_for(asyncio.gather(*sends), 10)
    finally:
        first_reply.set()
        await client.close()
        await server.close()


async def test_a_traced_request_leaves_its_timeline_on_both_peers(pair, tmp_path):
    """`Transport.trace` (swarm peer --trace-frames): the client's request is queued, takes its turn, is
    sent, its reply arrives and is read, in that order; the server's trace has the request's arrival (its
    bytes with framing, and the downlink's wait) and its answer. A second 400 kB request shares the server's
    8 Mbit/s downlink with the first: the trace shows that wait."""
    from swarm.net.frame_trace import FrameTrace, read_trace
    pair.client.trace, pair.server.trace = FrameTrace(tmp_path / "c.jsonl"), FrameTrace(tmp_path / "s.jsonl")
    body = b"x" * 400_000
    assert await pair.client.request(pair.server_id, "echo", body) == body
    pair.server.link = HomeLink.from_strings(None, downlink="8mbit", packets=None)  # the server's 1 MB/s downlink
    await asyncio.gather(*(pair.client.request(pair.server_id, "echo", body) for _ in range(2)))
    pair.client.trace.close()
    pair.server.trace.close()
    client, server = read_trace(tmp_path / "c.jsonl"), read_trace(tmp_path / "s.jsonl")
    first = [e for e in client if e.kind == "echo"][:5]
    assert [e.event for e in first] == ["queued", "turn", "sent", "arrived", "reply"]
    assert all(e.peer == pair.server_id for e in first) and first[0].bytes == len(body)
    assert first[2].bytes == len(body) + REQUEST_OVERHEAD and first[3].bytes == len(body) + REPLY_OVERHEAD
    assert [e.t for e in first] == sorted(e.t for e in first)
    arrived = [e for e in server if e.event == "arrived" and e.kind == "echo"]
    answered = [e for e in server if e.event == "answered" and e.kind == "echo"]
    assert len(arrived) == len(answered) == 3 and all(e.peer == pair.client_id for e in arrived)
    assert arrived[0].bytes == len(body) + REQUEST_OVERHEAD and answered[0].bytes == len(body)
    # the two at once: one of them waited for the other's 0.4 s on the downlink (unshaped first: no wait)
    assert arrived[0].wait < 0.05 and max(e.wait for e in arrived[1:]) >= 0.2
    # each request's events share its number (the reply's arrival too); what arrived at the server has none
    mine = [e for e in client if e.kind == "echo"]
    assert sorted({e.frame for e in mine}) == [1, 2, 3] and all(e.frame is None for e in server)
    assert all(sorted(e.event for e in mine if e.frame == n) == sorted(first_events := [e.event for e in first])
               for n in (1, 2, 3)), first_events
    from swarm.net.trace_report import peer_times
    figures = peer_times("server", server)
    assert figures.requests_in == 3 and figures.downlink_wait_max_s == max(e.wait for e in arrived)
    [echo] = peer_times("client", client).kinds
    assert echo.requests == 3 and echo.bytes_out == 3 * (len(body) + REQUEST_OVERHEAD)
    assert echo.reply.max >= 0.2  # a reply waited for the server's downlink
