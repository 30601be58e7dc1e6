"""The step window's refusals (peer/daemon/daemon.py `StageDaemon._admit`, docs/security.md "The step window"):
a message of a finished step, of a step that is neither this one nor the next, and of a superseded attempt are
each refused with the rule that failed, and no reason names the step or attempt this stage is on (a prober
learns nothing of where the stage stands); a newer attempt of the step in progress is followed, not refused."""
from __future__ import annotations

import re

from protocol.spec import preset
from protocol.wire import Header
from tests.peer.swarm_in_memory import make_swarm, patient_options


async def test_refusals_name_the_rule_never_the_stages_step_or_attempt():
    spec = preset("tiny", stages=2)
    swarm = await make_swarm(spec, [1, 1], **patient_options())
    try:
        await swarm.drive(3)
        daemon = swarm.stage(1)[0].daemon
        step = daemon.runner.step
        assert step == 3

        def header(s: int, attempt: int) -> Header:
            return Header(spec.run_hash, s, 0, 0, spec.codec, 1, attempt)
        await daemon.adopt_attempt(2)  # as a re-driven step would: attempt 2 of step 4 (0-based 3) in progress
        refused = {"finished": await daemon._admit(header(step - 2, 2), "s0r0"),
                   "two ahead": await daemon._admit(header(step + 2, 2), "s0r0"),
                   "superseded": await daemon._admit(header(step, 1), "s0r0")}
        assert {k: v[1] for k, v in refused.items()} == {"finished": "duplicate", "two ahead": "refused",
                                                           "superseded": "stale"}
        for why, _ in refused.values():
            assert not re.search(r"\d", why), why  # no step, no attempt, no number at all
        assert await daemon._admit(header(step, 2), "s0r0") is None  # the step and attempt in progress
        assert await daemon._admit(header(step, 5), "s0r0") is None and daemon.attempt == 5  # a newer one: followed
    finally:
        await swarm.stop()
