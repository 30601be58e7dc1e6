"""`swarm bench transport`: how many bytes per second one peer's messages can move, and where the
cap is (issue 22 item 2: "find what caps unshaped dense; transport copies, framing, p2pd throughput").

Three ways to move the same frames between two endpoints on this machine's loopback, interleaved
over --repeats rounds (a noisy machine hits each alike), per frame size:

- `tcp`: a raw asyncio TCP connection (length prefix, body, 2-byte ack): what the kernel and Python's
  streams cost, the ceiling of anything built on them;
- `p2p`: one hivemind/libp2p stream per frame between two `p2pd` daemons, the same framing, no
  transport of ours: what the daemons (Noise encryption, yamux, their Unix sockets) cost;
- `transport`: our `Transport.request` over those daemons (swarm/net/transport.py): what our framing,
  checks and reply add; `transport x2`: the same while the other side sends as much back at once
  (a pipeline's activations one way and gradients the other go through the same two daemons);
- `direct`, `direct x2`: the same `Transport.request` with its direct channel on (swarm/net/direct.py): the
  frames go over a plain TCP connection beside the daemons, each with a keyed BLAKE3 tag;
- `transport 2p`, `direct 2p`: both ways at once as in `x2`, but each endpoint in its own process, as two
  peers of a swarm are (in the cases above one Python thread does both peers' work, which the daemons,
  separate processes, are spared).

Per case: MB/s (one direction), and the ratio to `tcp`. Then, for each preset and codec at --dtype, the
tokens/s that the `transport x2` (and the `direct x2`) rate (at the measured frame size nearest one
microbatch's message) carries between two stages at the boundary's bytes per token each way: the cap that
the daemons (or the direct channel) put on an unshaped swarm of two stages even where the link is as fast as loopback.

Writes transport.json and transport.png into --out.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
import time
from pathlib import Path

from protocol.spec import preset
from swarm.bench.common.machine import machine_info

SIZES_MB = (1, 4, 16)
CASES = ("tcp", "p2p", "transport", "transport x2", "direct", "direct x2", "transport 2p", "direct 2p")
BOTH_WAYS = ("transport x2", "direct x2", "transport 2p", "direct 2p")
LOCAL = ["/ip4/127.0.0.1/tcp/0"]
PROTO = "/subspace-swarm-bench/transport/1.0"


async def _send_framed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> None:
    writer.write(len(body).to_bytes(8, "big"))
    writer.write(body)
    await writer.drain()
    await reader.readexactly(2)


async def _serve_framed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            n = int.from_bytes(await reader.readexactly(8), "big")
            await reader.readexactly(n)
            writer.write(b"ok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _tcp(body: bytes, frames: int) -> float:
    served: list[asyncio.Task] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(asyncio.current_task())
        await _serve_framed(reader, writer)
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        t = time.perf_counter()
        for _ in range(frames):
            await _send_framed(reader, writer, body)
        return time.perf_counter() - t
    finally:
        writer.close()
        await asyncio.wait(served, timeout=10)  # the server side sees the close and ends
        server.close()


async def _daemons():
    from hivemind.p2p import P2P
    a = await P2P.create(host_maddrs=LOCAL)
    b = await P2P.create(initial_peers=[str(m) for m in await a.get_visible_maddrs()], host_maddrs=LOCAL)
    return a, b


async def _p2p(body: bytes, frames: int) -> float:
    a, b = await _daemons()
    try:
        await a.add_binary_stream_handler(PROTO, lambda info, r, w: _serve_framed(r, w))
        _, reader, writer = await b.call_binary_stream_handler(a.peer_id, PROTO)  # the connection, not the rate
        await _send_framed(reader, writer, b"warm-up")
        writer.close()
        t = time.perf_counter()
        for _ in range(frames):  # one stream per frame, as Transport opens one per request
            _, reader, writer = await b.call_binary_stream_handler(a.peer_id, PROTO)
            await _send_framed(reader, writer, body)
            writer.close()
        return time.perf_counter() - t
    finally:
        await b.shutdown()
        await a.shutdown()


async def _transport(body: bytes, frames: int, both_ways: bool, direct: bool = False) -> float:
    from swarm.net.transport import Transport
    a, b = await _daemons()
    ta, tb = (Transport(p, "bench", max_frame_bytes=len(body) + (1 << 20)) for p in (a, b))

    async def ack(_body: bytes, _peer: str) -> bytes:
        return b"ok"
    try:
        for t in (ta, tb):
            if direct:
                await t.enable_direct("127.0.0.1", min_bytes=len(body))
            await t.serve("frame", ack)
        for src, dst in ((tb, a), (ta, b)):  # the connections (and direct tickets), not the rate
            await src.request(dst.peer_id.to_base58(), "frame", b"warm-up")
            assert await src.direct_ready(dst.peer_id.to_base58()) == direct

        async def send(src: Transport, dst) -> None:
            for _ in range(frames):
                await src.request(dst.peer_id.to_base58(), "frame", body, timeout=300)
        t = time.perf_counter()
        await asyncio.gather(send(tb, a), *([send(ta, b)] if both_ways else []))
        return time.perf_counter() - t
    finally:
        for t in (ta, tb):
            await t.close()
        await b.shutdown()
        await a.shutdown()


async def _endpoint(p2p, direct: bool, body_bytes: int):
    from swarm.net.transport import Transport
    t = Transport(p2p, "bench", max_frame_bytes=body_bytes + (1 << 20))
    if direct:
        await t.enable_direct("127.0.0.1", min_bytes=body_bytes)

    async def ack(_body: bytes, _peer: str) -> bytes:
        return b"ok"
    await t.serve("frame", ack)
    return t


async def _send_all(t, peer: str, body: bytes, frames: int) -> float:
    start = time.perf_counter()
    for _ in range(frames):
        await t.request(peer, "frame", body, timeout=300)
    return time.perf_counter() - start


def _other_process(maddrs: list[str], body_bytes: int, frames: int, direct: bool, out, go, done) -> None:
    """The second peer of a `2p` case: serves, sends `frames` to the first once told, reports its seconds."""
    from hivemind.p2p import P2P

    async def main() -> None:
        p2p = await P2P.create(initial_peers=maddrs, host_maddrs=LOCAL)
        t = await _endpoint(p2p, direct, body_bytes)
        body = os.urandom(body_bytes)
        first = maddrs[0].rsplit("/p2p/", 1)[1]
        try:
            await t.request(first, "frame", b"warm-up")  # the connection (and direct ticket), not the rate
            assert await t.direct_ready(first) == direct
            out.put(p2p.peer_id.to_base58())
            await asyncio.to_thread(go.wait)
            out.put(await _send_all(t, first, body, frames))
            await asyncio.to_thread(done.wait)
        finally:
            await t.close()
            await p2p.shutdown()
    asyncio.run(main())


def _from_child(out, child, seconds: float):
    """The child's next report; an error at once if it died (its traceback is on stderr)."""
    import queue
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return out.get(True, 0.5)
        except queue.Empty:
            if not child.is_alive():
                raise RuntimeError(f"the bench's second process ended (exit code {child.exitcode})") from None
    raise TimeoutError(f"the bench's second process sent nothing within {seconds:g} s")


