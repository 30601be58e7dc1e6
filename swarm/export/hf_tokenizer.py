"""The run's tokenizer as files transformers loads: a BPE run's own `tokenizer.json`, or the byte
tokenizer (token id = UTF-8 byte value) made into one.

The `tokenizers` library's byte-level pre-tokenizer turns every byte into one printable
character: bytes 33-126, 161-172 and 174-255 stand for themselves, the other 68 bytes for
chr(256), chr(257), ... in increasing byte order. A BPE model with no merges whose
vocabulary maps the character of byte b to id b then encodes text to exactly the ids of
`peer.data.batches.ByteTokenizer`, and the byte-level decoder turns them back into text.
"""
from __future__ import annotations

import json

from peer.data.tokenizer import BpeTokenizer, Tokenizer

from .safetensors_io import MISSING

VISIBLE_BYTES = [*range(33, 127), *range(161, 173), *range(174, 256)]


def byte_characters() -> dict[int, str]:
    """byte value -> the character that stands for it after byte-level pre-tokenization."""
    chars = {b: chr(b) for b in VISIBLE_BYTES}
    others = [b for b in range(256) if b not in chars]
    chars.update({b: chr(256 + n) for n, b in enumerate(others)})
    return chars


def byte_tokenizer():
    """A `tokenizers.Tokenizer` that encodes text to its UTF-8 bytes as ids."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    except ImportError as e:
        raise ImportError(MISSING.format(what="the Hugging Face export", package="tokenizers")) from e
    vocab = {ch: b for b, ch in byte_characters().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def eos_token(tok: BpeTokenizer) -> str | None:
    """The text of a BPE's end-of-text token, or None."""
    if tok.eos_id is None:
        return None
    return tok._tok.id_to_token(tok.eos_id)


def hf_tokenizer_files(max_len: int, tokenizer: Tokenizer | None = None) -> dict[str, bytes]:
    """{file name: bytes} of the tokenizer files a Hugging Face folder holds: the byte tokenizer above, or
    a BPE run's own `tokenizer.json` byte for byte (so its sha256 stays the one the run spec pins), with
    its end-of-text token named in `tokenizer_config.json` and `special_tokens_map.json`."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
              "clean_up_tokenization_spaces": False}
    if not isinstance(tokenizer, BpeTokenizer):
        return {"tokenizer.json": (byte_tokenizer().to_str(pretty=True) + "\n").encode(),
                "tokenizer_config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()}
    special = {"eos_token": eos_token(tokenizer)} if tokenizer.eos_id is not None else {}
    return {"tokenizer.json": tokenizer.data,
            "tokenizer_config.json": (json.dumps({**config, **special}, indent=2, sort_keys=True) + "\n").encode(),
            "special_tokens_map.json": (json.dumps(special, indent=2, sort_keys=True) + "\n").encode()}

