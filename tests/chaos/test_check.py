"""The chaos check on fabricated evidence: each kind of violation it exists to catch is reported, and clean
evidence gives zeros (so the zeros of a real chaos run mean something). Pure: no servers."""

from __future__ import annotations

import pytest

from bench.chaos import recorder
from bench.chaos.check import Committed, Sample, merge, mirror_lag_s, subtract, verdict
from bench.chaos.faults import KINDS, plan
from bench.chaos.run import failure_cause
from bench.chaos.settings import settings_from_env

SHARD = "t:0"


def record(start: int, end: int, *, seen: tuple[int, int] | None = None, raised: bool = False, run: str = "r1",
           backfill: bool = False) -> recorder.RangeRecord:  # fmt: skip
    first, last = seen if seen is not None else (start, end)
    return recorder.RangeRecord(
        run_id=run, run_key=None if backfill else f"k-{run}", member=None if backfill else "m", pid=1,
        shard=SHARD, start=start, end=end, intervals=recorder.intervals(range(first, last)), seen=last - first,
        poison=0, raised=raised, backfill=backfill, at=0.0,
    )  # fmt: skip


def test_clean_evidence_gives_zeros() -> None:
    v = verdict(
        {SHARD: 100},
        {SHARD: 0},
        [Committed(SHARD, 0, 60), Committed(SHARD, 60, 100)],
        [record(0, 60), record(60, 100, run="r2")],
        [Sample(1.0, "state", SHARD, 60), Sample(2.0, "state", SHARD, 100), Sample(2.0, "kafka", SHARD, 100)],
    )
    assert (v.lost, v.overlapping_commits, v.duplicate_materializations, v.backwards) == (0, 0, 0, 0)
    assert v.reprocessed_records == 0 and v.processed_records == 100 and not v.details


def test_a_gap_between_committed_ranges_is_lost() -> None:
    v = verdict({SHARD: 100}, {SHARD: 0}, [Committed(SHARD, 0, 50), Committed(SHARD, 60, 100)],
                [record(0, 50), record(60, 100)])  # fmt: skip
    assert v.lost == 10 and v.uncommitted == 10
    assert any("never committed [(50, 60)]" in d for d in v.details)


def test_the_tail_never_committed_is_lost() -> None:
    v = verdict({SHARD: 100}, {SHARD: 0}, [Committed(SHARD, 0, 90)], [record(0, 100)])
    assert v.lost == 10


def test_a_committed_range_the_function_never_saw_is_lost() -> None:
    v = verdict({SHARD: 100}, {SHARD: 0}, [Committed(SHARD, 0, 100)], [record(0, 100, seen=(0, 80))])
    assert v.lost == 20 and v.committed_unseen == 20


def test_a_call_that_raised_did_not_process_its_records() -> None:
    v = verdict({SHARD: 100}, {SHARD: 0}, [Committed(SHARD, 0, 100)], [record(0, 100, raised=True)])
    assert v.lost == 100
    retried = verdict({SHARD: 100}, {SHARD: 0}, [Committed(SHARD, 0, 100)],
                      [record(0, 100, raised=True), record(0, 100, run="r2")])  # fmt: skip
    assert retried.lost == 0 and retried.reprocessed_records == 100


def test_overlapping_commits_are_counted() -> None:
    v = verdict({SHARD: 100}, {SHARD: 0}, [Committed(SHARD, 0, 50), Committed(SHARD, 40, 100)],
                [record(0, 50), record(40, 100, run="r2")])  # fmt: skip
    assert v.overlapping_commits == 1 and v.lost == 0 and v.reprocessed_records == 10


def test_a_range_materialized_twice_is_a_duplicate() -> None:
    v = verdict({SHARD: 100}, {SHARD: 0}, [Committed(SHARD, 0, 100), Committed(SHARD, 0, 100, repaired=True)],
                [record(0, 100)])  # fmt: skip
    assert v.duplicate_materializations == 1 and v.overlapping_commits == 0 and v.repaired_materializations == 1


def test_an_offset_going_back_is_counted_per_source() -> None:
    samples = [
        Sample(1.0, "state", SHARD, 50),
        Sample(2.0, "state", SHARD, 40),
        Sample(1.0, "kafka", SHARD, 30),
        Sample(2.0, "kafka", SHARD, 50),  # the mirror lags the state: not a step back
    ]
    v = verdict({SHARD: 100}, {SHARD: 0}, [Committed(SHARD, 0, 100)], [record(0, 100)], samples)
    assert v.backwards == 1
    assert any("state offset of t:0 went back from 50 to 40" in d for d in v.details)


def test_a_dead_letter_counts_only_where_a_backfill_processed_it() -> None:
    committed = [Committed(SHARD, 0, 40), Committed(SHARD, 50, 100)]
    records = [record(0, 40), record(50, 100, run="r2")]
    dead = [(SHARD, 40, 50)]
    assert verdict({SHARD: 100}, {SHARD: 0}, committed, records, dead_letters=dead).lost == 10
    backfilled = [*records, record(40, 50, run="b", backfill=True)]
    v = verdict({SHARD: 100}, {SHARD: 0}, committed, backfilled, dead_letters=dead)
    assert v.lost == 0 and v.reprocessed_records == 0


def test_span_arithmetic() -> None:
    assert merge([(5, 10), (0, 5), (20, 30), (25, 26)]) == [(0, 10), (20, 30)]
    assert subtract([(0, 10), (20, 30)], [(5, 25)]) == [(0, 5), (25, 30)]
    assert recorder.intervals([3, 1, 2, 2, 7, 8]) == ((1, 4), (7, 9))


def test_the_fault_plan_is_seeded_and_draws_every_kind_first() -> None:
    assert plan(30, 7) == plan(30, 7) != plan(30, 8)
    assert set(plan(len(KINDS), 7)) == set(KINDS)
    assert len(plan(30, 7)) == 30 and len(plan(5, 7)) == 5


def test_a_bad_deployment_setting_names_its_variable() -> None:
    env = {"CHAOS_BOOTSTRAP": "127.0.0.1:1", "CHAOS_TOPIC": "t", "CHAOS_GROUP": "g", "CHAOS_WORK_DIR": "/tmp"}
    with pytest.raises(ValueError, match="CHAOS_SPARK_REMOTE"):
        settings_from_env({**env, "CHAOS_SPARK_REMOTE": "http://x"})
    with pytest.raises(ValueError, match="CHAOS_MEMBERS"):
        settings_from_env({**env, "CHAOS_SPARK_REMOTE": "sc://127.0.0.1:1", "CHAOS_MEMBERS": "0"})


def test_failed_runs_are_sorted_by_the_cause_their_messages_name() -> None:
    wrapped = ['Error occurred while executing op "chaos_ranges":', "commit refused: shard t:0 moved: it is now ..."]
    assert failure_cause(wrapped) == "commit_refused"
    assert failure_cause(["ValueError: poison records in t:3 (3) while poison-switch is on"]) == "poison"
    assert failure_cause(["run worker process 12 (forked) was killed by SIGKILL"]) == "worker_killed"
    assert failure_cause(["ContentionError: state 'k' changed under every one of 6 attempts"]) == "state_contention"
    assert failure_cause(["something else"]) == "other"


def test_the_mirror_lag_is_the_longest_stretch_kafka_stays_below_the_state() -> None:
    samples = [Sample(t, "state", SHARD, 10) for t in (0.0, 1.0, 2.0, 3.0)]
    samples += [Sample(0.5, "kafka", SHARD, 5), Sample(2.5, "kafka", SHARD, 10)]
    assert mirror_lag_s(samples) == {SHARD: 2.0}
