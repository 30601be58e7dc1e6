"""Who the leading head names in each stage's reduce (issue 57: what a fielded id costs is its seat there).

Every replica of a reduce group sends its whole contribution to every other member, so a seat costs the
stage's replicas an upload each, and ids are free (5,000 Ed25519 ids take 0.3 s). So a stage's group is
drawn from work, never from announcements:

1. the replicas that did the attempt's work for the stage, as the leader's data flow attests it
   (`attested`): stage 0's are the heads the leader gave shares to (peer/step/head_work.py); a replica of
   stage s+1 did microbatch m if the replica attested for m at stage s reports that it answered m's
   activation (its `BoundaryLog`'s "a" entry: it returned m's gradient), read with a status command.
   Only attested replicas are asked, so an id that did no work is neither named nor asked anything;
   a replica that lies about whom it sent to can name at most one id per microbatch it did.
2. then, while seats are left, the stage's replicas that did work in the last `IDLE_STEPS` steps, the
   most recent first (`ReduceGroups`): a replica the routers left idle for a step reduces an empty
   contribution and stays in step instead of falling behind.

`MAX_GROUP` seats a stage at most, the attempt's workers first, so a group is never refused for its size
(a command naming more is refused by every replica: protocol/fields.py). A replica idle for longer is
left out: it falls behind and catches up by download (its owner does: swarm/replicas/own_state.py). A
newcomer, which follows its donor's reduced sums until it reduces itself (peer/state/state_transfer.py),
gets microbatches from the routers like any replica and is named from its first attested one on.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from peer.daemon.step_log import AttemptFailed
from protocol.control import MAX_GROUP, Command, CommandReply

IDLE_STEPS = 16  # steps a replica that did work keeps its seat in the reduce without doing more
KEPT = 4096  # replicas remembered as having done work (those idle longest forgotten first)

Send = Callable[..., Awaitable[CommandReply]]  # (peer, command[, timeout])


async def attested(send: Send, run: str, step: int, attempt: int, n_stages: int, shares: dict[str, list[int]],
                   members: dict[str, int]) -> dict[int, set[str]]:
    """Stage -> the replicas that did the attempt's microbatches there, followed from the heads' `shares`
    along each microbatch's activations; AttemptFailed where a microbatch's next replica is not attested
    (its sender does not say, or names no live replica of the next stage)."""
    holders = {mb: head for head, mbs in shares.items() for mb in mbs}
    out = {0: set(holders.values())}
    for stage in range(n_stages - 1):
        asked = sorted(set(holders.values()))
        asks = (send(p, Command(run, step, attempt, "status")) for p in asked)
        replies = dict(zip(asked, await asyncio.gather(*asks)))
        nxt = {}
        for mb, peer in holders.items():
            reply = replies[peer]
            to = next((s.to for s in reply.sent if s.kind == "a" and s.microbatch == mb), None)
            if reply.outcome != "ok" or to is None or members.get(to) != stage + 1:
                why = reply.reason or reply.outcome if reply.outcome != "ok" else (
                    "it names no replica" if to is None else f"it names {to[-8:]}, no live replica of the stage")
                raise AttemptFailed(f"microbatch {mb}'s replica of stage {stage + 1} is not attested by "
                                    f"{peer[-8:]}, which did it at stage {stage} ({why})", peer)
            nxt[mb] = to
        holders = nxt
        out[stage + 1] = set(holders.values())
    return out


class ReduceGroups:
    """The leader's memory of who did work, by step, and the groups it draws from it."""

    def __init__(self) -> None:
        self.worked: dict[str, int] = {}  # replica -> the last step it did work in (attested or summed)

    def seed(self, peers: list[str], step: int) -> None:
        """Replicas a previous leader named in its last apply (`StepCommit.workers`): they reduced the step
        before this head took over, so they keep their seats as if they had worked in it."""
        for p in peers:
            self.worked.setdefault(p, step - 1)

    def note(self, step: int, workers: dict[int, list[str]]) -> None:
        """The replicas whose summed contribution held microbatches of committed `step` (`ReduceVerdict.workers`)."""
        for peers in workers.values():
            for p in peers:
                self.worked[p] = step
        for p, _ in sorted(self.worked.items(), key=lambda kv: kv[1])[:max(0, len(self.worked) - KEPT)]:
            del self.worked[p]

    def draw(self, step: int, work: dict[int, set[str]], members: dict[str, int]) -> dict[int, list[str]]:
        """Stage -> its reduce group at `step` (sorted): the attempt's workers (`work`), then the stage's
        members that did work in the last `IDLE_STEPS` steps, the most recent first; `MAX_GROUP` at most."""
        groups = {}
        for stage in sorted(set(members.values()) | set(work)):
            now = sorted(work.get(stage, ()))
            recent = sorted((p for p, s in members.items() if s == stage and p not in work.get(stage, ())
                             and p in self.worked and step - self.worked[p] <= IDLE_STEPS),
                            key=lambda p: (-self.worked[p], p))
            groups[stage] = sorted((now + recent)[:MAX_GROUP])
        return {s: g for s, g in groups.items() if g}
