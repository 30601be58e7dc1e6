"""`swarm bench codecs`: bytes per token and encode/decode cost of each boundary codec.

For each model width d (k = d // 100 for subspace, b = d // 128 for bottleneck, bf16 wire,
vocab 32000 so token ids travel as uint16) one forward `ActivationMessage` of B x T tokens is
built and serialized for real: bytes per token are counted from the `encode_message` buffer,
header and token ids included, and compared with the dense codec at the same d.

Times are medians of `repeats` runs, per token, with all codecs of one d interleaved in each
repeat (side by side, so machine noise hits them alike):
  encode = boundary encoder forward + WirePacker.pack + encode_message
  decode = decode_message (with the receiver's validation) + unpack + boundary decoder forward
Writes codecs.json and codecs.png into out_dir, prints a table, returns the result dict.
smoke=True uses T=32, 3 repeats and only the widths up to 1024 (the 4096-wide T_fixed of a
32000-token vocab is a 1 GB float64 draw).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from protocol.codecs import WirePacker, make_decoder, make_encoder
from protocol.spec import CODECS, preset
from protocol.subspace import make_basis
from protocol.wire import ActivationMessage, Header, WireLimits, decode_message, encode_message, tokens_for_wire
from swarm.bench.common.machine import machine_info

VOCAB = 32000
B = 4


def _spec(codec: str, d: int, T: int):
    rank = max(1, d // 100) if codec == "subspace" else max(1, d // 128)
    return preset("tiny", codec=codec, d_model=d, n_heads=8, d_ff=2 * d, seq_len=T, vocab=VOCAB, rank=rank,
                  wire_dtype="bf16", microbatch_size=B, batch_size=B, dtype="fp32")


def _setup(codec: str, d: int, T: int, basis, tok: torch.Tensor, h: torch.Tensor) -> dict:
    spec = _spec(codec, d, T)
    basis = basis if codec == "subspace" else None
    enc, dec = make_encoder(spec, basis).eval(), make_decoder(spec, basis).eval()
    return dict(spec=spec, enc=enc, dec=dec, packer=WirePacker.for_spec(spec), lim=WireLimits.for_spec(spec),
                head=Header(spec.run_hash, 0, 0, 0, codec, 1), wire_tok=tokens_for_wire(tok, VOCAB),
                inp=tok[:, :-1], h=h)


def _encode(c: dict) -> bytes:
    z = c["enc"](c["h"], c["inp"])
    return encode_message(ActivationMessage(c["head"], c["wire_tok"], c["packer"].pack(z)))


def _decode(c: dict, buf: bytes) -> torch.Tensor:
    msg = decode_message(buf, c["lim"])
    z = c["packer"].unpack(msg.payload, torch.float32)
    return c["dec"](z, msg.tokens[:, :-1])


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def run_codecs_bench(out_dir: str, dims=(512, 1024, 4096), repeats: int = 20, smoke: bool = False) -> dict:
    T = 32 if smoke else 128
    if smoke:
        repeats = min(repeats, 3)
        dims = tuple(d for d in dims if d <= 1024) or tuple(dims[:1])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    rows = []
    with torch.no_grad():
        for d in dims:
            basis = make_basis(d, max(1, d // 100), VOCAB, seed=0, dtype=torch.float32)
            tok = torch.randint(0, VOCAB, (B, T + 1), generator=g)
            # an activation of the form T_fixed[tok] + (something in span(U)), as a stage emits
            c_in = torch.randn(B, T, basis.rank, generator=g)
            h = basis.T_fixed[tok[:, :-1]] + c_in @ basis.U.T
            cases = {c: _setup(c, d, T, basis, tok, h) for c in CODECS}
            for c in cases.values():  # warm-up, and the byte count
                c["bytes"] = len(_encode(c))
                _decode(c, _encode(c))
            times = {c: ([], []) for c in CODECS}
            for _ in range(repeats):
                for name, c in cases.items():
                    buf, te = _timed(_encode, c)
                    _, td = _timed(_decode, c, buf)
                    times[name][0].append(te)
                    times[name][1].append(td)
            dense_per_token = cases["dense"]["bytes"] / (B * T)
            for name, c in cases.items():
                per_token = c["bytes"] / (B * T)
                rows.append({"d": d, "codec": name, "width": c["spec"].boundary_width,
                             "bytes_per_message": c["bytes"], "bytes_per_token": per_token,
                             "ratio_vs_dense": dense_per_token / per_token,
                             "encode_us_per_token": 1e6 * statistics.median(times[name][0]) / (B * T),
                             "decode_us_per_token": 1e6 * statistics.median(times[name][1]) / (B * T)})
    result = {"B": B, "T": T, "vocab": VOCAB, "wire_dtype": "bf16", "repeats": repeats, "smoke": smoke,
              "torch_threads": torch.get_num_threads(), "devices": ["cpu"], "machine": machine_info(["cpu"]),
              "rows": rows,
              "ratios": {str(d): {r["codec"]: r["ratio_vs_dense"] for r in rows if r["d"] == d} for d in dims}}
    (out / "codecs.json").write_text(json.dumps(result, indent=1) + "\n")
    _print_table(rows)
    _plot(result, out / "codecs.png")
    return result


def _print_table(rows: list[dict]) -> None:
    print(f"{'d':>5} {'codec':>10} {'width':>5} {'B/token':>9} {'x dense':>8} {'enc us/tok':>10} {'dec us/tok':>10}")
    for r in rows:
        print(f"{r['d']:>5} {r['codec']:>10} {r['width']:>5} {r['bytes_per_token']:>9.2f} {r['ratio_vs_dense']:>8.1f} "
              f"{r['encode_us_per_token']:>10.3f} {r['decode_us_per_token']:>10.3f}")


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = sorted({r["d"] for r in result["rows"]})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.27
    for i, codec in enumerate(CODECS):
        sel = [next(r for r in result["rows"] if r["d"] == d and r["codec"] == codec) for d in dims]
        xs = [x + (i - 1) * width for x in range(len(dims))]
        ax1.bar(xs, [r["bytes_per_token"] for r in sel], width, label=codec)
        ax2.bar(xs, [r["encode_us_per_token"] + r["decode_us_per_token"] for r in sel], width, label=codec)
        for x, r in zip(xs, sel):
            if codec != "dense":
                ax1.annotate(f"{r['ratio_vs_dense']:.0f}x", (x, r["bytes_per_token"]), ha="center",
                             va="bottom", fontsize=8)
    for ax, label in ((ax1, "bytes / token on the wire (log)"), (ax2, "encode + decode, us / token")):
        ax.set_xticks(range(len(dims)), [f"d={d}" for d in dims])
        ax.set_ylabel(label)
        ax.legend()
    ax1.set_yscale("log")
    fig.suptitle(f"boundary codecs, bf16 wire, B={result['B']} T={result['T']}, vocab {result['vocab']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
