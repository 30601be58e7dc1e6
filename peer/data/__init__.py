"""What heads train on: the corpus, its tokens, and deterministic microbatches.

- `corpus.py`: `load_corpus` (embedded, stdlib, a file or folder), `Corpus` and its validation split,
  `DataError`.
- `batches.py`: `BatchSource` (microbatches by seed and step, from a corpus or a token store), head shards.
- `run_corpus.py`: the corpus a run trains on (path and sha256) in its run spec; `run_tokens.py`: the same for
  a prepared token folder (path, manifest and tokenizer hashes), which also sets the spec's vocab.
- `tokenizer.py`: the tokenizer interface, `ByteTokenizer`, `BpeTokenizer` (a tokenizer.json), `load_tokenizer`,
  `train_bpe`.
- `sources.py`: text, jsonl and parquet sources read as a bounded stream of pieces.
- `shards.py`: `prepare`, a source tokenized into resumable shards; `manifest.py`: their manifest.json.
- `token_store.py`: `TokenStore`, a prepared folder checked and read a window at a time.
- `run_tokenizer.py`: the run's tokenizer as its spec pins it (sha256), found on this machine and loaded;
  `tokenizer_share.py`: it served to and fetched from other peers in chunks, the hash checked.
"""
from .batches import BatchSource, ByteTokenizer
from .corpus import Corpus, DataError, load_corpus

__all__ = ["BatchSource", "ByteTokenizer", "Corpus", "DataError", "load_corpus"]
