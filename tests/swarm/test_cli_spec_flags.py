"""The run-spec flags of `swarm local` and `swarm coordinator` reach the spec (replica sync included),
and a bad value is refused with one sentence before anything starts."""
from __future__ import annotations

import json

import pytest

from protocol.spec import RunSpec, SpecError, preset
from swarm.cli import build_parser, main
from swarm.spec_flags import spec_from_args, spec_notes


@pytest.mark.parametrize("command", ["local", "coordinator"])
def test_replica_sync_flags_reach_the_run_spec(command):
    args = build_parser().parse_args([command, "--preset", "tiny", "--replica-sync", "powersgd",
                                      "--replica-sync-rank", "8"])
    spec = spec_from_args(args)
    assert (spec.replica_sync, spec.replica_sync_rank) == ("powersgd", 8)
    default = spec_from_args(build_parser().parse_args([command, "--preset", "tiny"]))
    assert (default.replica_sync, default.replica_sync_rank) == ("exact", 8)  # an exact run's hash stays as it was
    assert default.run_hash != spec.run_hash  # replicas that sync differently are in different runs
    ranked = spec_from_args(build_parser().parse_args([command, "--preset", "tiny", "--replica-sync", "powersgd",
                                                        "--replica-sync-rank", "32"]))
    assert ranked == spec.replace(replica_sync_rank=32) and ranked.run_hash != spec.run_hash  # the rank is signed
    assert RunSpec.from_json(ranked.to_json()).replica_sync_rank == 32


def test_a_bad_replica_sync_is_refused(capsys):
    with pytest.raises(SpecError, match="replica_sync_rank"):
        spec_from_args(build_parser().parse_args(["local", "--replica-sync-rank", "0"]))
    assert main(["local", "--replica-sync-rank", "0", "--no-dashboard"]) == 2
    assert "replica_sync_rank must be between 1 and 1024" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["local", "--replica-sync", "sometimes"])


