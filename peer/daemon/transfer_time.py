"""How long a peer waits for bytes on a home uplink: a fixed allowance for everything but the
bytes, plus the bytes' time on the slowest uplink the swarm still waits for. Used for a reduce's
phases (`peer/commit/reduce_exchange.py`), a spot check's inputs (`peer/checks/share_check.py`), forwarded sums
(`peer/commit/follow_forward.py`), and the leading head's `StepDeadlines`: its first step (which has no
measured time to scale from), the heads' shares, its check and reduce commands (`peer/step/driver.py`).

    wait(n) = base_s + 8 n / floor_bps

A fixed reduce timeout cannot serve both ends: 60 s is an age for `tiny`, and too short for one
exact contribution of `large` (a few hundred MB: minutes on an 80 Mbit/s home uplink), so an
exact reduce over home links (the exact warm-up of a powersgd run included) failed every attempt.
The floor is also the bound that keeps a slow or hostile replica from holding a reduce for ever
(a slowloris): one whose bytes come slower than the floor is cut at its deadline and the step is
re-driven without it. `n` is what this replica's one uplink must carry for the phase (its
contribution to every other replica); the others' contributions are the same size and come over
their own uplinks at the same time, so the same wait covers them.
"""
from __future__ import annotations

from dataclasses import dataclass

from peer.runner.memory_estimate import estimate_stage
from protocol.codecs import WirePacker
from protocol.spec import SLOWEST_UPLINK_BPS, RunSpec

PING_BASE_S = 2.0  # what a status ping may take on an idle link

# how a reason for cutting a replica says that it was only slow (peer/commit/reduce_watch.py): its owner is told so
# (swarm/replicas/replica.py), not that its work was false
TOO_SLOW = "slower than the swarm's slowest uplink"


@dataclass(frozen=True)
class TransferWait:
    base_s: float  # what a message of no size may take: the peers' compute, queues, retries
    floor_bps: float = SLOWEST_UPLINK_BPS  # the slowest uplink waited for, bits per second (a swarm's: its spec's)

    def __post_init__(self) -> None:
        if not self.floor_bps > 0:
            raise ValueError(f"the slowest uplink must be a positive rate, not {self.floor_bps!r} bit/s.")

    def seconds(self, nbytes: int) -> float:
        """How long `nbytes` through one uplink may take: base_s + 8 nbytes / floor_bps."""
        return self.base_s + 8.0 * max(0, nbytes) / self.floor_bps


def boundary_bytes(spec: RunSpec) -> int:
    """One microbatch's boundary tensor on the wire (an activation, or its gradient): B T w bytes per
    number, the framing left out."""
    return spec.microbatch_size * spec.seq_len * spec.boundary_width * WirePacker.for_spec(spec).bytes_per_number()


def step_boundary_bytes(spec: RunSpec, microbatches: int | None = None) -> int:
    """What the busiest uplink carries in one step: a middle stage's, every microbatch's activation on
    and gradient back (0 with one stage: nothing crosses a boundary)."""
    n = spec.n_microbatches if microbatches is None else microbatches
    return 2 * n * boundary_bytes(spec) if spec.n_stages > 1 else 0


class StepDeadlines:
    """A leading head's deadlines for the parts of a step that carry bulk bytes (`peer/step/driver.py`)."""

    def __init__(self, spec: RunSpec, first_timeout: float, command_timeout: float) -> None:
        busiest, floor_bps = step_boundary_bytes(spec), spec.slowest_uplink_bps
        self.spec = spec
        # the first step has nothing measured to scale from: without its bytes, dense `large` below ~40 Mbit/s
        # would be re-driven for ever
        self.first_step = TransferWait(first_timeout, floor_bps).seconds(busiest)
        # a head's share of a step, and a spot check (it fetches a share's activations and gradients)
        self.share = TransferWait(command_timeout, floor_bps).seconds(busiest)
        self._command = TransferWait(command_timeout, floor_bps)
        # a status ping's reply (`AttemptWatch`) may wait behind one boundary frame on the peer's busy uplink (its
        # activations and gradients leave one at a time, swarm/net/send_order.py): at 8 Mbit/s a microbatch of dense
        # `large` is 17 s there, and a 2 s ping would call a healthy peer dead and re-drive the step for ever
        self.ping = TransferWait(PING_BASE_S, floor_bps).seconds(boundary_bytes(spec) if spec.n_stages > 1 else 0)
        elem = 8 if spec.dtype == "fp64" else 4  # parameters x this bounds a stage's flat gradient
        self._exact_bytes = [estimate_stage(spec, s).params * elem for s in range(spec.n_stages)]

    def reduce(self, step: int, stage: int, replicas: int) -> float:
        """How long a replica of `stage` may take to reply to step `step`'s reduce command: its exact
        contribution to every other replica through its uplink (powersgd's factors are small)."""
        exact = replicas > 1 and not self.spec.powersgd_at(step)
        return self._command.seconds(self._exact_bytes[stage] * (replicas - 1) if exact else 0)
