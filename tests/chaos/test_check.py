"""The chaos check on fabricated evidence: each kind of violation it exists to catch is reported, and clean
evidence gives zeros (so the zeros of a real chaos run mean something). Pure: no servers."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from bench.chaos import recorder
from bench.chaos.check import (
    GROUP_COUNTS,
    MIRROR_LAG_MARGIN_S,
    NOT_ACKNOWLEDGED,
    Committed,
    Sample,
    failures,
    merge,
    mirror_lag_bound_s,
    mirror_lag_s,
    names_refused,
    refused_launch_parks,
    subtract,
    unexplained_parks,
    verdict,
)
from bench.chaos.faults import KINDS, ONCE, plan
from bench.chaos.launcher import refused_launch
from bench.chaos.run import committed_of, failure_cause, failure_causes, zombie_outcomes
from bench.chaos.settings import settings_from_env
from bench.chaos.sinks import counts as sink_counts
from dagster_streamgroup.dagster import tags as sgt

SHARD = "t:0"


def payload(offset: int, version: int = 0) -> int:
    """The hash of the record produced at ``offset`` (``version`` > 0: another record at the same offset)."""
    return recorder.payload_hash(f"event {offset} v{version}".encode())


def acked(end: int, *, missing: tuple[int, ...] = ()) -> list[int]:
    """What the producer was acknowledged: a record at every offset of ``[0, end)`` but ``missing``."""
    return [NOT_ACKNOWLEDGED if o in missing else payload(o) for o in range(end)]


def record(start: int, end: int, *, seen: tuple[int, int] | None = None, raised: bool = False, run: str = "r1",
           backfill: bool = False, replaced: tuple[int, ...] = (), hashes: tuple[int, ...] | None = None,
           ) -> recorder.RangeRecord:  # fmt: skip
    first, last = seen if seen is not None else (start, end)
    offsets = range(first, last)
    return recorder.RangeRecord(
        run_id=run, run_key=None if backfill else f"k-{run}", member=None if backfill else "m", pid=1,
        shard=SHARD, start=start, end=end, intervals=recorder.intervals(offsets), seen=last - first,
        hashes=hashes if hashes is not None else tuple(payload(o, int(o in replaced)) for o in offsets),
        poison=0, raised=raised, backfill=backfill, at=0.0,
    )  # fmt: skip


def commit(start: int, end: int, run: str = "r1", *, repaired: bool = False, key: str | None = None) -> Committed:
    """A materialization of ``[start, end)`` by ``run``, under the run key its record carries."""
    return Committed(SHARD, start, end, run, repaired, key if key is not None else f"k-{run}")


def test_clean_evidence_gives_zeros() -> None:
    v = verdict(
        {SHARD: acked(100)},
        {SHARD: 0},
        [commit(0, 60), commit(60, 100, "r2")],
        [record(0, 60), record(60, 100, run="r2")],
        [Sample(1.0, "state", SHARD, 60), Sample(2.0, "state", SHARD, 100), Sample(2.0, "kafka", SHARD, 100)],
    )
    assert (v.lost, v.overlapping_commits, v.duplicate_materializations, v.backwards) == (0, 0, 0, 0)
    assert (v.unattributed_commits, v.unacknowledged_seen, v.payload_mismatches, v.unexplained_parks) == (0, 0, 0, 0)
    assert v.reprocessed_records == 0 and v.processed_records == 100 and not v.details


def test_a_gap_between_committed_ranges_is_lost() -> None:
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 50), commit(60, 100, "r2")],
                [record(0, 50), record(60, 100, run="r2")])  # fmt: skip
    assert v.lost == 10 and v.uncommitted == 10
    assert any("never committed [(50, 60)]" in d for d in v.details)


def test_the_tail_never_committed_is_lost() -> None:
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 90)], [record(0, 90), record(90, 100, run="r2")])
    assert v.lost == 10 and v.uncommitted == 10


def test_the_end_is_what_the_producer_was_acknowledged_not_the_watermark() -> None:
    """The broker lost its last 10 acknowledged records: its watermark is 90, and the group committed up to it.
    Against the acknowledged end, those 10 are lost."""
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 90)], [record(0, 90)])
    assert v.lost == 10 and v.uncommitted == 10


def test_a_committed_range_the_function_never_saw_is_lost() -> None:
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 100)], [record(0, 100, seen=(0, 80))])
    assert v.lost == 20 and v.committed_unseen == 20


def test_a_commit_by_a_run_that_read_nothing_is_caught_though_another_run_read_the_range() -> None:
    """Run r1 read the range and was killed before its commit; run r2 committed it without recording any read:
    the range counts as unseen, since only the committing run's record can vouch for it."""
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 100, "r2")], [record(0, 100, run="r1")])
    assert v.unattributed_commits == 1 and v.lost == 100 and v.committed_unseen == 100
    assert any("committed by run r2" in d and "left no record" in d for d in v.details)


