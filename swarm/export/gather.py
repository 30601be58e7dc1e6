"""A run's stage states, gathered for export: one replica per stage, all at one step, checked.

A source yields state dicts in the `StageRunner.state_dict()` format (run spec JSON, stage,
step, basis version and U, module weights, optimizer, ...): checkpoint files written by
`swarm peer --checkpoint-dir`, or live peers (`fetch_stage_states`: the state transfer that
replicas joining mid-run use).
`select_stages` makes one model of them or refuses with the reason: checkpoints of several
runs, a missing stage, stages at different steps, stages on different bases, or replicas of
one stage whose weights differ at the same step.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from protocol.spec import RunSpec, SpecError

log = logging.getLogger(__name__)

# `swarm/node.py` names a peer's checkpoint {run_hash}-stage{stage}.pt
CHECKPOINT_NAME = re.compile(r"^(?P<run>[0-9a-f]{16})-stage(?P<stage>\d+)\.pt$")


class ExportError(ValueError):
    """The states cannot be exported as one model; the message says what to do."""


@dataclass
class StageState:
    """One replica's state of one stage, and where it came from (for messages)."""

    state: dict
    source: str
    spec: RunSpec = field(init=False)

    def __post_init__(self) -> None:
        missing = [k for k in ("spec", "stage", "step", "module") if k not in self.state]
        if missing:
            raise ExportError(f"{self.source} is not a stage state (no {', '.join(missing)}); "
                              f"pass the checkpoint folders of `swarm peer --checkpoint-dir`.")
        try:
            self.spec = RunSpec.from_json(self.state["spec"])
        except SpecError as e:
            raise ExportError(f"{self.source} holds an unreadable run spec ({e})") from e

    @property
    def run_hash(self) -> str:
        return self.spec.run_hash

    @property
    def stage(self) -> int:
        return int(self.state["stage"])

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def basis_version(self) -> int:
        return int(self.state.get("basis_version") or 0)


@dataclass
class GatheredRun:
    """Every stage of one run at one step: `states[s]` is stage s's state dict."""

    spec: RunSpec
    step: int
    basis_version: int
    states: list[dict]
    sources: list[str]
    stage_hashes: list[str]
    tokenizer: bytes | None = None  # the run's tokenizer file, where the gathering found it (BPE runs)


def _update_tensor(h: Any, name: str, t: torch.Tensor) -> None:
    t = t.detach().to("cpu").contiguous()
    h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def state_hash(state: dict) -> str:
    """sha256 (first 16 hex digits) of a stage's weights and basis: name, dtype, shape and bytes
    of every module tensor in name order, then U. Equal states hash equal on every machine."""
    h = hashlib.sha256()
    for name in sorted(state["module"]):
        _update_tensor(h, name, state["module"][name])
    if state.get("U") is not None:
        _update_tensor(h, "U", state["U"])
    return h.hexdigest()[:16]


# ------------------------------------------------------------------ sources

def checkpoint_files(dirs: Iterable[str | Path]) -> list[Path]:
    """Every `{run}-stage{s}.pt` file directly in `dirs`, in a fixed order."""
    found: list[Path] = []
    for d in map(Path, dirs):
        if not d.is_dir():
            raise ExportError(f"checkpoint folder {d} does not exist; pass the folder given to "
                              f"`swarm peer --checkpoint-dir`.")
        found += [p for p in d.iterdir() if p.is_file() and CHECKPOINT_NAME.match(p.name)]
    return sorted(set(found))


def load_checkpoints(dirs: Iterable[str | Path]) -> list[StageState]:
    dirs = list(dirs)
    states = []
    for path in checkpoint_files(dirs):
        if not path.exists():  # a peer may be replacing it right now
            continue
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # a torn or foreign file: say which one
            raise ExportError(f"cannot read checkpoint {path} ({e}); remove it or wait until its peer "
                              f"has finished writing it.") from e
        if not isinstance(state, dict):
            raise ExportError(f"{path} is not a stage checkpoint; remove it from the folder.")
        st = StageState(state, str(path))
        named = CHECKPOINT_NAME.match(path.name)
        if named["run"] != st.run_hash or int(named["stage"]) != st.stage:
            raise ExportError(f"{path} is named for run {named['run']} stage {named['stage']} but holds run "
                              f"{st.run_hash} stage {st.stage}; rename or remove it.")
        states.append(st)
    if not states:
        raise ExportError(f"no checkpoints ({{run}}-stage{{s}}.pt) in {', '.join(map(str, dirs))}; peers write "
                          f"them with --checkpoint-dir when they stop.")
    return states


