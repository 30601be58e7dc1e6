"""A peer started again with the same identity file takes the stage it had.

Its peer id comes from the identity file (libp2p); the stage it served is remembered beside
it, per run, in `<identity file>.stages.json` ({run hash: stage}), so that a volunteer's
restarted peer (a reboot, a new container on the same volume) goes back to the stage its
checkpoint belongs to instead of the least covered one. `--stage N` still wins.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from swarm.trust.state_dir import read_json_map

log = logging.getLogger(__name__)


def stage_file(identity: str) -> Path:
    return Path(f"{identity}.stages.json")


def recall_stage(identity: str | None, run_hash: str) -> int | None:
    """The stage this identity served in this run, if it served one."""
    if not identity:
        return None
    stage = read_json_map(stage_file(identity)).get(run_hash)
    return stage if isinstance(stage, int) and not isinstance(stage, bool) and stage >= 0 else None


def remember_stage(identity: str | None, run_hash: str, stage: int) -> None:
    """Note the stage beside the identity file (written whole, then renamed: never half a file)."""
    if not identity:
        return
    path = stage_file(identity)
    data = read_json_map(path)
    if data.get(run_hash) == stage:
        return
    data[run_hash] = stage
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError as e:  # a read-only folder must not stop the peer; it only forgets its stage
        log.warning("could not remember this peer's stage in %s: %s", path, e.strerror)
