"""Which stage a peer serves: the choice at join time and the periodic re-check. Counts decide.

Let n_s be the number of peers present at stage s (announced online, paused, syncing or
joining) and T_s the sum of the tokens/s they announce. An announcement not refreshed for
two heartbeats (older than 2/3 of this peer's ttl; a heartbeat re-announces every ttl/3, and
the peers of a swarm share the ttl) is a dead peer's whose record has not expired yet: it is
not counted; nor is a record a peer left at a stage it moved away from (a peer is present
only at the stage of its newest announcement); nor, when a peer joins, is a peer that does not
answer a liveness probe (`swarm/monitor/liveness.py`: one killed a moment ago, whose record is
still fresh). The periodic re-check does not probe the directory, since a live peer with a busy
uplink can miss a probe and a stage that looks empty draws a peer away at once; it probes only
the peers that would stay at a stage a move is decided from (below).

Announcements are claims anyone can make (issue 20: 40 fake ids on two stages moved honest
peers off theirs). So where this peer knows who did work -- the peer ids the leading head's
last `apply` named, every replica of every stage whose reduce agreed on the step
(`StepCommit.workers`) -- a stage counts its proven peers and at most one unproven newcomer:

    n_s = |P_s ∩ W| + min(1, |P_s| - |P_s ∩ W|)     (P_s: the present peers; W: the workers named; T_s over P_s ∩ W)

and only a proven peer is ever the one that moves (so every peer of the stage names the same
one: m_s below). A fresh joiner knows no W yet and counts every present peer that answers its probe
(`choose_stage`: a fake id that does not listen is not counted). The emptiest stage is

    b = argmin_s (n_s, T_s, s)        (fewest peers, then the lowest throughput, then the earliest)

Only the stages that fit the peer's memory take part (`allowed`, from `memory_fit.py`): the
emptiest is the emptiest of those, and a peer is never moved to a stage that does not fit it.

Joining with `--stage auto` (as Petals' `choose_best_blocks` does for blocks), a peer takes
b (not counting itself), announces "joining" there, waits a random moment and looks again:
peers that started at the same time saw the same directory and may have piled onto one stage.
If the moving rule below then says "move", the joining peer with the highest id among the
joiners of our stage moves, and the others look again the next round; a few rounds settle any
simultaneous start. A peer that has chosen announces "syncing" at once, so that it is no longer one
of the joiners that may move.

While serving, every `rebalance_period` a peer p of stage a asks `move_target`; it moves to b
(with a state download) if and only if

    n_a - n_b >= 2,  a = min{s ∈ G : n_s = max_{t ∈ G} n_t},  p = m_a,  and (n_b = 0 or not held(p))

    S_s = {q ∈ P_s ∩ W : q announced online or paused}    (P_s ∩ W: all of P_s while W is not known)
    m_s = max{peer ids of S_s but the leading head's},  K_s = S_s - {m_s}   (who stays if m_s goes)
    G   = {s : m_s exists and K_s is not empty}        (the stages that may give a peer)

where held(p) means p took stage a (joined or moved) less than `hold` seconds ago (5 min by
default, `--rebalance-hold`). So 2/2/1 stays, 3/2/1 becomes 2/2/2, and an empty stage draws
one peer of the fullest stage that can give one whenever some stage has two or more.

The invariant, `can_give`: a peer never moves if its stage would then hold no other peer that
is present AND proven, K_a != ∅. S counts conservatively: a fresh announcement of a peer that
serves a state (a "joining" or "syncing" one has none yet: it may be downloading from p; nor
does it ask whether to move, so it is never m_s), named in W where W is known. Why not n_a alone:
it counts a newcomer, and where W is not known (a peer that just moved; W is not renewed either
while stage 0 is empty: no step is applied) every record. By n alone, a stage of one proven peer
and one newcomer, fake id or dead peer's fresh record was 2 against an empty stage's 0 and gave
its only peer, whatever its hold (issue 56: in a 6-host churn run stages 1 and 2 each gave their
only peer to an empty stage 0). A stage outside G is passed over (the next fullest in G gives),
so a fake id cannot keep an empty stage empty either. And the mover asks (`keeper_probe`, where
given) that some q of K_a answer a liveness probe: a killed peer's record stays fresh for two
heartbeats. A missed probe only puts the move off to the next period.

One peer of one stage moves per period. A move lowers sum_s n_s^2 by 2 (n_a - n_b - 1) >= 2
(G only narrows which stage gives), so without joins and deaths moving stops, and no peer moves
back and forth; the hold keeps a peer in place while the swarm churns.

A disputed stage (its only two replicas disagree at the step in progress, and nothing may be applied
until a third settles it: peer/checks/spot_checks.py; every peer learns it from the leader's abort,
`StepCommit.disputed_stages`) with fewer than three peers draws one: the first fullest of the other
stages in G gives its peer p as above, whatever its hold (the swarm waits for it).

Throughput never makes a peer move: announced speeds are claims nobody checks (routers
measure for themselves), and they are not all one measure. Every figure is tokens through
that peer's stage per second, but the leading head announces the swarm's rate (a step's
tokens / the step's wall time), the other replicas the traffic they passed on (~10 s), and a
standby head its capacity (`peer/step/calibration.py`: one microbatch's forward+backward on its
own state, timed; no network, no waiting). Traffic never exceeds capacity, so T_s of a stage
with standby heads counts their idle capacity: a spare head is counted at the pace it could
lead at. Such sums are not comparable enough to move state across the swarm on; they only
break ties between equally covered stages.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from peer.daemon.interfaces import PeerStatus
from protocol.spec import RunSpec
from swarm.dht import StageAnnouncement

from .router import LIVE_STATES, Router

log = logging.getLogger(__name__)

PRESENT = (*LIVE_STATES, "joining", "syncing")  # announced states that count as a stage's peers
HOLD_S = 300.0  # how long a peer that joined or moved stays put, unless a stage is empty
# hivemind's DHT time (get_dht_time) is the wall clock: announcement timestamps are in it
DHT_TIME: Callable[[], float] = time.time
Answers = Callable[[str], Awaitable[bool]]  # peer id -> whether it answers a liveness probe
Workers = Callable[[], "list[str] | None"]  # the peers the leader's last apply named (None or []: not known)
Disputed = Callable[[], "list[int]"]  # the stages waiting for a third replica (the leader's last abort)


class PlacementError(ValueError):
    """A stage that cannot be chosen; the text says what to pass instead."""


async def directory(router: Router, n_stages: int, states=PRESENT, now: Callable[[], float] = DHT_TIME,
                    answers: Answers | None = None) -> dict[int, list[StageAnnouncement]]:
    """Per stage, the announcements in `states` that were refreshed within the last two heartbeats,
    less a peer's older ones at other stages and those of peers that do not answer a probe (`answers`,
    if given: a peer killed a moment ago still has a fresh record)."""
    found = await asyncio.gather(*(router.announced(s, fresh=True) for s in range(n_stages)))
    oldest = now() - 2 * router.ttl / 3
    peers = {s: [a for a in anns if a.state in states and a.timestamp >= oldest] for s, anns in enumerate(found)}
    # a peer that moved on leaves its old stage's record until it expires ("leaving" is best effort):
    # it is present at its newest announcement only, or it would keep the stage it left from looking empty
    newest: dict[str, float] = {}
    for a in (a for anns in peers.values() for a in anns):
        newest[a.peer_id] = max(newest.get(a.peer_id, a.timestamp), a.timestamp)
    peers = {s: [a for a in anns if a.timestamp >= newest[a.peer_id]] for s, anns in peers.items()}
    if answers is not None:
        others = sorted({a.peer_id for anns in peers.values() for a in anns} - {router.peer_id})
        silent = {p for p, ok in zip(others, await asyncio.gather(*map(answers, others))) if not ok}
        peers = {s: [a for a in anns if a.peer_id not in silent] for s, anns in peers.items()}
    return peers


def count(anns: list[StageAnnouncement], workers: set[str] | None) -> int:
    """n_s: every present peer if `workers` is None, else the proven ones and at most one newcomer."""
    if workers is None:
        return len(anns)
    proven = sum(1 for a in anns if a.peer_id in workers)
    return proven + min(1, len(anns) - proven)


def emptiest(peers: dict[int, list[StageAnnouncement]], workers: set[str] | None = None) -> int:
    """argmin_s (n_s, T_s, s)."""
    def claimed(s: int) -> float:
        return sum(a.throughput for a in peers[s] if workers is None or a.peer_id in workers)
    return min(peers, key=lambda s: (count(peers[s], workers), claimed(s), s))


def serving(anns: list[StageAnnouncement], workers: set[str] | None) -> list[StageAnnouncement]:
    """S_s: the present peers that serve a state (online or paused) and, where W is known, are named in it."""
    return [a for a in anns if a.state in LIVE_STATES and (workers is None or a.peer_id in workers)]


def mover(anns: list[StageAnnouncement], workers: set[str] | None) -> str | None:
    """m_s: the one peer of a stage that may move, the highest id of S_s but the leading head's (every
    peer of the stage names the same one; an id that did no work is nobody to wait for, and a joining or
    syncing peer has no state to move with and does not ask)."""
    return max((a.peer_id for a in serving(anns, workers) if not a.leads), default=None)


def keepers(anns: list[StageAnnouncement], leaving: str | None, workers: set[str] | None) -> list[str]:
    """K_s: the peers that stay at a stage when `leaving` goes, S_s less it."""
    return sorted(a.peer_id for a in serving(anns, workers) if a.peer_id != leaving)


def can_give(anns: list[StageAnnouncement], workers: set[str] | None) -> bool:
    """s ∈ G, the invariant: the stage has a peer that may move and keeps one present and proven when it
    does, however many newcomers, fake ids or dead peers' fresh records make n_s look like two or more."""
    leaving = mover(anns, workers)
    return leaving is not None and bool(keepers(anns, leaving, workers))


