"""Preparing text for a run from the command line: `swarm tokenizer train` (a byte-level BPE for a
corpus) and `swarm data prepare` (a corpus tokenized into shards with a manifest). The work itself is
in `peer/data/` (tokenizer.py, sources.py, shards.py); `cli.py` holds the flags and handlers.
`tokenizer_fetch.py`: the run's tokenizer over the transport (served by every peer that holds it,
fetched by a peer whose token folder lacks it)."""
