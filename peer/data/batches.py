"""The data side of a head peer: deterministic microbatches of a corpus (the corpus itself, its
loading and its validation split: `peer/data/corpus.py`; tokenizers: `peer/data/tokenizer.py`, whose
`ByteTokenizer` is re-exported here; a prepared folder of token shards: `peer/data/token_store.py`).

A head peer (stage 0) feeds token windows into the pipeline. Everything here is built so
that *any* process can regenerate *exactly* the same microbatch from three integers
(seed, step, index) and the corpus, with no state carried between calls. That single
property is what lets several head peers split one step's microbatches between them
(`shard_indices`) without talking to each other, lets a restarted head resume at any
step, and lets a one-process reference run reproduce a multi-process swarm run token for
token (docs/design.md section 4, "bit-for-bit honest compression").

By default the tokenizer is byte level (vocabulary 256), so nothing is downloaded or trained; the
default corpus is CPython's own `pydoc_data.topics`, present wherever Python is
(docs/algorithms.md section 4). A `TokenStore` (any tokenizer, any size, read from disk a window at
a time) gives microbatches by the same rule: the same window starts for the same (seed, step,
index) and the same number of training tokens.
"""

from __future__ import annotations

import hashlib
import math
import operator

import torch

from .corpus import Corpus, DataError, nonneg_int, positive_int
from .token_store import TokenRange, TokenStore
from .tokenizer import BYTE_VOCAB_SIZE, ByteTokenizer

__all__ = [
    "BYTE_VOCAB_SIZE",
    "BatchSource",
    "ByteTokenizer",
    "shard_indices",
    "unigram_entropy_bits",
    "unigram_entropy_nats",
]

# -------------------------------------------------------------------------- batches


def _microbatch_seed(seed: int, step: int, index: int) -> int:
    """A 63-bit generator seed that depends on (seed, step, index) and nothing else.

    A cryptographic hash rather than arithmetic like seed*K+step: nearby triples must not
    give related Mersenne-Twister streams, and the mapping must be identical in every
    process and Python version (unlike hash(), which is salted for str).
    """
    key = f"microbatch:{seed}:{step}:{index}".encode("ascii")
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class BatchSource:
    """Deterministic microbatches of random corpus windows.

    `microbatch(step, index)` is a pure function of (seed, step, index) and the tokens:
    any process with the same corpus regenerates the same batch, which is how several
    head peers share a step and how a one-process reference replays a swarm run.

    `corpus_tokens` is either a `Corpus` (training windows come from its train split,
    validation windows from its val split, both split at this `seq_len`), a `TokenStore`
    (its manifest's train and validation split; windows read from disk, so memory stays at
    one microbatch) or a 1-D token tensor used for training, with optional `val_tokens` for
    `val_batches`.
    """

    def __init__(
        self,
        corpus_tokens: torch.Tensor | Corpus | TokenStore,
        seq_len: int,
        microbatch_size: int,
        seed: int,
        *,
        val_tokens: torch.Tensor | None = None,
    ) -> None:
        self.seq_len = positive_int("seq_len", seq_len)
        self.microbatch_size = positive_int("microbatch_size", microbatch_size)
        if isinstance(seed, bool):
            raise TypeError("seed must be an int, not bool")
        self.seed = operator.index(seed)
        if isinstance(corpus_tokens, (Corpus, TokenStore)):
            if val_tokens is not None:
                raise ValueError("val_tokens go with a tensor; a Corpus or TokenStore has its own val split")
            self.name = corpus_tokens.name
            train, val = (corpus_tokens.split(self.seq_len) if isinstance(corpus_tokens, Corpus)
                          else corpus_tokens.split())
        else:
            self.name = "tokens"
            train, val = corpus_tokens, val_tokens
        self._train = self._checked(train, "training")
        self._val = None if val is None else self._checked(val, "validation")

    def _checked(self, tokens: torch.Tensor | TokenRange, what: str) -> torch.Tensor | TokenRange:
        if not isinstance(tokens, TokenRange) and (not isinstance(tokens, torch.Tensor) or tokens.dim() != 1):
            raise DataError(f"{what} tokens must be a 1-D tensor")
        if tokens.numel() < self.window:
            raise DataError(
                f"{what} tokens ({tokens.numel()}) are too short for one window of "
                f"seq_len + 1 = {self.window}"
            )
        return tokens

    @property
    def window(self) -> int:
        """Tokens per row: seq_len inputs plus one, since targets are inputs shifted by one."""
        return self.seq_len + 1

    @property
    def tokens_per_microbatch(self) -> int:
        """Predicted (target) tokens in one microbatch, the unit loss is averaged over."""
        return self.microbatch_size * self.seq_len

    def microbatch(self, step: int, index: int) -> torch.Tensor:
        """Int64 tensor [microbatch_size, seq_len + 1] of corpus windows for (step, index).

        Window starts are drawn uniformly (with replacement) over the training split by a
        CPU generator seeded only from (seed, step, index).
        """
        step = nonneg_int("step", step)
        index = nonneg_int("index", index)
        gen = torch.Generator(device="cpu")
        gen.manual_seed(_microbatch_seed(self.seed, step, index))
        n_starts = self._train.numel() - self.window + 1
        starts = torch.randint(0, n_starts, (self.microbatch_size,), generator=gen)
        return self._gather(self._train, starts)

    def val_batches(self, n: int) -> list[torch.Tensor]:
        """`n` validation microbatches, each [microbatch_size, seq_len + 1] int64.

        Windows are evenly spaced over the validation split rather than random, so the
        val set is the same for every seed and every process and covers the whole split.
        """
        n = nonneg_int("n", n)
        if self._val is None:
            raise DataError("no validation tokens here; pass a Corpus or val_tokens")
        if n == 0:
            return []
        total = n * self.microbatch_size
        last_start = self._val.numel() - self.window
        starts = torch.linspace(0, last_start, total, dtype=torch.float64).round().long()
        return list(self._gather(self._val, starts).split(self.microbatch_size))

    def _gather(self, tokens: torch.Tensor | TokenRange, starts: torch.Tensor) -> torch.Tensor:
        if isinstance(tokens, TokenRange):
            return tokens.gather(starts, self.window)
        # unfold is a view of all windows; indexing copies only the rows we need and
        # widening to int64 happens last, on B*(T+1) tokens rather than the whole corpus.
        windows = tokens.unfold(0, self.window, 1)
        return windows[starts.to(tokens.device)].long()