def destination(peers: dict[int, list[StageAnnouncement]], stage: int, workers: set[str] | None = None,
                disputed: frozenset[int] = frozenset(), givers: frozenset[int] | None = None) -> int | None:
    """The emptiest stage b if `stage` is the first of the fullest of the `givers` (G; None: every stage,
    as for joiners, whose mover holds no state) and has two or more peers more than b, else None: whether
    one peer of `stage` should move (see the module docstring). A `disputed` stage with fewer than three
    peers comes first: the first fullest other stage of G gives it one, if it has two."""
    counts = {s: count(anns, workers) for s, anns in peers.items()}
    able = {s: n for s, n in counts.items() if givers is None or s in givers}
    short = [d for d in sorted(disputed) if d in counts and counts[d] < 3]
    others = {s: n for s, n in able.items() if s not in disputed}
    if short and any(s not in disputed for s in counts):
        giver = min((s for s, n in others.items() if n == max(others.values())), default=None)
        return short[0] if stage == giver and counts[stage] >= 2 else None
    if stage not in able:
        return None
    fullest = min(s for s, n in able.items() if n == max(able.values()))
    target = emptiest(peers, workers)
    return target if stage == fullest and counts[stage] - counts[target] >= 2 else None


def _known(workers: Workers | None) -> set[str] | None:
    named = workers() if workers is not None else None
    return set(named) if named else None


