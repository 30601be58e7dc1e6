"""What peers say about themselves, and who reads it.

- `health.py`: signed `HealthRecord`s, one per peer per heartbeat, with their parsing rules.
- `peer_monitor.py`: `PeerMonitor`, what a running peer measures and publishes (and
  `/healthz`, TensorBoard).
- `healthz.py`: the `/healthz` HTTP endpoint for Docker and systemd.
- `status.py`: `swarm status`, a table of stages and peers.
- `coverage.py`: `uncovered_reason`, which stage pauses the swarm and why.
- `liveness.py`: `LivenessProbe`, whether a listed peer still answers (its records outlive it).
- `reader_ticket.py`: `ReaderTicket`, the identity and ticket with which status and the dashboard read a
  private swarm whose peers alone hold the run spec.
- `scalars.py`: `ScalarLog`, per-step scalars for TensorBoard.
The browser dashboard that reads the health records is `swarm/dashboard/`.
"""