def shard_indices(n_microbatches: int, n_heads: int, head_rank: int) -> list[int]:
    """The microbatch indices of each step that head peer `head_rank` drives.

    Round-robin (index % n_heads == head_rank): every index goes to exactly one head and
    the heads' loads differ by at most one microbatch.
    """
    n_microbatches = nonneg_int("n_microbatches", n_microbatches)
    n_heads = positive_int("n_heads", n_heads)
    if isinstance(head_rank, bool):
        raise TypeError("head_rank must be an int, not bool")
    head_rank = operator.index(head_rank)
    if not 0 <= head_rank < n_heads:
        raise ValueError(f"head_rank must be in [0, {n_heads}), got {head_rank}")
    return list(range(head_rank, n_microbatches, n_heads))


# ------------------------------------------------------------------------- entropy


def unigram_entropy_nats(tokens: torch.Tensor) -> float:
    """Entropy of the token-unigram distribution of `tokens`, in nats.

    This is the loss (cross-entropy, nats per token) of the best model that ignores
    context, so a trained model's loss should fall well below it.
    """
    if not isinstance(tokens, torch.Tensor) or tokens.numel() == 0:
        raise ValueError("unigram entropy needs a non-empty token tensor")
    flat = tokens.reshape(-1).long()
    if int(flat.min()) < 0:
        raise ValueError("token ids must be non-negative")
    counts = torch.bincount(flat).to(torch.float64)
    p = counts[counts > 0] / flat.numel()
    # max(): a one-symbol corpus would otherwise report -0.0.
    return max(0.0, float(-(p * p.log()).sum()))


def unigram_entropy_bits(tokens: torch.Tensor) -> float:
    """Entropy of the token-unigram distribution of `tokens`, in bits."""
    return unigram_entropy_nats(tokens) / math.log(2.0)