async def fetch_stage_states(initial_peers: list[str], timeout: float = 300.0) -> list[dict]:
    """The state of one live replica of every stage (`fetch_run` without the tokenizer)."""
    return (await fetch_run(initial_peers, timeout))[0]


async def fetch_run(initial_peers: list[str], timeout: float = 300.0) -> tuple[list[dict], bytes | None]:
    """The state of one live replica of every stage, in the `StageRunner.state_dict()` format,
    downloaded as a joining replica would (`peer/state/state_transfer.py`: a snapshot between two
    steps, checked by sha256). All stages are asked at once, so that on a swarm that is not
    training they are at one step; `select_stages` refuses them otherwise. With them, the run's
    tokenizer file for a run on a BPE token folder (this machine's copy, else fetched from the swarm
    and checked against the run spec's hash: swarm/data/tokenizer_fetch.py), or None."""
    from peer.runner.stage import StageRunner
    from peer.state.state_transfer import StateError, download_state
    from swarm.dht import SwarmDHT, close_node, start_dht
    from swarm.net import Transport
    from swarm.net.message_link import LinkAdapter
    from swarm.replicas.replica import transport_limit
    from swarm.replicas.router import LIVE_STATES
    from swarm.trust.identity import Identity

    identity = Identity.generate()
    dht = await asyncio.to_thread(start_dht, initial_peers, ["/ip4/0.0.0.0/tcp/0"], identity, True)
    p2p = transport = None
    try:
        sdht = SwarmDHT(dht, identity)
        signed = await sdht.fetch_run_spec()
        if signed is None:
            raise ExportError("no run spec found in the DHT; check --initial-peers (the coordinator's address).")
        spec = RunSpec.from_json(signed.spec_json)
        await sdht.adopt(spec)
        p2p = await dht.replicate_p2p()
        transport = Transport(p2p, f"subspace-swarm-{spec.run_hash}", max_frame_bytes=transport_limit(spec),
                              timeout=timeout)
        link = LinkAdapter(transport, identity.peer_id)
        peers = await sdht.all_stage_peers(spec.run_hash, spec.n_stages)
        missing = [s for s, anns in peers.items() if not any(a.state in LIVE_STATES for a in anns)]
        if missing:
            raise ExportError(f"stage{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of run "
                              f"{spec.run_hash} {'have' if len(missing) > 1 else 'has'} no live peer to export from.")

        async def one(stage: int) -> dict:
            problems = []
            limit = 4 * StageRunner(spec, stage).n_params * 8 + (64 << 20)
            for ann in sorted((a for a in peers[stage] if a.state in LIVE_STATES), key=lambda a: -a.step):
                try:
                    return (await download_state(link, ann.peer_id, spec.run_hash, limit, timeout, now=True))[1]
                except StateError as e:
                    problems.append(str(e))
            raise ExportError(f"no replica of stage {stage} gave its state: {'; '.join(problems)}")

        states = await asyncio.gather(*(one(s) for s in range(spec.n_stages)))
        log.info("downloaded the state of %d stages of run %s from live peers", len(states), spec.run_hash)
        return list(states), await _run_tokenizer(spec, transport, sdht, identity.peer_id)
    finally:
        await close_node(dht, p2p, transport)


# ------------------------------------------------------------------ selection

def _runs_found(candidates: list[StageState]) -> str:
    runs: dict[str, set[int]] = {}
    for c in candidates:
        runs.setdefault(c.run_hash, set()).add(c.stage)
    return "; ".join(f"run {r} (stages {', '.join(map(str, sorted(runs[r])))})" for r in sorted(runs))


