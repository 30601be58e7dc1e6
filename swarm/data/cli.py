"""The `swarm tokenizer` and `swarm data` subcommands: flags and handlers (`register` adds them to the
`swarm` parser). A user error raises `DataError`, a `ValueError`, which `swarm/cli.py`'s `main`
prints as one `error:` line with exit code 2."""
from __future__ import annotations

import argparse

from peer.data.shards import DEFAULT_SHARD_TOKENS, MAX_DEFAULT_VAL_TOKENS, prepare
from peer.data.tokenizer import load_tokenizer, train_bpe

__all__ = ["register"]

DEFAULT_VOCAB = 32768
DEFAULT_TOKENIZER_FILE = "tokenizer.json"


def cmd_tokenizer_train(a: argparse.Namespace) -> int:
    tok = train_bpe(a.data, a.vocab, a.out, progress=not a.quiet)
    short = f" (the text allowed only {tok.vocab_size} of the {a.vocab} asked)" if tok.vocab_size < a.vocab else ""
    print(f"wrote {a.out}: byte-level BPE, vocabulary {tok.vocab_size}{short}, end-of-text id {tok.eos_id}, "
          f"sha256 {tok.sha256}")
    return 0


def cmd_data_prepare(a: argparse.Namespace) -> int:
    tok = load_tokenizer(a.tokenizer)
    m = prepare(a.data, tok, a.out, shard_tokens=a.shard_tokens, val_tokens=a.val_tokens, progress=not a.quiet)
    print(f"prepared {a.out}: {m.total_tokens} tokens of {m.documents} documents in {len(m.shards)} {m.dtype} "
          f"shards, the last {m.val_tokens} for validation; manifest_sha256 {m.manifest_sha256}")
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _nonneg(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    """Add `swarm tokenizer train` and `swarm data prepare` to the `swarm` parser's subcommands."""
    tk = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer on a corpus",
                        description="Tokenizers for `swarm data prepare`.")
    tsub = tk.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    tr = tsub.add_parser("train", help="train a byte-level BPE on a corpus and write its tokenizer.json",
                         description="Train a byte-level BPE (Hugging Face tokenizers format, with an "
                         "<|endoftext|> token) on the text of --data and write it to --out. The same text and "
                         "--vocab give the same file byte for byte.")
    tr.add_argument("--data", required=True, metavar="PATH",
                    help="a text, .jsonl (a 'text' field a line) or .parquet (a 'text' column) file, or a folder "
                    "of them (default: none, required)")
    tr.add_argument("--vocab", type=_positive, default=DEFAULT_VOCAB, metavar="N",
                    help=f"vocabulary size, the 256 bytes and <|endoftext|> included (default: {DEFAULT_VOCAB})")
    tr.add_argument("--out", default=DEFAULT_TOKENIZER_FILE, metavar="FILE",
                    help=f"where to write the tokenizer (default: {DEFAULT_TOKENIZER_FILE})")
    tr.add_argument("--quiet", action="store_true", help="no progress bar (default: off)")
    tr.set_defaults(func=cmd_tokenizer_train)

    da = sub.add_parser("data", help="tokenize a corpus into shards a run can train on",
                        description="Prepare text for a run.")
    dsub = da.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    pr = dsub.add_parser("prepare", help="tokenize a corpus into shards with a manifest.json",
                         description="Tokenize --data with --tokenizer into shards of raw uint16 (uint32 for a "
                         "vocabulary over 65,536) token ids in --out, documents separated by the end-of-text token "
                         "(a newline for bytes), and write manifest.json last; its manifest_sha256 names the "
                         "tokens. Interrupted, the same command continues after the last finished shard.")
    pr.add_argument("--data", required=True, metavar="PATH",
                    help="a text, .jsonl (a 'text' field a line) or .parquet (a 'text' column) file, or a folder "
                    "of them (default: none, required)")
    pr.add_argument("--tokenizer", default="byte", metavar="FILE|byte",
                    help="a tokenizer.json (swarm tokenizer train) or 'byte' (default: byte)")
    pr.add_argument("--out", required=True, metavar="DIR",
                    help="folder for the shards and manifest, new or empty unless resuming (default: none, "
                    "required)")
    pr.add_argument("--shard-tokens", type=_positive, default=DEFAULT_SHARD_TOKENS, metavar="N",
                    help=f"tokens per shard (default: {DEFAULT_SHARD_TOKENS})")
    pr.add_argument("--val-tokens", type=_nonneg, default=None, metavar="N",
                    help=f"tokens at the end held out for validation (default: 5%% of the tokens, at most "
                    f"{MAX_DEFAULT_VAL_TOKENS})")
    pr.add_argument("--quiet", action="store_true", help="no progress bar (default: off)")
    pr.set_defaults(func=cmd_data_prepare)