@pytest.mark.parametrize("command", ["local", "coordinator"])
def test_the_constrained_stage_lr_reaches_the_spec_and_only_a_subspace_run_defaults_it(command, capsys):
    spec = spec_from_args(build_parser().parse_args([command, "--preset", "small", "--constrained-stage-lr", "1"]))
    default = spec_from_args(build_parser().parse_args([command, "--preset", "small"]))
    assert spec == default.replace(constrained_stage_lr_scale=1.0) and default.constrained_stage_lr_scale == 0.03
    assert spec.run_hash != default.run_hash  # a stage lr is part of what every peer must agree on
    tiny = spec_from_args(build_parser().parse_args([command, "--preset", "tiny", "--constrained-stage-lr", "0.03"]))
    assert tiny.constrained_stage_lr_scale == 0.03
    dense = spec_from_args(build_parser().parse_args([command, "--codec", "dense", "--preset", "small"]))
    assert dense.codec == "dense" and dense.constrained_stage_lr_scale == 1.0
    named = spec_from_args(build_parser().parse_args([command, "--codec", "bottleneck", "--constrained-stage-lr",
                                                      "0.03"]))  # any codec takes it when named
    assert named.codec == "bottleneck" and named.constrained_stage_lr_scale == 0.03
    with pytest.raises(SpecError, match=r"must be in \(0, 1000\]"):
        spec_from_args(build_parser().parse_args([command, "--constrained-stage-lr", "0"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    assert "--constrained-stage-lr X" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["local", "coordinator"])
def test_the_batch_and_the_window_reach_the_spec_with_clear_errors(command, capsys):
    spec = spec_from_args(build_parser().parse_args([command, "--preset", "tiny", "--batch-size", "64",
                                                      "--microbatches-in-flight", "3"]))
    assert (spec.batch_size, spec.microbatches_in_flight, spec.max_in_flight) == (64, 3, 3)
    assert spec_from_args(build_parser().parse_args([command, "--preset", "tiny"])).batch_size == 16
    with pytest.raises(SpecError, match="positive multiple of microbatch_size"):
        spec_from_args(build_parser().parse_args([command, "--batch-size", "12"]))
    with pytest.raises(SpecError, match="microbatches_in_flight must be 0"):
        spec_from_args(build_parser().parse_args([command, "--microbatches-in-flight", "-2"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    assert "--microbatches-in-flight N" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["local", "coordinator"])
def test_the_powersgd_warm_up_reaches_the_spec_and_needs_powersgd(command):
    spec = spec_from_args(build_parser().parse_args([command, "--replica-sync", "powersgd",
                                                      "--replica-sync-warmup", "100"]))
    assert (spec.replica_sync, spec.replica_sync_warmup, spec.powersgd_at(99), spec.powersgd_at(100)) == \
        ("powersgd", 100, False, True)
    with pytest.raises(SpecError, match="use it with replica_sync powersgd"):
        spec_from_args(build_parser().parse_args([command, "--replica-sync-warmup", "100"]))


def test_the_summary_line_names_the_options_a_spec_turned_on():
    from protocol.spec import preset
    assert spec_notes(preset("tiny")) == ""
    assert spec_notes(preset("small")) == ", stages before the last at 0.03 x the lr"  # the preset's own default
    assert spec_notes(preset("tiny", microbatches_in_flight=2, replica_sync="powersgd", replica_sync_warmup=5)) == \
        ", 2 microbatches in flight a head, 5 exact sync steps first"


@pytest.mark.parametrize("command", ["local", "coordinator"])
def test_the_slowest_uplink_is_a_rule_of_the_signed_spec(command, tmp_path):
    """Every replica must give up on a slow one at the same time: the floor is the spec's, not a peer's flag."""
    default = spec_from_args(build_parser().parse_args([command, "--preset", "tiny"]))
    assert default.slowest_uplink_bps == 8e6 and "slowest_uplink_bps" not in default.to_dict()  # old hashes kept
    spec = spec_from_args(build_parser().parse_args([command, "--preset", "tiny", "--slowest-uplink", "2mbit"]))
    assert spec == default.replace(slowest_uplink_bps=2e6) and spec.run_hash != default.run_hash
    assert RunSpec.from_dict(spec.to_dict()) == spec and "down to 2 Mbit/s" in spec_notes(spec)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(default.to_dict()))  # --run-spec FILE with the flag: the flag's floor
    from_file = spec_from_args(build_parser().parse_args([command, "--run-spec", str(path), "--slowest-uplink",
                                                          "2mbit"]))
    assert from_file.slowest_uplink_bps == 2e6


@pytest.mark.parametrize("rate", ["unlimited", "8 bananas", "0mbit", "80"])
def test_a_bad_slowest_uplink_is_refused_before_anything_starts(rate, capsys):
    with pytest.raises(ValueError) as e:
        spec_from_args(build_parser().parse_args(["coordinator", "--slowest-uplink", rate]))
    assert str(e.value) == f"--slowest-uplink must be a rate such as 8mbit or 2MB/s, not {rate!r}."
    assert main(["local", "--slowest-uplink", rate, "--no-dashboard"]) == 2
    assert f"--slowest-uplink must be a rate such as 8mbit or 2MB/s, not {rate!r}." in capsys.readouterr().err


@pytest.mark.parametrize("bps", [0.0, -1.0, float("nan"), float("inf")])
def test_a_spec_file_with_a_bad_slowest_uplink_is_refused(bps):
    with pytest.raises(SpecError, match="slowest_uplink_bps must be a rate in bit/s above 0"):
        RunSpec.from_dict({**RunSpec().to_dict(), "slowest_uplink_bps": bps})


@pytest.mark.parametrize("command", ["local", "coordinator"])
def test_the_hybrid_width_reaches_the_spec_and_keeps_u_fixed(command, capsys):
    """Issue 24's hybrid: --residual-width B adds B bottleneck numbers a token beside the k exact ones; U stays
    fixed (the spec says so), the summary line names it, and another codec refuses it in one sentence."""
    spec = spec_from_args(build_parser().parse_args([command, "--preset", "small", "--rank", "24",
                                                      "--residual-width", "8"]))
    assert (spec.hybrid, spec.boundary_width, spec.basis_updates, spec.refits_basis) == (True, 32, False, False)
    assert "8 bottleneck numbers a token" in spec_notes(spec)
    default = spec_from_args(build_parser().parse_args([command, "--preset", "small"]))
    assert not default.hybrid and "bottleneck numbers" not in spec_notes(default)
    # the hybrid warms up over 3x the preset's steps (docs/fidelity.md 3k) unless the run names its own
    assert (default.warmup_steps, spec.warmup_steps) == (100, 300)
    # and its stages before the last train at 0.1 x the lr (3n), where the subspace codec's train at 0.03
    assert (default.constrained_stage_lr_scale, spec.constrained_stage_lr_scale) == (0.03, 0.1)
    assert preset("small", residual_width=8, constrained_stage_lr_scale=0.03).constrained_stage_lr_scale == 0.03
    assert preset("tiny", residual_width=8).constrained_stage_lr_scale == 1.0  # below the width it applies from
    # at ~100x both made the hybrid worse (3n): 3 + 2 numbers of d=512 keep the subspace codec's stage lr and warm-up
    narrow = preset("small", rank=3, residual_width=2)
    assert (narrow.warmup_steps, narrow.constrained_stage_lr_scale) == (100, 0.03)
    assert preset("small", rank=30, residual_width=2).warmup_steps == 300  # exactly 16x still is tuned
    assert preset("small", residual_width=8, warmup_steps=50).warmup_steps == 50
    with pytest.raises(SpecError, match="subspace codec's hybrid"):
        spec_from_args(build_parser().parse_args([command, "--codec", "bottleneck", "--residual-width", "8"]))
    assert main([command, "--residual-width", "-2", "--no-dashboard"] if command == "local"
                else [command, "--residual-width", "-2"]) == 2
    assert "residual_width must be 0 (off)" in capsys.readouterr().err