async def choose_stage(router: Router, spec: RunSpec, requested: str, rng: random.Random | None = None,
                       jitter: tuple[float, float] = (0.3, 1.2), rounds: int = 6,
                       now: Callable[[], float] = DHT_TIME, answers: Answers | None = None,
                       allowed: frozenset[int] | None = None) -> int:
    """The stage to serve: `requested` if it is a number, else the emptiest of the `allowed` ones (see above)."""
    if requested != "auto":
        try:
            stage = int(requested)
        except ValueError:
            raise PlacementError(f"--stage must be a stage number or auto, not {requested!r}.") from None
        if not 0 <= stage < spec.n_stages:
            raise PlacementError(f"--stage {stage} does not exist: this run has stages 0..{spec.n_stages - 1}.")
        return stage
    rng = rng or random.Random()
    peers = await directory(router, spec.n_stages, now=now, answers=answers)
    stage = emptiest({s: [a for a in anns if a.peer_id != router.peer_id] for s, anns in peers.items()
                      if allowed is None or s in allowed})
    for _ in range(rounds):
        await router.announce(PeerStatus(stage, "joining"))
        await asyncio.sleep(rng.uniform(*jitter))  # deliberate jitter: simultaneous joiners look at different moments
        peers = {s: [a for a in anns if a.peer_id != router.peer_id]
                 for s, anns in (await directory(router, spec.n_stages, now=now, answers=answers)).items()}
        peers[stage].append(router.announcement(PeerStatus(stage, "joining")))
        target = destination(peers, stage)
        if target is None or (allowed is not None and target not in allowed):
            break
        joining_here = sorted(a.peer_id for a in peers[stage] if a.state == "joining")
        if joining_here[-1] != router.peer_id:
            continue  # another joiner of this stage moves first; look again once it has
        log.info("stage %d has %d peers and stage %d has %d: this joining peer moves to stage %d", stage,
                 len(peers[stage]), target, len(peers[target]), target)
        stage = target
    # chosen: no longer one of the joiners that may move (it builds its stage for seconds before its
    # download says "syncing", and a chosen peer named the one to move would keep every other in place)
    await router.announce(PeerStatus(stage, "syncing"))
    return stage


