"""What a typed run's records do to the group state: a range parked at once (no retries: they would meet the same
records), the run's other ranges retried with their bounds and no attempt counted, and the undecodable records of a
committed range kept as a dead letter in the commit's own write."""

from __future__ import annotations

import json

from dagster_streamgroup import protocol
from dagster_streamgroup.member import DeadRecords, _with_dead_records
from dagster_streamgroup.protocol import EventKind, Watermark, decode_state, encode_state
from tests.unit.protocol_helpers import balanced_start, policy_with, report

POLICY = policy_with(heartbeat_interval_s=5, session_timeout_s=20, max_records_per_run=100, max_attempts=3)
MARKS = {f"s{i}": Watermark(low=0, high=1000) for i in range(2)}


def launched() -> tuple[protocol.GroupState, list[protocol.Launch]]:
    state = balanced_start(2, ("a",), POLICY)
    return protocol.plan(state, "a", 5.0, MARKS, POLICY)


def test_a_range_is_parked_at_once_and_the_runs_other_range_is_retried_without_an_attempt() -> None:
    state, launches = launched()
    by_shard = {x.shard: x for x in launches}
    state, outcome = protocol.park_now(state, report(by_shard["s0"]), "offset 3: writer schema cannot be resolved", 6)
    assert outcome is protocol.FailOutcome.PARKED
    parked = state.shards["s0"].parked
    assert parked is not None and (parked.start, parked.end) == (0, 50) and "offset 3" in parked.reason
    assert state.shards["s0"].committed == 0 and state.shards["s0"].inflight is None
    assert [e.kind for e in state.events if e.shard == "s0"][-1] is EventKind.PARKED
    again, ignored = protocol.park_now(state, report(by_shard["s0"]), "again", 7)
    assert ignored is protocol.FailOutcome.IGNORED and again == state, "a report handled already changes nothing"
    state, relaunches = protocol.launch_failed(state, [report(by_shard["s1"])], "another range was parked", 6, POLICY)
    inflight = state.shards["s1"].inflight
    assert relaunches == 1 and inflight is not None and (inflight.start, inflight.end, inflight.attempt) == (0, 50, 0)


def test_dead_records_are_kept_in_the_write_that_commits_the_range_and_survive_encoding() -> None:
    state, launches = launched()
    reports = [report(x) for x in launches]
    committed, outcome = protocol.commit_run(state, reports)
    dead = {"s0": DeadRecords(2, (protocol.DeadRecord(4, "value: no magic byte", None, "eyJ9"),), "2 of 50 records")}
    written = _with_dead_records(committed, reports, outcome, dead, 8.0)
    assert written is not None and written.shards["s0"].committed == 50
    (letter,) = written.dead_letters
    assert (letter.shard, letter.start, letter.end, letter.dead_records, letter.run_key) == (
        "s0", 0, 50, 2, reports[0].run_key,
    )  # fmt: skip
    assert letter.records[0].offset == 4 and letter.records[0].value == "eyJ9"
    assert decode_state(encode_state(written), where="t") == written
    replayed, again = protocol.commit_run(written, reports)
    assert again.accepted and all(o.already_committed for o in again.outcomes.values())
    assert _with_dead_records(replayed, reports, again, dead, 9.0) == replayed, "a replayed commit adds nothing"


def test_a_state_of_schema_4_reads_with_dead_letters_of_no_records() -> None:
    state, launches = launched()
    state, _ = protocol.fail_run(
        state, [report(launches[0])], "x", 6, policy_with(max_attempts=1, after_max_attempts="dead_letter")
    )
    raw = json.loads(encode_state(state))
    raw["schema_version"] = 4
    for letter in raw["dead_letters"]:
        del letter["records"], letter["dead_records"]
    old = decode_state(json.dumps(raw), where="t")
    assert old.dead_letters and old.dead_letters[0].records == () and old.dead_letters[0].dead_records == 0
