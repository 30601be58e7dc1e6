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
  (a pipeline's activations one way and gradients the other go through the same two daemons).

Per case: MB/s (one direction), and the ratio to `tcp`. Then, for each preset and codec at --dtype, the
tokens/s that the `transport x2` rate (at the measured frame size nearest one microbatch's message)
carries between two stages at the boundary's bytes per token each way: the cap that the daemons put on
an unshaped swarm of two stages even where the link is as fast as loopback.

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

from .machine import machine_info

SIZES_MB = (1, 4, 16)
CASES = ("tcp", "p2p", "transport", "transport x2")
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


async def _transport(body: bytes, frames: int, both_ways: bool) -> float:
    from swarm.net.transport import Transport
    a, b = await _daemons()
    ta, tb = (Transport(p, "bench", max_frame_bytes=len(body) + (1 << 20)) for p in (a, b))

    async def ack(_body: bytes, _peer: str) -> bytes:
        return b"ok"
    try:
        for t in (ta, tb):
            await t.serve("frame", ack)
        await tb.request(a.peer_id.to_base58(), "frame", b"warm-up")  # the connection, not the rate

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


async def _one(case: str, body: bytes, frames: int) -> float:
    """MB/s one direction carried."""
    if case == "tcp":
        seconds = await _tcp(body, frames)
    elif case == "p2p":
        seconds = await _p2p(body, frames)
    else:
        seconds = await _transport(body, frames, both_ways=case == "transport x2")
    return len(body) * frames / seconds / 1e6


def boundary_bytes_per_token(preset_name: str, codec: str, dtype: str) -> float:
    """One boundary's numbers per token on the wire, in bytes (width x bytes per number; the gradient back
    is the same size; token ids and framing, a few bytes, left out)."""
    from protocol.codecs import WirePacker
    spec = preset(preset_name, codec=codec, dtype=dtype)
    return spec.boundary_width * WirePacker.for_spec(spec).bytes_per_number()


def _cap(summary: list[dict], preset_name: str, codec: str, dtype: str) -> dict:
    """tokens/s = (both-ways MB/s at the measured frame size nearest a microbatch's message) / bytes per token."""
    spec = preset(preset_name, codec=codec, dtype=dtype)
    per_token = boundary_bytes_per_token(preset_name, codec, dtype)
    message_mb = spec.microbatch_size * spec.seq_len * per_token / (1 << 20)
    rows = [r for r in summary if r["case"] == "transport x2"]
    row = min(rows, key=lambda r: abs(math.log(r["frame_mb"] / max(message_mb, 1e-9))))
    return {"preset": preset_name, "codec": codec, "dtype": dtype, "bytes_per_token": per_token,
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
    caps = [_cap(summary, p, c, dtype) for p in presets for c in ("dense", "subspace", "bottleneck")]
    for c in caps:
        print(f"{c['preset']} {c['codec']}: {c['bytes_per_token']:.0f} B/token each way, {c['message_mb']:.2f} MB "
              f"a microbatch -> at most {c['tokens_per_second_cap']:,.0f} tokens/s between two stages "
              f"(both-ways rate at {c['frame_mb_used']} MB frames)", flush=True)
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
    ax.set_title(f"loopback: raw TCP vs libp2p daemons vs our Transport ({m.get('description', '?')})", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
