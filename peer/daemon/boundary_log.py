"""`BoundaryLog`: the boundary messages of the attempt in progress, kept so that a replica's
share of the step can be recomputed by another (issue 21, protocol/spot_check.py).

Received: the body of every activation and gradient this peer accepted for a microbatch (the
inputs of its share: what a checker asks for). Sent: who got each message this peer sent and a
digest of its bytes (what the leader learns from the senders, reported in reduce replies), and who
sent each activation and gradient it received, with the sender's signature of it (kinds "r" and "q",
protocol/boundary_sig.py: what the leader learns of a head's output from stage 1, and the evidence that
settles a sender's word against its receiver's, peer/checks/spot_checks.py). A head
(stage 0) also keeps the activations it sent: with the gradients, what a checker of its share
recomputes and compares (its input, the tokens, the checker regenerates). Only the step in
progress is kept: a few compressed boundary tensors per microbatch.
"""
from __future__ import annotations

from protocol.spot_check import Sent, digest
from protocol.wire import KIND_ACTIVATION, KIND_GRADIENT


class BoundaryLog:
    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None  # (step, attempt) held
        self._received: dict[tuple[str, int], bytes] = {}  # (kind, microbatch) -> body
        self._sent: dict[tuple[str, int], Sent] = {}
        self._outgoing: dict[int, bytes] = {}  # microbatch -> digest of the activation on its way down
        self._output: dict[int, bytes] = {}  # a head's: microbatch -> the activation body it sent

    def _at(self, step: int, attempt: int) -> bool:
        """Hold (step, attempt), dropping an older one; False for a message of an older attempt."""
        key = (step, attempt)
        if self._key is None or key > self._key:
            self._key = key
            self._received, self._sent, self._outgoing, self._output = {}, {}, {}, {}
        return key == self._key

    def received(self, step: int, attempt: int, kind: str, microbatch: int, body: bytes,
                 sender: str | None = None, sig: bytes = b"", said: bytes | None = None) -> None:
        """An input accepted; its `sender` is reported with its signature `sig` (kind "r": an activation,
        "q": a gradient; `said`: the body's digest, if the caller has it)."""
        if self._at(step, attempt):
            self._received[(kind, microbatch)] = bytes(body)
            if sender is not None:
                got = "r" if kind == KIND_ACTIVATION else "q"
                self._sent[(got, microbatch)] = Sent(got, microbatch, sender, said or digest(body), bytes(sig))

    def sending(self, step: int, attempt: int, microbatch: int, body: bytes, keep: bool = False) -> bytes:
        """An activation goes downstream; whom it went to is known once its gradient is accepted
        (`keep`: a head keeps the body, for a checker of its share). Returns the body's digest, which its
        signature names too (one sha256 of the message per send, however many replicas it is sent to)."""
        said = digest(body)
        if self._at(step, attempt):
            self._outgoing[microbatch] = said
            if keep:
                self._output[microbatch] = bytes(body)
        return said

    def answered(self, step: int, attempt: int, microbatch: int, by: str) -> None:
        """`by` returned the gradient of the activation this peer sent it: it took that activation."""
        if self._at(step, attempt) and microbatch in self._outgoing:
            self._sent[("a", microbatch)] = Sent("a", microbatch, by, self._outgoing[microbatch])

    def sent_gradient(self, step: int, attempt: int, microbatch: int, to: str, said: bytes) -> None:
        """A gradient went upstream to `to`; `said`: its body's digest (the one its signature names)."""
        if self._at(step, attempt):
            self._sent[("g", microbatch)] = Sent("g", microbatch, to, said)

    def sent(self, step: int, attempt: int) -> list[Sent]:
        return list(self._sent.values()) if self._key == (step, attempt) else []

    def inputs(self, step: int, attempt: int, microbatches: list[int], gradients: bool,
               head: bool = False) -> list[tuple[bytes, bytes | None]] | None:
        """The (activation, gradient) bodies of `microbatches`, or None if any is not held here
        (`gradients` False: the last stage, whose inputs are activations only; `head`: stage 0,
        whose "activation" is the one it SENT, its input being the tokens)."""
        if self._key != (step, attempt):
            return None
        out = []
        for mb in microbatches:
            act = self._output.get(mb) if head else self._received.get((KIND_ACTIVATION, mb))
            grad = self._received.get((KIND_GRADIENT, mb)) if gradients else None
            if act is None or gradients and grad is None:
                return None
            out.append((act, grad))
        return out
