"""`swarm eval`: an exported model's loss and perplexity on held-out text.

loss = mean over predicted tokens of -log p(next token), in nats; perplexity = exp(loss).
By default the batches are `--batches` windows-of-microbatches spread evenly over the
validation split (`BatchSource.val_batches`, the run's seq_len and microbatch size, so the
same windows every time) of the corpus the run trained on, as its run spec records it
(`peer/data/run_corpus.py`; `--data` scores other text), or the prepared token folder it records
(`peer/data/run_tokens.py`; `--tokens` scores another folder of the run's tokenizer, `--data` text
encoded with the run's tokenizer, the one beside the export). With
`--train-step N` they are instead the head's training microbatches of step N (0-based: what a
swarm whose stages stand at step N trains on next, reported by the head as step N + 1), so the
result can be compared with the loss the tail reported for that step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from peer.data.batches import BatchSource
from peer.data.corpus import Corpus, load_corpus
from peer.data.run_corpus import check_corpus, run_corpus
from peer.data.run_tokens import check_data_flags, recorded_tokens, run_token_store
from protocol.model import lm_loss
from swarm.options import opt

from .load import LoadedModel, load_model


@dataclass
class EvalOptions:
    """What `swarm eval` can be told; each field is also its flag."""

    model: str = opt(None, "folder written by swarm export (native or hf)", metavar="DIR", required=True)
    data: str | None = opt(None, "text file or folder to score, encoded with the run's tokenizer (default: the "
                           "corpus the run trained on, as its "
                           "run spec records it: its path on the machine that started the run, checked by "
                           "sha256; the embedded corpus for a run that recorded none)", metavar="PATH")
    tokens: str | None = opt(None, "a folder made by `swarm data prepare` with the run's tokenizer to score (default: "
                             "the token folder the run trained on, if it recorded one)", metavar="DIR")
    batches: int = opt(16, "validation microbatches to average over")
    train_step: int | None = opt(None, "evaluate on the head's training microbatches of this (0-based) step "
                                 "instead of the validation split", metavar="N")
    wire_rounding: bool = opt(False, "round each boundary to the run's wire dtype, as the swarm did while "
                              "training (native exports only)")
    device: str = opt("cpu", "torch device, e.g. cuda")
    json: bool = opt(False, "print the result as JSON")


@dataclass
class EvalResult:
    loss: float  # nats per predicted token
    perplexity: float
    tokens: int
    batches: int
    source: str  # which batches: "validation split of CORPUS" or "training step N of CORPUS"
    run_hash: str
    step: int
    corpus: str = ""  # why that corpus: "--data", "the corpus this run trained on", or the embedded one


def batches_for(model: LoadedModel, data: str | None, n: int, train_step: int | None, tokens: str | None = None
                ) -> tuple[list, str, str]:
    """(batches, which batches, why that corpus): `tokens` or `data` if given, else the token folder or
    corpus the run spec records (`peer/data/run_tokens.py`, `peer/data/run_corpus.py`: refused if it is
    absent here or its hashes differ)."""
    check_data_flags(data, tokens)
    spec = model.meta.spec
    seq_len = min(spec.seq_len, model.max_len)
    store = None if data else run_token_store(spec, tokens, same_tokens=not tokens)
    if store is not None:
        corpus, origin = store, "--tokens" if tokens else "the token folder this run trained on"
    elif data and recorded_tokens(spec) is not None:  # text, encoded with the run's own (BPE) tokenizer
        corpus, origin = encoded_corpus(model, data, seq_len), "--data, encoded with the run's tokenizer"
    else:
        corpus, origin = run_corpus(spec, data, seq_len=seq_len)
        if not data:
            check_corpus(spec, corpus)
    src = BatchSource(corpus, seq_len, spec.microbatch_size, spec.data_seed)
    if train_step is not None:
        return ([src.microbatch(train_step, mb) for mb in range(spec.n_microbatches)],
                f"training step {train_step} of {corpus.name}", origin)
    if n < 1:
        raise ValueError("--batches must be at least 1.")
    return src.val_batches(n), f"validation split of {corpus.name}", origin


def encoded_corpus(model: LoadedModel, data: str, seq_len: int) -> Corpus:
    """The text of `data` (a file or folder, read as `load_corpus` reads it) encoded with the run's tokenizer,
    split as a corpus is (its last 5%, at least 4 windows, for validation). Meant for held-out text of a
    few MB: the whole text is encoded in memory (a large corpus is prepared with `swarm data prepare`)."""
    raw = load_corpus(data, seq_len=1)
    text = raw.tokens.numpy().tobytes().decode("utf-8", errors="replace")
    return Corpus(model.tokenizer.encode(text), raw.name, seq_len)


@torch.no_grad()
def loss_on(model: LoadedModel, batches: list[torch.Tensor]) -> tuple[float, int]:
    """(mean loss over every predicted token, number of tokens): each batch's mean `lm_loss`
    weighted by its tokens, as the tail computes it per microbatch."""
    total, count = 0.0, 0
    for b in batches:
        b = b.to(model.device)
        n = b[:, 1:].numel()
        total += float(lm_loss(model.logits(b[:, :-1]).float(), b[:, 1:])) * n
        count += n
    return total / count, count


def evaluate(model: LoadedModel, data: str | None = None, batches: int = 16, train_step: int | None = None,
             tokens: str | None = None) -> EvalResult:
    chosen, source, origin = batches_for(model, data, batches, train_step, tokens)
    loss, tokens = loss_on(model, chosen)
    return EvalResult(loss, math.exp(min(loss, 700.0)), tokens, len(chosen), source, model.meta.run_hash,
                      model.meta.step, origin)


def run_eval(opts: EvalOptions) -> EvalResult:
    check_data_flags(opts.data, opts.tokens)  # a usage error, before the model is read
    model = load_model(opts.model, opts.device, opts.wire_rounding)
    return evaluate(model, opts.data, opts.batches, opts.train_step, opts.tokens)


def describe(r: EvalResult) -> str:
    return (f"loss {r.loss:.4f} nats/token, perplexity {r.perplexity:.3f} over {r.tokens} tokens "
            f"({r.batches} microbatches, {r.source}: {r.corpus}); run {r.run_hash} at step {r.step}")
