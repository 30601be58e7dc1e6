"""`swarm coordinator --compile` (issue 54, item 1): a run-wide setting sealed into the run spec, which every
peer's stage follows. Run-wide because a compiled stage's bf16 gradients differ from an eager one's by 2.8%
of their norm on an H100 (docs/results/peer_compile_h100_20261206), above the spot checks' 2% tolerance, while
two compiled copies differ by 0.3%: replicas that computed differently would convict each other."""
from __future__ import annotations

from protocol.spec import preset
from swarm.coordinator import sealed_spec
from swarm.trust.keys import SigningKey


def test_the_coordinator_seals_compile_into_the_spec_and_only_when_asked():
    key = SigningKey.generate()
    assert sealed_spec(preset("tiny"), key, compile_blocks=True).extra["compile_blocks"] is True
    assert "compile_blocks" not in sealed_spec(preset("tiny"), key).extra  # absent, as older coordinators wrote it
    assert sealed_spec(preset("tiny"), key, compile_blocks=True).run_hash != sealed_spec(preset("tiny"), key).run_hash


def test_a_stage_runner_of_a_compiled_run_compiles_every_block_and_no_other_module():
    from peer.runner.stage import StageRunner
    spec = preset("tiny", stages=2)
    compiled, eager = StageRunner(spec, 1, compile_blocks=True), StageRunner(spec, 1)
    assert compiled.module.blocks and all(b._compiled_call_impl is not None for b in compiled.module.blocks)
    assert all(b._compiled_call_impl is None for b in eager.module.blocks)
    assert compiled.module._compiled_call_impl is None  # the stage's entry and exit stay eager
    # nothing of the state changes: a compiled replica loads and serves the same state dict
    assert list(compiled.state_dict()) == list(eager.state_dict())
