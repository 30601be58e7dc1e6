"""The churn bench's analysis (swarm/bench/churn/report.py) on synthetic records: lost, doubled and
re-driven steps, rollbacks and their cost, goodput, gaps, failover, replica agreement, and the
log lines it reads; and its one-sentence refusal where it cannot build its hosts."""
from __future__ import annotations

import datetime as dt
import io

import pytest
import torch

from swarm.bench.churn.report import (
    Kill,
    LogEvent,
    Span,
    StateHash,
    StepRecord,
    agreement,
    analyse,
    classify,
    coverage,
    field_hashes,
    log_events,
    rollbacks,
    state_hash,
)
from swarm.cli import main

T0 = 1_800_000_000.0  # calm phase starts here


def steps(first: int, last: int, start: float, every: float, head: str, shift: float = 0.0) -> list[StepRecord]:
    """Records of steps first..last; the loss is a function of the step (the same weights give the
    same loss) plus `shift` (other weights)."""
    return [StepRecord(start + i * every, s, head, 5.0 - 0.01 * s + shift)
            for i, s in enumerate(range(first, last + 1))]


def order(t: float, target: int, until: int | None = None) -> LogEvent:
    return LogEvent(t, "h0", "rollback", None, target, until)


def test_a_clean_run_has_nothing_lost_or_doubled_and_failover_is_the_next_record_of_another_head():
    recs = steps(1, 60, T0, 1.0, "a") + steps(61, 100, T0 + 67.0, 1.0, "b")  # a killed at T0+60, b leads at T0+67
    kill = Kill(T0 + 60.5, "a", 0, leader=True, targeted=True, newcomer="c", gone_s=4.0)
    s = analyse(recs, [kill], [], [], [], 2, (T0, T0 + 30), (T0 + 30, T0 + 110))
    assert s["lost_steps"] == [] and s["doubled_steps"] == [] and s["redriven_records"] == 0
    assert s["steps"] == 100 and s["records"] == 100
    assert s["failover_s"] == [pytest.approx(6.5)] and s["failover_median_s"] == pytest.approx(6.5)
    assert s["kills"][0]["next_step_s"] == pytest.approx(6.5) and s["leader_kills"] == 1
    assert s["longest_gap_s"] == pytest.approx(8.0)  # step 60 at T0+59 to step 61 at T0+67
    assert s["longest_gap_at_s"] == pytest.approx(59.0)
    # calm: 1 step/s from the first record; churn: steps 30 -> 100 over 80 s
    assert s["goodput"]["calm_steps_per_min"] == pytest.approx(60.0)
    assert s["goodput"]["churn_steps_per_min"] == pytest.approx((100 - 31) / (80 / 60))
    assert s["goodput"]["ratio"] == pytest.approx((100 - 31) / (80 / 60) / 60.0)


def test_a_random_kill_has_no_failover_but_a_time_to_the_next_step():
    recs = steps(1, 20, T0, 1.0, "a")
    s = analyse(recs, [Kill(T0 + 10.2, "x", 1, False, False, "y")], [], [], [], 2, (T0, T0 + 5), (T0 + 5, T0 + 19))
    assert s["failover_s"] == [] and s["failover_median_s"] is None
    assert s["kills"][0]["next_step_s"] == pytest.approx(0.8) and s["kills"][0]["failover_s"] is None


def test_a_missing_step_is_lost_and_two_standing_records_of_one_step_are_doubled():
    recs = steps(1, 4, T0, 1.0, "a") + steps(6, 8, T0 + 5, 1.0, "a") + [StepRecord(T0 + 8, 8, "b", 4.9)]
    c = classify(recs, [])
    assert c["lost"] == [5] and c["doubled"] == [8] and c["repeated"] == [] and c["superseded"] == []
    # a head going back to a recorded step without any rollback, on other weights: every step it repeats
    # is doubled
    back = steps(1, 10, T0, 1.0, "a") + steps(7, 12, T0 + 12, 1.0, "b", shift=0.02)
    assert classify(back, [])["doubled"] == [7, 8, 9, 10]


