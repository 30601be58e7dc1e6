"""Why a stage holds the swarm up: one sentence for `swarm status` and the dashboard.

A stage is served when one of its peers that answers is announced online or paused (a paused
head still serves stage 0: it waits for another stage). With none, no step can run: the swarm is
paused. The reason names what the swarm waits for, so an operator knows whether to start a peer
or to wait for one that is getting the stage's state (a download from a replica, or a restore
from a snapshot that peers of other stages keep).
"""
from __future__ import annotations

SERVING = ("online", "paused")  # announced states of a peer that serves its stage
ARRIVING = ("joining", "syncing")  # a peer on its way: choosing, downloading or restoring


def uncovered_reason(stage: int, states: list[str]) -> str | None:
    """None if `stage` is served, given the announced states of its peers that answer; else why not."""
    if any(s in SERVING for s in states):
        return None
    if any(s in ARRIVING for s in states):
        return (f"stage {stage} has no live replica; a peer is getting its state (from a replica, or a snapshot "
                f"other peers keep): the swarm is paused until it serves")
    return f"stage {stage} has no live replica: the swarm is paused until a peer joins it"
