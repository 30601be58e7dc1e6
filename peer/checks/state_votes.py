"""`StateVotes`: the leading head's tally of the state hashes (`peer/runner/state_hash.py`) that every
replica reports in its reply to an apply, and the rule that says which hash a stage agreed on.

For each (steps applied, stage), over the replicas that did that step's work (their summed contribution
held microbatches: `ReduceVerdict.workers`, which the driver passes as `stages`), applied it and reported a
hash; an id that did no work has no say (issue 57: 4 replicas that reduced empty contributions and reported one
made-up hash outvoted the 3 that worked while every member counted, tests/peer/test_workless_votes.py):

- a hash that a strict majority of them report is the stage's agreed hash;
- without one (two replicas that differ, say), stage 0's agreed hash is the leading head's own
  (the lease made it the leader: the swarm takes its word on its own stage already, and its
  step records are checked by the other heads); any other stage has no agreed hash at that step,
  and nothing is vouched for it there (a joiner waits for a step that is). Who is right is then
  the reduce's to settle (issue 21's spot checks recompute the work), not the state hash's.

Every replica whose hash differs from its stage's agreed one is "odd": the leader takes it out
of the stage (it is avoided like a peer that sent bad data, so it gets no more work and no more
commands; it falls behind) and it has to download the state again to come back; a joiner's
download is checked against the vouched hash, so it comes back only with a state the swarm had.
The leader tallies every apply reply as it comes (`CommandSender.on_apply`; its own hash once its
thread is done, `StateHasher.on_hashed`) and concludes a step's tally when the reduce replies of
the next step are in (a replica hashes while that step's microbatches run and answers the reduce
only once its hash is done, so its apply reply, sent first, has counted), with the stages of the
hashed step's workers. The agreed hashes go to the coordinator in a signed work
record (`protocol/step_record.py`), which vouches for them in the DHT (`swarm/replicas/vouched.py`).
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class StateVotes:
    leader: str  # the leading head: its hash settles a tie on stage 0
    directory: object | None = None  # a PeerDirectory: odd replicas are reported to it as bad-data peers
    keep: int = 8  # steps whose votes are held
    votes: dict[int, dict[str, str]] = field(default_factory=dict)  # steps -> peer -> sha256
    on_agreed: Callable[[int, dict[int, str]], None] | None = None  # (steps, stage -> agreed hash) once concluded
    concluded: int = 0  # the newest steps concluded

    def add(self, peer: str, state: tuple[int, str]) -> None:
        """A replica's (steps applied, sha256) from its apply reply."""
        steps, sha256 = state
        if steps > self.concluded:
            self.votes.setdefault(steps, {})[peer] = sha256
            for old in sorted(self.votes)[:-self.keep]:
                del self.votes[old]

    def settle(self, steps: int, stages: dict[str, int]) -> tuple[dict[int, str], list[str]]:
        """(stage -> agreed hash after `steps` steps, the odd replicas: those whose hash differs from
        their stage's agreed one). `stages`: each replica that did the step's work -> its stage; no other
        peer's hash is counted."""
        by_stage: dict[int, dict[str, str]] = {}
        for peer, sha in self.votes.get(steps, {}).items():
            if peer in stages:
                by_stage.setdefault(stages[peer], {})[peer] = sha
        hashes, odd = {}, []
        for stage, reported in sorted(by_stage.items()):
            (top, n), *_ = Counter(reported.values()).most_common()
            sha = top if 2 * n > len(reported) else reported.get(self.leader) if stage == 0 else None
            if sha is not None:
                hashes[stage] = sha
                odd += sorted(p for p, h in reported.items() if h != sha)
        return hashes, odd

    def conclude(self, steps: int, stages: dict[str, int]) -> dict[int, str]:
        """Settle the tally after `steps` steps once: odd replicas are taken out, `on_agreed` hears the hashes."""
        if steps <= self.concluded or steps not in self.votes:
            return {}
        self.concluded = steps
        hashes, odd = self.settle(steps, stages)
        for peer in odd:
            if peer == self.leader:
                log.error("this head's state after step %d differs from the one its stage's other heads agree on; "
                          "it will not vouch for it", steps)
                hashes.pop(0, None)
                continue
            log.warning("replica %s's state after step %d differs from the one its stage agreed on: it is taken out "
                        "of the stage until it downloads the state again", peer[-8:], steps)
            if self.directory is not None:
                self.directory.report_failure(peer, bad_data=True)
        if hashes and self.on_agreed is not None:
            self.on_agreed(steps, hashes)
        for old in [t for t in self.votes if t <= steps]:
            del self.votes[old]
        return hashes