def test_a_step_driven_again_on_the_same_weights_counts_once_as_repeated():
    # a wrote step 10 and died before every replica applied it; b drove step 10 again on the same weights
    # (its fp32 loss a hair off: the microbatches summed in another order)
    recs = steps(1, 10, T0, 1.0, "a") + [StepRecord(T0 + 16, 10, "b", 4.9 * (1 + 2e-7))] + steps(11, 14, T0 + 17,
                                                                                                   1.0, "b")
    c = classify(recs, [])
    assert c["repeated"] == [10] and c["doubled"] == [] and c["lost"] == []
    s = analyse(recs, [], [], [], [], 2, (T0, T0 + 5), (T0 + 5, T0 + 21))
    assert s["repeated_steps"] == [10] and s["doubled_steps"] == [] and s["steps"] == 14


def test_steps_re_driven_after_a_rollback_are_not_doubled_and_the_rollback_costs_the_steps_it_undid():
    recs = steps(1, 10, T0, 1.0, "a") + steps(8, 15, T0 + 20, 1.0, "b")  # rolled back to 7 between
    rb = order(T0 + 15.5, 7, 10)
    c = classify(recs, [rb])
    assert c["doubled"] == [] and c["lost"] == [] and c["costs"] == [3]
    assert sorted(r.step for r in c["superseded"]) == [8, 9, 10]
    assert all(r.head == "a" for r in c["superseded"])  # the records before the rollback are the ones undone
    assert {s: [r.head for r in rs] for s, rs in c["standing"].items() if s >= 8} == {s: ["b"] for s in range(8, 16)}
    s = analyse(recs, [], [rb], [], [], 2, (T0, T0 + 12), (T0 + 12, T0 + 30))
    assert s["rollbacks"] == [{"at_s": 15.5, "to_step": 7, "steps_lost": 3}] and s["rollback_steps"] == 3
    assert s["redriven_records"] == 3 and s["steps"] == 15
    # goodput counts net progress: step 10 at T0+12 to step 15 at T0+30
    assert s["goodput"]["churn_steps_per_min"] == pytest.approx(5 / (18 / 60))


def test_a_rollback_before_a_double_is_matched_only_to_the_steps_it_undid():
    # rolled back to 7 and re-driven, then later a head records step 15 a second time: doubled
    recs = steps(1, 10, T0, 1.0, "a") + steps(8, 15, T0 + 20, 1.0, "b") + [StepRecord(T0 + 40, 15, "c", 4.0)]
    c = classify(recs, [order(T0 + 15.5, 7)])
    assert c["doubled"] == [15] and len(c["superseded"]) == 3


def test_a_rollback_the_run_did_not_outlive_undoes_its_steps_without_re_driving_them():
    recs = steps(1, 10, T0, 1.0, "a")
    c = classify(recs, [order(T0 + 20, 6)])
    assert sorted(r.step for r in c["superseded"]) == [7, 8, 9, 10] and c["costs"] == [4]
    assert max(c["standing"]) == 6 and c["lost"] == [] and c["doubled"] == []


def test_replicas_rollback_lines_count_as_one_rollback_where_the_leaders_order_is_missing():
    lines = [LogEvent(T0 + 10, "h1", "rolled_back", 0, 7), LogEvent(T0 + 11, "h2", "rolled_back", 1, 7),
             LogEvent(T0 + 11, "h3", "rolled_back", 2, 7)]
    assert [(e.kind, e.step) for e in rollbacks(lines)] == [("rollback", 7)]
    with_order = [*lines, LogEvent(T0 + 10, "h0", "rollback", None, 7, 12)]
    assert [(e.peer, e.step, e.until) for e in rollbacks(with_order)] == [("h0", 7, 12)]
    later = [*lines, LogEvent(T0 + 300, "h4", "rolled_back", 0, 40)]  # another rollback, minutes later
    assert [e.step for e in rollbacks(later)] == [7, 40]


