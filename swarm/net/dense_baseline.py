"""`dense_bytes_per_token`: the bytes a dense boundary would put on the wire per token, the baseline that a run's
compression is reported against (the metrics of `swarm local`, swarm/local_reports.py; the dashboard)."""
from __future__ import annotations

import torch

from protocol.codecs import WirePacker
from protocol.spec import RunSpec
from protocol.wire import KIND_ACTIVATION, ActivationMessage, Header, encode_message, tokens_for_wire

from .framing import framing_bytes


def dense_bytes_per_token(spec: RunSpec) -> float:
    """Bytes per token a dense boundary would put on the wire: a real dense message, framed and acked (over the
    direct channel where it is that large, as between the peers of a local swarm)."""
    dense = spec.with_codec("dense", quant="none")
    B, T = spec.microbatch_size, spec.seq_len
    tokens = torch.zeros(B, T + 1, dtype=torch.long)
    msg = ActivationMessage(Header(dense.run_hash, 0, 0, 0, "dense", 1), tokens_for_wire(tokens, spec.vocab),
                            WirePacker.for_spec(dense).pack(torch.zeros(B, T, spec.d_model)))
    body = len(encode_message(msg))
    return (body + framing_bytes(KIND_ACTIVATION, body)) / (B * T)
