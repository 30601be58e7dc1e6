"""The asyncio service around a runner, and the messages it sends and takes.

- `interfaces.py`: the seam to the network (`MessageLink`, `Signer`, `PeerDirectory`, `PeerStatus`,
  `LinkError`); `loopback.py`: all in memory, so that daemons are tested in one process (still as bytes,
  signed with a real Ed25519 key per peer).
- `daemon.py`: `StageDaemon` (steps and attempts, admission, the worker thread); `inbound.py` (what
  it does with an activation, a gradient, a basis update); `microbatch_forward.py` (a microbatch's
  deadline and re-send); `delivery.py` (`Courier`, outbound messages); `norm_band.py`; `basis_gate.py`.
- `boundary_log.py`: an attempt's boundary messages, sent and received (what spot checks read).
- `transfer_time.py`: deadlines that grow with the bytes; `step_log.py`: `StepLog`, `AttemptFailed`.
"""
from .daemon import StageDaemon
from .interfaces import LinkError, MessageLink, PeerDirectory, PeerStatus
from .loopback import LoopbackDirectory, LoopbackLink, LoopbackNetwork
from .step_log import AttemptFailed, StepLog

__all__ = ["AttemptFailed", "LinkError", "LoopbackDirectory", "LoopbackLink", "LoopbackNetwork", "MessageLink",
           "PeerDirectory", "PeerStatus", "StageDaemon", "StepLog"]