def test_a_commit_whose_run_read_another_range_or_under_another_run_key_is_unattributed() -> None:
    other_range = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 100)], [record(0, 50), record(50, 100)])
    assert other_range.unattributed_commits == 1 and other_range.lost == 100
    other_key = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 100, key="k-zombie")], [record(0, 100)])
    assert other_key.unattributed_commits == 1 and other_key.lost == 100


def test_a_repaired_materialization_is_tied_to_the_run_it_repaired() -> None:
    materialization = {"shard": SHARD, "start": 0, "end": 100, "runId": "", "run_id": "r1", "run_key": "k-r1",
                       "repaired": True}  # fmt: skip
    c = committed_of(materialization)
    assert (c.run_id, c.run_key, c.repaired) == ("r1", "k-r1", True)
    assert verdict({SHARD: acked(100)}, {SHARD: 0}, [c], [record(0, 100)]).lost == 0
    unread = verdict({SHARD: acked(100)}, {SHARD: 0}, [c], [record(0, 100, run="r0")])
    assert unread.unattributed_commits == 1


def test_a_record_at_a_reused_offset_is_caught_by_its_payload() -> None:
    """Offsets 40 and 41 were acknowledged, lost by the broker and reused by later records: the run saw every
    offset, two of them with other payloads."""
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 100)], [record(0, 100, replaced=(40, 41))])
    assert v.payload_mismatches == 2 and v.lost == 2 and v.committed_unseen == 0
    assert any("another payload" in d and "[40, 41]" in d for d in v.details)


def test_a_record_without_its_hashes_vouches_for_nothing() -> None:
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 100)], [record(0, 100, hashes=())])
    assert v.lost == 100 and any("0 payload hashes for 100 offsets" in d for d in v.details)


def test_a_record_read_where_none_was_acknowledged_is_counted() -> None:
    v = verdict({SHARD: acked(100, missing=(7,))}, {SHARD: 0}, [commit(0, 100)], [record(0, 100)])
    assert v.unacknowledged_seen == 1 and v.lost == 0
    past_the_end = verdict({SHARD: acked(90)}, {SHARD: 0}, [commit(0, 100)], [record(0, 100)])
    assert past_the_end.unacknowledged_seen == 10


def test_a_call_that_raised_did_not_process_its_records() -> None:
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 100)], [record(0, 100, raised=True)])
    assert v.lost == 100
    retried = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 100, "r2")],
                      [record(0, 100, raised=True), record(0, 100, run="r2")])  # fmt: skip
    assert retried.lost == 0 and retried.reprocessed_records == 100


def test_overlapping_commits_are_counted() -> None:
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 50), commit(40, 100, "r2")],
                [record(0, 50), record(40, 100, run="r2")])  # fmt: skip
    assert v.overlapping_commits == 1 and v.lost == 0 and v.reprocessed_records == 10


def test_a_range_materialized_twice_is_a_duplicate() -> None:
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 100), commit(0, 100, repaired=True)],
                [record(0, 100)])  # fmt: skip
    assert v.duplicate_materializations == 1 and v.overlapping_commits == 0 and v.repaired_materializations == 1


def test_an_offset_going_back_is_counted_per_source() -> None:
    samples = [
        Sample(1.0, "state", SHARD, 50),
        Sample(2.0, "state", SHARD, 40),
        Sample(1.0, "kafka", SHARD, 30),
        Sample(2.0, "kafka", SHARD, 50),  # the mirror lags the state: not a step back
    ]
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 100)], [record(0, 100)], samples)
    assert v.backwards == 1
    assert any("state offset of t:0 went back from 50 to 40" in d for d in v.details)


def test_a_dead_letter_counts_only_where_a_backfill_processed_it() -> None:
    committed = [commit(0, 40), commit(50, 100, "r2")]
    records = [record(0, 40), record(50, 100, run="r2")]
    dead = [(SHARD, 40, 50)]
    assert verdict({SHARD: acked(100)}, {SHARD: 0}, committed, records, dead_letters=dead).lost == 10
    backfilled = [*records, record(40, 50, run="b", backfill=True)]
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, committed, backfilled, dead_letters=dead)
    assert v.lost == 0 and v.reprocessed_records == 0