def test_log_lines_give_resets_and_rollbacks_at_their_local_second():
    start = dt.datetime(2026, 11, 26, 23, 59, 50).timestamp()  # the run passes midnight
    text = "\n".join([
        "23:59:58 WARNING swarm.replicas.replica: stage 0 had no live replica and this peer has no checkpoint of "
        "it: the stage starts again from its initial weights, at the swarm's step 622",
        "00:00:03 WARNING peer.state.rollback: stages 1 came back at step 600 (restored from a snapshot), behind the "
        "swarm's step 622: every stage rolls back to step 600 and steps 601-622 are driven again",
        "00:00:04 WARNING peer.state.rollback: stage 2: rolled back to step 600",
        "00:00:05 INFO swarm.replicas.replica: step 601 loss 1.6",
        "  a traceback line without a time",
    ])
    events = log_events("h3", text, start)
    assert [(e.kind, e.stage, e.step, e.until) for e in events] == [
        ("reset", 0, 622, None), ("rollback", None, 600, 622), ("rolled_back", 2, 600, None)]
    assert events[0].time == pytest.approx(start + 8.5)
    assert events[1].time == pytest.approx(start + 13.5)  # the next day
    assert all(e.peer == "h3" for e in events)
    s = analyse(steps(1, 30, start, 1.0, "a"), [], events, [], [], 3, (start, start + 10), (start + 10, start + 40))
    assert s["stage_resets"] == [{"at_s": 8.5, "peer": "h3", "stage": 0, "step": 622}]
    assert [r["to_step"] for r in s["rollbacks"]] == [600]


def test_a_replica_that_restored_its_stage_foresees_a_rollback_but_only_the_leaders_order_is_one():
    # a joiner refused its donor's state and restored stage 0 from a snapshot; a live replica led on, and no
    # head ordered a rollback: the steps it recorded stand (the joiner, found behind, downloaded again)
    start = dt.datetime(2026, 12, 7, 1, 23, 0).timestamp()
    text = ("01:23:47 WARN swarm.replicas.state_source: stage 0 had no live replica: restored from its snapshot at "
            "step 300; the swarm is at step 379, so every stage rolls back to step 300 and the steps after it are "
            "driven again\n"
            "01:23:50 WARN swarm.replicas.state_source: stage 2 had no live replica: restored from its initial state "
            "(the swarm has no snapshot yet); the swarm is at step 4, so every stage rolls back to step 0 and the "
            "steps after it are driven again")
    events = log_events("h8", text, start)
    assert [(e.kind, e.stage, e.step) for e in events] == [("restore", 0, 300), ("restore", 2, 0)]
    s = analyse(steps(1, 400, start, 0.2, "a"), [], events, [], [], 3, (start, start + 10), (start + 10, start + 80))
    assert s["rollbacks"] == [] and s["lost_steps"] == [] and s["redriven_records"] == 0 and s["steps"] == 400
    assert s["stage_restores"] == [{"at_s": 47.5, "peer": "h8", "stage": 0, "from_step": 300},
                                   {"at_s": 50.5, "peer": "h8", "stage": 2, "from_step": 0}]


def _h(peer: str, stage: int, step: int, module: str, stat: str = "s") -> StateHash:
    return StateHash(peer, stage, step, {"module": module, "optimizer": "o" + module, "stat": stat})


