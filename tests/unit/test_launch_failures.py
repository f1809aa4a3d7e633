"""A launch that raised is not an attempt: the ranges keep their bounds, relaunch under a new run key after a
doubling backoff, and a launcher outage parks and dead-letters nothing."""

from __future__ import annotations

from dagster_streamgroup import protocol
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.protocol import EventKind, Watermark
from tests.unit.protocol_helpers import balanced_start, policy_with, report

POLICY = policy_with(
    heartbeat_interval_s=5, session_timeout_s=20, max_records_per_run=100, max_attempts=2,
    after_max_attempts="dead_letter",
)  # fmt: skip
MARKS = {f"s{i}": Watermark(low=0, high=1000) for i in range(2)}


def launched(now: float = 5.0) -> tuple[protocol.GroupState, list[protocol.Launch]]:
    state = balanced_start(2, ("a",), POLICY)
    return protocol.plan(state, "a", now, MARKS, POLICY)


def test_an_outage_of_many_launches_parks_and_dead_letters_nothing() -> None:
    state, launches = launched()
    assert len({x.run_key for x in launches}) == 1 and len(launches) == 2, "one run over both shards"
    first_key = launches[0].run_key
    now, keys, waits = 5.0, [first_key], []
    for n in range(1, 8):  # well past max_attempts (2): none of these is an attempt
        state, relaunches = protocol.launch_failed(state, [report(x) for x in launches], "ApiException", now, POLICY)
        assert relaunches == n
        assert protocol.held_back(state, "a", now) == {state.shards["s0"].inflight.run_key}  # type: ignore[union-attr]
        launches = protocol.inflight_launches(state, "a")
        assert [(x.shard, x.start, x.end) for x in launches] == [("s0", 0, 50), ("s1", 0, 50)], "same bounds"
        assert {x.attempt for x in launches} == {0}
        keys.append(launches[0].run_key)
        not_before = state.shards["s0"].inflight.not_before  # type: ignore[union-attr]
        assert not_before is not None
        waits.append(not_before - now)
        now = not_before
        assert protocol.held_back(state, "a", now) == set(), "requested again once the backoff is over"
    assert len(set(keys)) == len(keys), "each relaunch is a new run key"
    assert keys[1] == f"{first_key}:l1" and keys[-1] == f"{first_key}:l7"
    assert waits == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0], "doubling from the heartbeat up to 60 s"
    assert state.dead_letters == () and all(s.parked is None for s in state.shards.values())
    assert [e.kind for e in state.events].count(EventKind.LAUNCH_FAILING) == 1, "one event at the third in a row"
    failing = next(e for e in state.events if e.kind == EventKind.LAUNCH_FAILING)
    assert "3 times in a row" in failing.detail and "ApiException" in failing.detail

    # The launcher recovers: the run commits every range it was planned with, and nothing is lost.
    outcome = protocol.commit_run(state, [report(x) for x in launches])[1]
    assert outcome.accepted
    state = protocol.commit_run(state, [report(x) for x in launches])[0]
    assert {s: state.shards[s].committed for s in MARKS} == {"s0": 50, "s1": 50}
    state, following = protocol.plan(state, "a", now, MARKS, POLICY)
    assert [(x.start, x.attempt) for x in following] == [(50, 0), (50, 0)]
    assert ":l" not in following[0].run_key, "a new range starts without relaunches"


def test_a_stale_report_changes_nothing_and_a_real_failure_still_counts() -> None:
    state, launches = launched()
    stale = [report(x).model_copy(update={"run_key": "other"}) for x in launches]
    assert protocol.launch_failed(state, stale, "x", 6.0, POLICY) == (state, 0)
    state, _ = protocol.launch_failed(state, [report(x) for x in launches], "x", 6.0, POLICY)
    relaunched = protocol.inflight_launches(state, "a")
    # The relaunch started and its worker failed: that is an attempt, on the same bounds.
    state, outcomes = protocol.fail_run(state, [report(x) for x in relaunched], "boom", 20.0, POLICY)
    assert set(outcomes.values()) == {protocol.FailOutcome.RETRY}
    assert {s.attempt for s in state.shards.values()} == {1}
    assert {s.retry_end for s in state.shards.values()} == {50}


def test_a_range_whose_shard_moved_is_released_with_its_bounds() -> None:
    state, launches = launched()
    moved = state.shards["s1"]
    state = state.model_copy(
        update={"shards": {**state.shards, "s1": protocol.state.handed_over(moved, None, inflight=moved.inflight)}}
    )
    state, relaunches = protocol.launch_failed(state, [report(x) for x in launches], "x", 6.0, POLICY)
    assert relaunches == 1
    assert state.shards["s1"].inflight is None and state.shards["s1"].retry_end == 50, "the next owner reads [0, 50)"
    assert state.shards["s0"].inflight is not None and state.shards["s0"].inflight.relaunches == 1


def test_dagster_run_keys_of_relaunches_keep_the_epoch_once() -> None:
    _, launches = launched()
    single = [
        launches[0].model_copy(update={"run_key": protocol.relaunch_key(protocol.run_key("g", "s0", 0, 50, 0, 3), 2)})
    ]
    single = [single[0].model_copy(update={"epoch": 3})]
    assert sgt.dagster_run_key(single) == "g:s0:0-50:a0:e3:l2"
    legacy = [single[0].model_copy(update={"run_key": "g:s0:0-50:a0"})]
    assert sgt.dagster_run_key(legacy) == "g:s0:0-50:a0:e3"


def test_a_state_of_schema_3_reads_without_relaunches() -> None:
    state, _ = launched()
    current = f'"schema_version":{protocol.state.SCHEMA_VERSION}'
    raw = protocol.encode_state(state).replace(current, '"schema_version":3')
    raw = raw.replace(',"relaunches":0,"not_before":null', "")
    assert '"schema_version":3' in raw and "relaunches" not in raw
    decoded = protocol.decode_state(raw, where="test")
    inflight = decoded.shards["s0"].inflight
    assert inflight is not None and (inflight.relaunches, inflight.not_before) == (0, None)
    assert decoded.schema_version == protocol.state.SCHEMA_VERSION