def test_a_park_must_hold_an_injected_poison_record() -> None:
    poisoned = [(SHARD, 45)]
    assert unexplained_parks([(SHARD, 40, 50)], poisoned) == []
    assert unexplained_parks([(SHARD, 40, 50), (SHARD, 50, 60), ("t:1", 40, 50)], poisoned) == [
        (SHARD, 50, 60),
        ("t:1", 40, 50),
    ]
    v = verdict({SHARD: acked(100)}, {SHARD: 0}, [commit(0, 100)], [record(0, 100)],
                parks=[(SHARD, 40, 50), (SHARD, 40, 50), (SHARD, 60, 70)], poisoned=poisoned)  # fmt: skip
    assert v.parks == 2 and v.unexplained_parks == 1
    assert any("[60, 70) parked, holding no poison record" in d for d in v.details)


def clean_result() -> dict[str, Any]:
    """The JSON line of a chaos run that passed."""
    zero = dict.fromkeys(
        ["lost", "overlapping_commits", "duplicate_materializations", "backwards", "unattributed_commits",
         "unacknowledged_seen", "unexplained_parks", "broker_lost_acknowledged", "unrecorded_runs_left",
         "refused_launch_parks"], 0,
    )  # fmt: skip
    return {
        **zero,
        "second_group": {**dict.fromkeys(GROUP_COUNTS, 0), "messages": 6_000},
        "drain_s": 20.0,
        "faults": {"run_pause_zombie": 1, "poison": 1},
        "faults_missed": {},
        "faults_skipped_out_of_time": {},
        "errors": [],
        "zombies": [{"run": "z", "status": "FAILURE", "cause": "commit_refused"}],
        "kafka_behind_state_max_s": 12.0,
        "kafka_behind_state_limit_s": 90.0,
    }


def test_a_clean_run_has_no_failures() -> None:
    assert failures(clean_result()) == []


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"lost": 3}, "lost: 3"),
        ({"unattributed_commits": 1}, "unattributed_commits: 1"),
        ({"unacknowledged_seen": 2}, "unacknowledged_seen: 2"),
        ({"unexplained_parks": 1}, "unexplained_parks: 1"),
        ({"broker_lost_acknowledged": 5}, "broker_lost_acknowledged: 5"),
        ({"drain_s": None}, "did not drain"),
        ({"faults_missed": {"run_kill_after_commit": 1}}, "faults that found nothing to act on"),
        ({"faults_skipped_out_of_time": {"poison": 1}}, "never injected"),
        ({"errors": ["broker_restart: OSError: boom"]}, "error(s) of the driver"),
        ({"zombies": []}, "1 zombie fault(s) landed, 0 zombie run(s) recorded"),
        ({"zombies": [{"run": "z", "status": "SUCCESS", "cause": None}]}, "zombie run z ended SUCCESS"),
        ({"zombies": [{"run": "z", "status": "FAILURE", "cause": "poison"}]}, "its commit was not refused"),
        ({"kafka_behind_state_max_s": 90.5}, "behind the state's for 90.5 s, past the limit of 90.0 s"),
        ({"error": "RuntimeError: the deployment did not start"}, "the run broke"),
        ({"unrecorded_runs_left": 2}, "unrecorded_runs_left: 2"),
        ({"refused_launch_parks": 1}, "refused_launch_parks: 1"),
        ({"sinks": {"delta": {"lost": 0, "doubled": 2, "extra": 0}}}, "sink delta doubled: 2"),
        ({"sinks": {"kafka": {"lost": 1, "doubled": 0, "extra": 0}}}, "sink kafka lost: 1"),
        ({"sinks": {"kafka": {"lost": 0, "doubled": 0, "extra": 4}}}, "sink kafka extra: 4"),
    ],
)
def test_each_failure_of_a_run_is_reported(change: dict[str, Any], reason: str) -> None:
    found = failures({**clean_result(), **change})
    assert any(reason in f for f in found), found


@pytest.mark.parametrize("count", GROUP_COUNTS)
def test_the_second_group_is_judged_by_the_same_counts(count: str) -> None:
    result = clean_result()
    result["second_group"] = {**result["second_group"], count: 1}
    assert f"second_group {count}: 1" in failures(result)


def test_a_second_group_given_no_records_or_missing_evidence_fails_the_run() -> None:
    """A second group that consumed nothing would pass every count: its check would say nothing."""
    idle = clean_result()
    idle["second_group"] = {**idle["second_group"], "messages": 0}
    assert any("second group was given no records" in f for f in failures(idle))
    partial = clean_result()
    del partial["second_group"]["lost"]
    assert any("evidence of the second group missing: ['lost']" in f for f in failures(partial))