def test_replica_agreement_compares_same_stage_same_step_checkpoints_of_different_peers():
    hashes = [_h("a", 1, 10, "x"), _h("b", 1, 10, "x"), _h("c", 1, 10, "x"),
              _h("a", 1, 20, "y"), _h("d", 0, 20, "z")]  # alone at its (stage, step)
    same = agreement(hashes)
    assert same == {"groups_compared": 1, "pairs_compared": 3, "bit_identical": True, "groups_differing": 0,
                    "differing": [], "other_fields_differing": {}}
    differ = agreement([*hashes, _h("b", 1, 20, "w")])
    assert differ["groups_compared"] == 2 and not differ["bit_identical"] and differ["groups_differing"] == 1
    assert differ["differing"] == [{"stage": 1, "step": 20, "fields": ["module", "optimizer"],
                                    "hashes": {"a": {"module": "y", "optimizer": "oy"},
                                               "b": {"module": "w", "optimizer": "ow"}}}]
    # weights and optimizer state equal, the re-fit statistic not: bit-identical, the field counted apart
    stat = agreement([*hashes, _h("b", 1, 20, "y", stat="t")])
    assert stat["bit_identical"] and stat["other_fields_differing"] == {"stat": 1}
    assert agreement([])["bit_identical"] is False  # nothing compared proves nothing
    # a peer's last checkpoint of a step is the one that counts (it may write one again after a rollback)
    assert agreement([_h("a", 1, 5, "old"), _h("a", 1, 5, "x"), _h("b", 1, 5, "x")])["bit_identical"]


def test_field_hashes_hash_each_top_level_field():
    state = {"step": 3, "module": {"w": torch.ones(2)}, "stat": torch.zeros(2, dtype=torch.float64)}
    fields = field_hashes(state)
    assert set(fields) == {"step", "module", "stat"} and fields["module"] == state_hash(state["module"])
    changed = field_hashes({**state, "stat": torch.tensor([0.0, 5e-14], dtype=torch.float64)})
    assert changed["stat"] != fields["stat"] and changed["module"] == fields["module"]


def test_state_hash_sees_every_tensor_byte_and_not_the_layout_of_the_file():
    torch.manual_seed(0)
    state = {"step": 12, "module": {"w": torch.randn(4, 3), "b": torch.randn(3).bfloat16()},
             "optimizer": {"state": {0: {"exp_avg": torch.randn(4, 3)}}, "param_groups": [{"lr": 0.003}]},
             "U": None, "scalar": torch.tensor(2.5)}
    buf = io.BytesIO()
    torch.save({k: state[k] for k in reversed(list(state))}, buf)  # keys in another order, through a file
    again = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    assert state_hash(again) == state_hash(state)
    changed = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    changed["optimizer"]["state"][0]["exp_avg"][3, 2] += 1e-7
    assert state_hash(changed) != state_hash(state)
    assert state_hash({**state, "step": 13}) != state_hash(state)
    flipped = {**state, "module": {**state["module"], "b": state["module"]["b"].clone()}}
    flipped["module"]["b"].view(torch.int16)[0] ^= 1  # one bit of a bf16 value
    assert state_hash(flipped) != state_hash(state)


def test_coverage_says_how_long_the_least_served_stage_had_how_many_replicas():
    spans = [Span("a", 0, T0, T0 + 100), Span("b", 0, T0, T0 + 40), Span("c", 1, T0, T0 + 100),
             Span("d", 1, T0, T0 + 100), Span("e", 0, T0 + 70, T0 + 100)]
    # stage 0: 2 until 40, 1 until 70, then 2 again; stage 1 always 2
    assert coverage(spans, 2, T0 + 10, T0 + 100) == {"1": 30.0, "2": 60.0}
    assert coverage(spans, 3, T0 + 10, T0 + 100) == {"0": 90.0}  # stage 2 never had a peer


def test_without_root_the_bench_says_so_in_one_sentence(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("swarm.bench.churn.bench.os.geteuid", lambda: 1000)
    assert main(["bench", "churn", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: swarm bench churn needs root: it puts every peer on a host of its own (a network "
                   "namespace); run it as root.")
    assert not list(tmp_path.iterdir())  # nothing written, nothing started


@pytest.mark.parametrize("flags, says", [(["--hosts", "5"], "must be a multiple of --replicas"),
                                         (["--bandwidth", "unlimited"], "is unlimited"),
                                         (["--period", "0"], "must be positive")])
def test_bad_flags_are_refused_before_anything_starts(flags, says, tmp_path, capsys):
    assert main(["bench", "churn", "--out", str(tmp_path), *flags]) == 2
    assert says in capsys.readouterr().err
