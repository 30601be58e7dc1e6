"""A corpus given as `--data` must be text: files that are not are refused with their names.

The byte tokenizer trains on any bytes, so an image or a tarball given by mistake (or lying
among the .txt files of a folder) would be trained on without a word. A file counts as text
when at most `MAX_BAD_SHARE` of its first `SAMPLE_BYTES` are NUL bytes or bytes that are not
valid UTF-8; `--data-binary-ok` says the user means it and skips the check.
"""
from __future__ import annotations

from pathlib import Path

from peer.data.corpus import CORPUS_SUFFIXES, STDLIB_CORPUS_NAME

SAMPLE_BYTES = 1 << 20  # enough to tell text from binary without reading a large corpus whole
MAX_BAD_SHARE = 0.01  # a few stray bytes (a Latin-1 name, a BOM gone wrong) still make a text file


def bad_share(data: bytes) -> float:
    """The share of `data` that is NUL or not valid UTF-8 (a multi-byte character cut at the end counts as valid)."""
    if not data:
        return 0.0
    text = data.decode("utf-8", errors="replace")
    if text.endswith("\ufffd"):  # the sample may cut a character in two
        text = data[:-3].decode("utf-8", errors="replace") if len(data) > 3 else text
    return (text.count("\ufffd") + text.count("\x00")) / len(data)


def binary_files(path: str) -> list[str]:
    """The files of corpus `path` (a file, or a folder's *.txt, *.md and *.py, as `load_corpus` reads them)
    that are not text; [] for the embedded and stdlib corpora, and for a path that does not exist
    (`load_corpus` says so)."""
    p = Path(path)
    if path == STDLIB_CORPUS_NAME and not p.exists():
        return []
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in CORPUS_SUFFIXES)
    elif p.is_file():
        files = [p]
    else:
        return []
    out = []
    for f in files:
        try:
            with open(f, "rb") as fh:
                sample = fh.read(SAMPLE_BYTES)
        except OSError:
            continue  # `load_corpus` names a file it cannot read
        if bad_share(sample) > MAX_BAD_SHARE:
            out.append(str(f))
    return out


def check_text(path: str | None, binary_ok: bool) -> None:
    """ValueError (one sentence, naming the files) when corpus `path` holds files that are not text."""
    if path is None or binary_ok:
        return
    bad = binary_files(path)
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ValueError(f"--data {path} holds {'a file' if len(bad) == 1 else f'{len(bad)} files'} that "
                         f"{'is' if len(bad) == 1 else 'are'} not text (not UTF-8): {shown}; remove "
                         f"{'it' if len(bad) == 1 else 'them'}, or pass --data-binary-ok to train on the bytes anyway.")