def test_a_park_blaming_a_refused_launch_is_counted_even_on_a_poison_range() -> None:
    """A refused launch read nothing: a range given up for it counts, whatever poison it also holds (the park
    matching would accept a park of a poisoned range). A relaunch's own failure (key ``k:l1``) does not blame the
    refused run ``k``."""
    reasons = {
        (SHARD, 0, 50): "run k failed 3 time(s); last error: run abc's launch raised LauncherOutageError",
        (SHARD, 50, 60): "run k2 failed 3 time(s); last error: run xyz ended FAILURE without reporting",
        (SHARD, 60, 70): "run k:l1 failed 3 time(s); last error: ValueError: poison records in t:0 (3)",
        ("t:1", 0, 10): "run k3 failed 3 time(s); last error: ValueError: poison records in t:1 (3)",
    }
    refused = [("abc", "k"), ("xyz", "k2")]
    assert refused_launch_parks(reasons, refused) == [(SHARD, 0, 50), (SHARD, 50, 60)]
    assert names_refused(reasons[(SHARD, 50, 60)], "xyz", None)
    assert not names_refused(reasons[(SHARD, 60, 70)], "abc", "k")
    assert refused_launch_parks(reasons, []) == []


def test_missing_evidence_fails_the_run() -> None:
    result = clean_result()
    del result["zombies"]
    assert failures(result) == ["evidence missing from the result: ['zombies']"]


def test_a_zombie_is_judged_by_how_its_own_run_ended() -> None:
    runs = [{"runId": "z", "status": "FAILURE"}, {"runId": "r", "status": "SUCCESS"}]
    outcomes = zombie_outcomes(["z"], runs, {"z": "commit_refused"})
    assert outcomes == [{"run": "z", "status": "FAILURE", "cause": "commit_refused"}]
    assert zombie_outcomes(["gone"], runs, {}) == [{"run": "gone", "status": None, "cause": None}]


def test_the_mirror_lag_bound_is_the_broker_pause_plus_six_ticks() -> None:
    assert mirror_lag_bound_s(5.0) == 60.0 and MIRROR_LAG_MARGIN_S == 30.0


def test_span_arithmetic() -> None:
    assert merge([(5, 10), (0, 5), (20, 30), (25, 26)]) == [(0, 10), (20, 30)]
    assert subtract([(0, 10), (20, 30)], [(5, 25)]) == [(0, 5), (25, 30)]
    assert recorder.intervals([3, 1, 2, 2, 7, 8]) == ((1, 4), (7, 9))


def test_the_fault_plan_is_seeded_and_draws_every_kind_first() -> None:
    assert plan(30, 7) == plan(30, 7) != plan(30, 8)
    assert set(plan(len(KINDS), 7)) == set(KINDS)
    assert len(plan(30, 7)) == 30 and len(plan(5, 7)) == 5


def test_a_member_is_removed_at_most_once_per_run() -> None:
    assert {"member_removed"} == ONCE and {"launcher_outage", "store_writer_pause", "two_groups"} <= set(KINDS)
    for seed in range(50):
        drawn = plan(120, seed)
        assert drawn.count("member_removed") == 1 and drawn.count("launcher_outage") > 1
    assert plan(3, 1, ("member_removed",)) == ["member_removed"]


def test_a_bad_deployment_setting_names_its_variable() -> None:
    env = {"CHAOS_BOOTSTRAP": "127.0.0.1:1", "CHAOS_TOPIC": "t", "CHAOS_GROUP": "g", "CHAOS_WORK_DIR": "/tmp"}
    with pytest.raises(ValueError, match="CHAOS_SPARK_REMOTE"):
        settings_from_env({**env, "CHAOS_SPARK_REMOTE": "http://x"})
    with pytest.raises(ValueError, match="CHAOS_MEMBERS"):
        settings_from_env({**env, "CHAOS_SPARK_REMOTE": "sc://127.0.0.1:1", "CHAOS_MEMBERS": "0"})
    with pytest.raises(ValueError, match="CHAOS_SECOND_MEMBERS"):
        settings_from_env({**env, "CHAOS_SPARK_REMOTE": "sc://127.0.0.1:1", "CHAOS_SECOND_MEMBERS": "0"})
    two = settings_from_env({**env, "CHAOS_SPARK_REMOTE": "sc://1.2.3.4:1", "CHAOS_SECOND_GROUP": "g2",
                             "CHAOS_SECOND_TOPIC": "t2"})  # fmt: skip
    assert (two.second_group, two.second_topic, two.second_members) == ("g2", "t2", 2)