async def _two_processes(body: bytes, frames: int, direct: bool) -> float:
    """Seconds until both peers, one per process, have each sent `frames` to the other."""
    import multiprocessing

    from hivemind.p2p import P2P
    ctx = multiprocessing.get_context("spawn")
    out, go, done = ctx.Queue(), ctx.Event(), ctx.Event()
    a = await P2P.create(host_maddrs=LOCAL)
    ta = await _endpoint(a, direct, len(body))
    child = ctx.Process(target=_other_process, args=([str(m) for m in await a.get_visible_maddrs()], len(body),
                                                     frames, direct, out, go, done))
    child.start()
    try:
        other = await asyncio.to_thread(_from_child, out, child, 120)
        await ta.request(other, "frame", b"warm-up")  # the connection (and direct ticket), not the rate
        assert await ta.direct_ready(other) == direct
        go.set()
        mine = await _send_all(ta, other, body, frames)
        return max(mine, await asyncio.to_thread(_from_child, out, child, 300))
    finally:
        done.set()
        await asyncio.to_thread(child.join, 60)
        if child.is_alive():
            child.terminate()
        await ta.close()
        await a.shutdown()


async def _one(case: str, body: bytes, frames: int) -> float:
    """MB/s one direction carried."""
    if case.endswith(" 2p"):
        seconds = await _two_processes(body, frames, direct=case.startswith("direct"))
    elif case == "tcp":
        seconds = await _tcp(body, frames)
    elif case == "p2p":
        seconds = await _p2p(body, frames)
    else:
        seconds = await _transport(body, frames, both_ways=case.endswith("x2"), direct=case.startswith("direct"))
    return len(body) * frames / seconds / 1e6


