"""What heads train on: the corpus, its tokens, and deterministic microbatches.

- `corpus.py`: `load_corpus` (embedded, stdlib, a file or folder), `Corpus` and its validation split,
  `DataError`.
- `batches.py`: the byte tokenizer, `BatchSource` (microbatches by seed and step), head shards.
- `run_corpus.py`: the corpus a run trains on (path and sha256) in its run spec.
"""
from .batches import BatchSource, ByteTokenizer
from .corpus import Corpus, DataError, load_corpus

__all__ = ["BatchSource", "ByteTokenizer", "Corpus", "DataError", "load_corpus"]