def test_failed_runs_are_sorted_by_the_cause_their_messages_name() -> None:
    wrapped = ['Error occurred while executing op "chaos_ranges":', "commit refused: shard t:0 moved: it is now ..."]
    assert failure_cause(wrapped) == "commit_refused"
    assert failure_cause(["ValueError: poison records in t:3 (3) while poison-switch is on"]) == "poison"
    assert failure_cause(["run worker process 12 (forked) was killed by SIGKILL"]) == "worker_killed"
    assert failure_cause(["ContentionError: state 'k' changed under every one of 6 attempts"]) == "state_contention"
    assert failure_cause(["something else"]) == "other"


def test_a_run_whose_launch_was_refused_is_told_by_its_tag() -> None:
    """It never started: it has no events to read, so the deployment is never asked (``None`` would raise)."""
    runs = [{"runId": "r", "status": "FAILURE", "tags": {sgt.TAG_LAUNCH_FAILED: "LauncherOutageError"}},
            {"runId": "s", "status": "SUCCESS", "tags": {}}]  # fmt: skip
    assert failure_causes(None, runs) == ({"r": "launch_refused"}, [])  # type: ignore[arg-type]


def test_the_mirror_lag_is_the_longest_stretch_kafka_stays_below_the_state() -> None:
    samples = [Sample(0.0, "state", SHARD, 0), *(Sample(t, "state", SHARD, 10) for t in (1.0, 2.0, 3.0, 4.0))]
    samples += [Sample(0.5, "kafka", SHARD, 0), Sample(3.5, "kafka", SHARD, 10)]
    assert mirror_lag_s(samples) == {SHARD: 2.0}  # behind from the state's commit at 1.0 to its last sample, 3.0


def test_no_kafka_offset_is_behind_only_once_the_state_moved_past_its_start() -> None:
    """A shard positioned at 0 and not committed for 100 s has nothing to mirror; once it commits, Kafka's missing
    offset is behind until the mirror arrives."""
    waiting = [Sample(float(t), "state", SHARD, 0) for t in range(0, 101, 10)]
    assert mirror_lag_s(waiting) == {}
    committed = [*waiting, *(Sample(float(t), "state", SHARD, 50) for t in range(110, 141, 10))]
    assert mirror_lag_s(committed) == {SHARD: 30.0}
    assert mirror_lag_s([*committed, Sample(125.0, "kafka", SHARD, 50)]) == {SHARD: 10.0}  # last behind at 120


def test_a_refused_launch_is_logged_with_the_ranges_and_attempts_its_run_config_holds() -> None:
    config = {"ops": {"chaos_ranges": {"config": {"member": "m@d", "run_key": "k", "ranges": [
        {"shard": "t:0", "start": 5, "end": 9, "attempt": 1, "epoch": 3}, {"shard": "t:1", "start": 0, "end": 4},
    ]}}}}  # fmt: skip
    tags = {sgt.TAG_GROUP: "g", sgt.TAG_MEMBER: "m@d"}  # a member run names no run key in its tags: its config does
    refused = refused_launch("r", tags, config)
    assert (refused.run_id, refused.group, refused.member, refused.run_key) == ("r", "g", "m@d", "k")
    assert [(x.shard, x.start, x.end, x.attempt, x.epoch) for x in refused.ranges] == [
        ("t:0", 5, 9, 1, 3),
        ("t:1", 0, 4, 0, 0),
    ]
    assert refused_launch("b", {}, {}).ranges == ()  # a backfill or another job: no member ranges


def test_sink_counts_tell_lost_doubled_and_extra_records_apart() -> None:
    """The chaos run's count of each sink (``bench.chaos.sinks``): every record of [0, high) once, dead-lettered
    ranges left out."""
    found = Counter({("t:0", 0): 1, ("t:0", 1): 2, ("t:0", 3): 1, ("t:1", 0): 1, ("t:9", 0): 1, ("t:1", 5): 1})
    got = sink_counts(found, {"t:0": 4, "t:1": 6}, [("t:1", 1, 6)])
    # lost t:0:2, doubled t:0:1, extra t:9:0; t:1:5 is in the dead-lettered range: not counted either way
    assert got == {"records": 5, "entries": 6, "lost": 1, "doubled": 1, "extra": 1}
    assert sink_counts(Counter({("t:0", o): 1 for o in range(4)}), {"t:0": 4}, [])["lost"] == 0
    assert failures({**clean_result(), "sinks": {"delta": sink_counts(found, {"t:0": 4}, [])}})