def boundary_bytes_per_token(preset_name: str, codec: str, dtype: str) -> float:
    """One boundary's numbers per token on the wire, in bytes (width x bytes per number; the gradient back
    is the same size; token ids and framing, a few bytes, left out)."""
    from protocol.codecs import WirePacker
    spec = preset(preset_name, codec=codec, dtype=dtype)
    return spec.boundary_width * WirePacker.for_spec(spec).bytes_per_number()


def _cap(summary: list[dict], preset_name: str, codec: str, dtype: str, case: str = "transport x2") -> dict:
    """tokens/s = (`case`'s both-ways MB/s at the measured frame size nearest a microbatch's message) / bytes per
    token."""
    spec = preset(preset_name, codec=codec, dtype=dtype)
    per_token = boundary_bytes_per_token(preset_name, codec, dtype)
    message_mb = spec.microbatch_size * spec.seq_len * per_token / (1 << 20)
    rows = [r for r in summary if r["case"] == case]
    row = min(rows, key=lambda r: abs(math.log(r["frame_mb"] / max(message_mb, 1e-9))))
    return {"preset": preset_name, "codec": codec, "dtype": dtype, "case": case, "bytes_per_token": per_token,
            "message_mb": message_mb, "frame_mb_used": row["frame_mb"],
            "tokens_per_second_cap": row["mb_per_s"] * 1e6 / per_token}


def run_transport_bench(out_dir: str, sizes_mb: tuple[int, ...] = SIZES_MB, megabytes: int = 192, repeats: int = 3,
                        presets: tuple[str, ...] = ("small", "large"), dtype: str = "bf16",
                        smoke: bool = False) -> dict:
    if smoke:
        sizes_mb, megabytes, repeats, presets = (1,), 4, 1, ("small",)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for round_ in range(repeats):
        for size in sizes_mb:
            body = os.urandom(size << 20)
            frames = max(2, megabytes // size)
            for case in CASES:
                rate = asyncio.run(_one(case, body, frames))
                runs.append({"round": round_, "case": case, "frame_mb": size, "frames": frames, "mb_per_s": rate})
                print(f"round {round_ + 1}/{repeats}, {size} MB frames, {case}: {rate:.0f} MB/s", flush=True)
    summary = []
    for size in sizes_mb:
        tcp = statistics.median(r["mb_per_s"] for r in runs if r["frame_mb"] == size and r["case"] == "tcp")
        for case in CASES:
            rate = statistics.median(r["mb_per_s"] for r in runs if r["frame_mb"] == size and r["case"] == case)
            summary.append({"case": case, "frame_mb": size, "mb_per_s": rate, "ratio_to_tcp": rate / tcp})
    caps = [_cap(summary, p, c, dtype, case) for case in BOTH_WAYS for p in presets
            for c in ("dense", "subspace", "bottleneck")]
    for c in caps:
        print(f"{c['preset']} {c['codec']}: {c['bytes_per_token']:.0f} B/token each way, {c['message_mb']:.2f} MB "
              f"a microbatch -> at most {c['tokens_per_second_cap']:,.0f} tokens/s between two stages "
              f"({c['case']} rate at {c['frame_mb_used']} MB frames)", flush=True)
    result = {"devices": ["cpu"], "machine": machine_info(["cpu"]), "megabytes": megabytes, "repeats": repeats,
              "runs": runs, "summary": summary, "caps": caps}
    (out / "transport.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out / "transport.png")
    return result


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["frame_mb"] for r in result["summary"]})
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(CASES)
    for i, case in enumerate(CASES):
        rates = [next(r["mb_per_s"] for r in result["summary"] if r["case"] == case and r["frame_mb"] == s)
                 for s in sizes]
        ax.bar([j + i * width for j in range(len(sizes))], rates, width, label=case)
    ax.set_xticks([j + width * (len(CASES) - 1) / 2 for j in range(len(sizes))], [f"{s} MB frames" for s in sizes])
    ax.set_ylabel("MB/s, one direction")
    ax.legend(fontsize=8)
    m = result["machine"]
    ax.set_title(f"loopback: raw TCP vs libp2p daemons vs our Transport, over p2pd and direct "
                 f"({m.get('description', '?')})", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
