"""Issue 53 item 4, fidelity at a real vocabulary: the gap to dense of the subspace codec and the hybrid (16x, and
~100x) when the model reads BPE tokens instead of bytes. Same setting as docs/fidelity.md 3i/3n (`small`, the gpu
plan's 3-3-2 shape, d=512, 1000 steps = 8.19M tokens; the stdlib + torch sources corpus that does not repeat,
built on the device by gap_corpus.py's `build_corpus`), except the tokens: a byte-level BPE of VOCAB tokens is
trained on that corpus there (`peer.data.tokenizer.train_bpe`), the corpus is prepared into token shards
(`peer.data.shards.prepare`) and every job reads its microbatches and held-out windows from them (`TokenStore`).
8.19M BPE tokens are ~30 MB of that corpus's text, so no job sees a token window twice.

Usage: vocab_gap.py OUT PER_DEVICE BUDGET_S STEPS SEEDS NAMES VOCAB   (NAMES from gap_corpus.py's VARIANTS)
"""
import json
import os
import sys
import time
from pathlib import Path

from gap_corpus import build_corpus, corpus_jobs

import swarm.bench.fidelity.train as train
from peer.data.shards import prepare
from peer.data.token_store import TokenStore
from peer.data.tokenizer import train_bpe
from swarm.bench.fidelity import bench as fidelity

_load_corpus = train.load_corpus


def _token_folder_or_corpus(data, seq_len):
    """The fidelity jobs read a prepared token folder through the same BatchSource a head uses."""
    if data and (Path(data) / "manifest.json").exists():
        return TokenStore(data)
    return _load_corpus(data, seq_len=seq_len)


train.load_corpus = _token_folder_or_corpus  # here and in every spawned worker (they import this file again)


def main(argv: list[str]) -> None:
    out, per_device, budget, steps = Path(argv[1]), int(argv[2]), float(argv[3]), int(argv[4])
    seeds, names, vocab = [int(s) for s in argv[5].split(",")], argv[6].split(","), int(argv[7])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    text = build_corpus(out)
    tok_path, folder = out / f"bpe{vocab}.json", Path(f"/tmp/vocab_gap_tokens{vocab}")
    tok = train_bpe(str(text), vocab, tok_path)
    t1 = time.time()
    manifest = prepare(str(text), str(tok_path), folder, progress=False)
    store = TokenStore(folder)
    info = {"vocab": vocab, "tokenizer_sha256": manifest.tokenizer_sha256, "train_tokens": store.train_tokens,
            "val_tokens": store.val_tokens, "bytes_per_token": (text.stat().st_size / (store.train_tokens
                                                                                     + store.val_tokens)),
            "train_bpe_s": round(t1 - t0, 1), "prepare_s": round(time.time() - t1, 1), "vocab_size": tok.vocab_size}
    (out / "tokens.json").write_text(json.dumps(info, indent=1) + "\n")
    print("tokens:", info, flush=True)
    jobs = corpus_jobs(steps, seeds, names)
    for job in jobs:
        job.spec = job.spec.replace(vocab=manifest.vocab_size)
        job.group = f"vocab{vocab}-" + job.group
    fidelity.jobs_for = lambda plan, groups, best=None: jobs
    device = os.environ.get("DEVICE", "cuda")
    fidelity.run_fidelity_bench(str(out), plan="gpu", device=device, parallel=1, per_device=per_device,
                                budget_s=budget, groups=tuple(sorted({j.group for j in jobs})), data=str(folder),
                                resume=True)


if __name__ == "__main__":
    main(sys.argv)