def select_stages(candidates: list[StageState], run: str | None = None) -> GatheredRun:
    """One replica of every stage of one run, all at the highest step that every stage has."""
    if run is not None:
        chosen = [c for c in candidates if c.run_hash == run]
        if not chosen:
            raise ExportError(f"no state of run {run} here; found {_runs_found(candidates)}.")
        candidates = chosen
    runs = sorted({c.run_hash for c in candidates})
    if len(runs) > 1:
        raise ExportError(f"these states belong to {len(runs)} runs: {_runs_found(candidates)}; "
                          f"pass --run HASH to export one of them.")
    spec = candidates[0].spec
    by_stage: dict[int, list[StageState]] = {}
    for c in candidates:
        if not 0 <= c.stage < spec.n_stages:
            raise ExportError(f"{c.source} is stage {c.stage}, but run {spec.run_hash} has stages "
                              f"0..{spec.n_stages - 1}.")
        by_stage.setdefault(c.stage, []).append(c)
    missing = [s for s in range(spec.n_stages) if s not in by_stage]
    if missing:
        raise ExportError(f"no state of stage {', '.join(map(str, missing))} of run {spec.run_hash} (found stages "
                          f"{', '.join(map(str, sorted(by_stage)))} of {spec.n_stages}); every stage is needed: add "
                          f"the checkpoint folder of a peer that hosted it.")
    steps = [{c.step for c in by_stage[s]} for s in range(spec.n_stages)]
    common = set.intersection(*steps)
    if not common:
        at = "; ".join(f"stage {s} at step {', '.join(map(str, sorted(st)))}" for s, st in enumerate(steps))
        raise ExportError(f"the stages are at different steps ({at}); a model needs every stage at the same "
                          f"step: stop all peers after the same step, or wait for the ones behind to save.")
    step = max(common)
    picked, hashes = [], []
    for s in range(spec.n_stages):
        replicas = sorted((c for c in by_stage[s] if c.step == step), key=lambda c: c.source)
        digests = {c.source: state_hash(c.state) for c in replicas}
        if len(set(digests.values())) > 1:
            raise ExportError(f"replicas of stage {s} at step {step} hold different weights "
                              f"({', '.join(f'{k}: {v}' for k, v in digests.items())}); pass only one of them.")
        picked.append(replicas[0])
        hashes.append(digests[replicas[0].source])
        ignored = [c.source for c in by_stage[s] if c.step != step]
        if ignored:
            log.info("stage %d: using step %d, ignoring %s", s, step, ", ".join(ignored))
    versions = [c.basis_version for c in picked]
    if len(set(versions)) > 1:
        raise ExportError(f"the stages use different basis versions ({versions}) at step {step}; "
                          f"export after every stage has switched (basis_switch_delay steps later).")
    Us = [c.state.get("U") for c in picked]
    if any(U is not None for U in Us) and not all(U is not None and torch.equal(U, Us[0]) for U in Us):
        raise ExportError(f"the stages hold different bases U at step {step} (version {versions[0]}); "
                          f"they were not trained together: check the checkpoint folders.")
    return GatheredRun(spec, step, versions[0], [c.state for c in picked], [c.source for c in picked], hashes)


def gather_from_checkpoints(dirs: Iterable[str | Path], run: str | None = None) -> GatheredRun:
    return select_stages(load_checkpoints(dirs), run)


async def _run_tokenizer(spec: RunSpec, transport, sdht, own_id: str) -> bytes | None:
    from peer.data.corpus import DataError
    from peer.data.run_tokenizer import find_run_tokenizer, run_tokenizer_sha256
    from swarm.data.tokenizer_fetch import fetch_run_tokenizer

    if run_tokenizer_sha256(spec) is None:
        return None
    try:
        local = find_run_tokenizer(spec)
        return local.read_bytes() if local is not None else await fetch_run_tokenizer(spec, transport, sdht, own_id)
    except DataError as e:  # the export says what is missing when it needs the file
        log.warning("%s", e)
        return None


async def gather_from_peers(initial_peers: list[str], run: str | None = None) -> GatheredRun:
    states, tokenizer = await fetch_run(initial_peers)
    gathered = select_stages([StageState(s, f"peer state {i}") for i, s in enumerate(states)], run)
    gathered.tokenizer = tokenizer
    return gathered