async def move_target(router: Router, spec: RunSpec, stage: int, held: bool = False,
                      now: Callable[[], float] = DHT_TIME, answers: Answers | None = None,
                      allowed: frozenset[int] | None = None, workers: Workers | None = None,
                      disputed: Disputed | None = None, keeper_probe: Answers | None = None) -> int | None:
    """The stage this peer should move to now, or None (see the module docstring). `keeper_probe`: a move
    decided still waits until one of the peers that would stay (K_a) answers it."""
    peers = await directory(router, spec.n_stages, now=now, answers=answers)
    if router.peer_id not in {a.peer_id for a in peers[stage]}:  # our own beat may be late: we are here
        peers[stage].append(router.announcement(PeerStatus(stage, "online")))
    known = _known(workers)
    waiting = frozenset(disputed() if disputed is not None else ())
    givers = frozenset(s for s, anns in peers.items() if can_give(anns, known))
    target = destination(peers, stage, known, waiting, givers)
    if target is None or mover(peers[stage], known) != router.peer_id or (allowed is not None
                                                                           and target not in allowed):
        return None
    if held and peers[target] and target not in waiting:
        return None
    # a killed peer's record stays fresh for two heartbeats: one that would stay must still be there
    if keeper_probe is not None and not await _any_answers(keepers(peers[stage], router.peer_id, known),
                                                           keeper_probe):
        log.info("stage %d would keep no peer that answers a probe: this peer stays this time", stage)
        return None
    return target


async def _any_answers(peers: list[str], probe: Answers) -> bool:
    for peer in peers:  # one by one: the first answer is enough, and a stage keeps one or two
        if await probe(peer):
            return True
    return False


@dataclass
class Rebalancer:
    """One peer's periodic re-check at its stage: `move_target`, with the hold that starts when
    it takes the stage (this object is made then)."""

    router: Router
    spec: RunSpec
    hold: float = HOLD_S
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], float] = DHT_TIME
    answers: Answers | None = None
    allowed: frozenset[int] | None = None  # the stages that fit this peer's memory (None: all)
    workers: Workers | None = None  # who the leader's last apply named (StepCommit.workers)
    disputed: Disputed | None = None  # the stages waiting for a third replica (StepCommit.disputed_stages)
    keeper_probe: Answers | None = None  # a liveness probe of the peers that would stay, once a move is decided
    since: float = field(init=False)

    def __post_init__(self) -> None:
        self.since = self.clock()

    def held(self) -> bool:
        return self.clock() - self.since < self.hold

    async def target(self, stage: int) -> int | None:
        return await move_target(self.router, self.spec, stage, self.held(), self.now, self.answers, self.allowed,
                                 self.workers, self.disputed, self.keeper_probe)
