import pytest
from pydantic import ValidationError

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import EventKind, FailOutcome, GroupPolicy, Refusal, Watermark
from tests.unit.protocol_helpers import POLICY, balanced_start, marks, policy_with, report


def one_shard(policy: GroupPolicy = POLICY) -> protocol.GroupState:
    return balanced_start(1, ("a",), policy)


def test_plan_positions_by_seek_policy_and_bounds_the_range() -> None:
    state, (launch,) = protocol.plan(one_shard(), "a", 5.0, {"s0": Watermark(low=10, high=1000)}, POLICY)
    assert (launch.start, launch.end, launch.attempt) == (10, 110, 0)
    assert launch.run_key == f"g:s0:10-110:a0:e{launch.epoch}"
    assert state.shards["s0"].inflight is not None and state.shards["s0"].committed == 10
    latest = policy_with(heartbeat_interval_s=5, session_timeout_s=20, seek="latest")
    state, launches = protocol.plan(one_shard(latest), "a", 5.0, {"s0": Watermark(low=10, high=1000)}, latest)
    assert launches == [] and state.shards["s0"].committed == 1000


def test_a_shard_not_positioned_yet_starts_at_the_offset_the_stream_records() -> None:
    """A group whose state was lost resumes where the stream's own group record says, whatever the seek
    policy; once positioned, that record is never consulted again (it lags the state: it is a mirror)."""
    latest = policy_with(heartbeat_interval_s=5, session_timeout_s=20, seek="latest", max_records_per_run=100)
    mark = Watermark(low=10, high=1000, group_committed=400)
    state, (launch,) = protocol.plan(one_shard(latest), "a", 5.0, {"s0": mark}, latest)
    assert (launch.start, launch.end) == (400, 500)
    state, _ = protocol.commit(state, report(launch))
    _, (following,) = protocol.plan(state, "a", 6.0, {"s0": mark}, latest)
    assert following.start == 500


def test_late_shards_start_at_earliest_even_under_latest() -> None:
    latest = policy_with(heartbeat_interval_s=5, session_timeout_s=20, seek="latest")
    state = protocol.sync_shards(one_shard(latest), ["s9"], 9.0)
    state = protocol.rebalance(state, "a", 10.0, latest)
    _, launches = protocol.plan(state, "a", 10.0, {"s9": Watermark(low=3, high=50)}, latest)
    assert [(x.shard, x.start) for x in launches] == [("s9", 3)]


def test_plan_is_idempotent_and_skips_unknown_watermarks() -> None:
    state, launches = protocol.plan(one_shard(), "a", 5.0, marks(one_shard()), POLICY)
    again, more = protocol.plan(state, "a", 5.0, marks(state), POLICY)
    assert again is state and more == []
    assert protocol.inflight_launches(state, "a") == launches
    untouched, none = protocol.plan(one_shard(), "a", 5.0, {}, POLICY)
    assert none == [] and untouched.shards["s0"].committed is None


def test_min_backlog_waits_at_most_max_wait() -> None:
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, min_backlog=50, max_wait_s=30)
    state = one_shard(policy)
    state, launches = protocol.plan(state, "a", 5.0, {"s0": Watermark(low=0, high=10)}, policy)
    assert launches == [] and state.shards["s0"].backlog_since == 5.0
    state, launches = protocol.plan(state, "a", 20.0, {"s0": Watermark(low=0, high=10)}, policy)
    assert launches == []
    state, launches = protocol.plan(state, "a", 35.0, {"s0": Watermark(low=0, high=12)}, policy)
    assert [(x.start, x.end) for x in launches] == [(0, 12)]


@pytest.mark.parametrize("policy_value", ["fail", "earliest"])
def test_retention_loss_is_always_an_event(policy_value: str) -> None:
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, on_data_loss=policy_value)  # type: ignore[arg-type]
    state, (launch,) = protocol.plan(one_shard(policy), "a", 5.0, {"s0": Watermark(low=0, high=100)}, policy)
    state, _ = protocol.commit(state, report(launch))
    state, launches = protocol.plan(state, "a", 6.0, {"s0": Watermark(low=150, high=300)}, policy)
    event = state.events[-1]
    assert event.kind is EventKind.DATA_LOSS and (event.start, event.end) == (100, 150)
    if policy_value == "fail":
        assert launches == [] and state.shards["s0"].parked is not None
        assert state.shards["s0"].committed == 100
    else:
        assert [(x.start, x.end) for x in launches] == [(150, 300)]


def test_commit_accepts_only_the_run_in_flight() -> None:
    state, (launch,) = protocol.plan(one_shard(), "a", 5.0, marks(one_shard()), POLICY)
    good = report(launch)
    for bad, reason in [
        (good.model_copy(update={"epoch": launch.epoch - 1}), Refusal.OWNERSHIP_MOVED),
        (good.model_copy(update={"member_id": "z"}), Refusal.OWNERSHIP_MOVED),
        (good.model_copy(update={"run_key": "other"}), Refusal.NOT_IN_FLIGHT),
        (good.model_copy(update={"shard": "nope"}), Refusal.UNKNOWN_SHARD),
    ]:
        same, outcome = protocol.commit(state, bad)
        assert same is state and not outcome.accepted and outcome.refusal is reason, bad
    _, outcome = protocol.commit(state, good.model_copy(update={"epoch": launch.epoch - 1}))
    assert "owned by a at epoch 1" in outcome.message
    done, outcome = protocol.commit(state, good)
    assert outcome.accepted and done.shards["s0"].committed == launch.end and done.shards["s0"].inflight is None
    replay, outcome = protocol.commit(done, good)
    assert replay is done and outcome.accepted and outcome.already_committed


def test_commit_with_wrong_start_is_refused() -> None:
    state, (launch,) = protocol.plan(one_shard(), "a", 5.0, marks(one_shard()), POLICY)
    shard = state.shards["s0"]
    assert shard.inflight is not None
    skewed = state.model_copy(update={"shards": {"s0": protocol.state.evolve(shard, committed=launch.start + 1)}})
    _, outcome = protocol.commit(skewed, report(launch))
    assert outcome.refusal is Refusal.WRONG_START


def test_failures_retry_the_same_offsets_then_park() -> None:
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, max_attempts=2, max_records_per_run=100)
    state, (first,) = protocol.plan(one_shard(policy), "a", 5.0, {"s0": Watermark(low=0, high=40)}, policy)
    assert (first.start, first.end) == (0, 40)
    state, outcome = protocol.fail(state, report(first), "boom", 6.0, policy)
    assert outcome is FailOutcome.RETRY
    assert protocol.fail(state, report(first), "boom", 6.0, policy) == (state, FailOutcome.IGNORED)
    # the backlog grew meanwhile: the retry still reads exactly the failed range
    state, (second,) = protocol.plan(state, "a", 7.0, marks(state), policy)
    assert (second.start, second.end, second.attempt) == (first.start, first.end, 1)
    assert second.run_key != first.run_key
    state, outcome = protocol.fail(state, report(second), "boom again", 8.0, policy)
    assert outcome is FailOutcome.PARKED and state.shards["s0"].parked is not None
    assert state.events[-1].kind is EventKind.PARKED and "boom again" in state.events[-1].detail
    assert protocol.plan(state, "a", 9.0, marks(state), policy)[1] == []
    resumed = protocol.unpark(state, "s0", 10.0)
    resumed, (third,) = protocol.plan(resumed, "a", 11.0, marks(resumed), policy)
    assert (third.start, third.end, third.attempt) == (first.start, first.end, 0)
    # a new epoch: the orchestrator keeps the run keys of the range's earlier attempts for good
    assert third.epoch == first.epoch + 1
    done, committed = protocol.commit(resumed, report(third))
    assert committed.accepted and done.shards["s0"].retry_end is None
    _, (fourth,) = protocol.plan(done, "a", 12.0, marks(done), policy)
    assert (fourth.start, fourth.end) == (40, 140)
    skipped = protocol.unpark(state, "s0", 10.0, skip=True)
    assert skipped.shards["s0"].committed == first.end and skipped.events[-1].kind is EventKind.DEAD_LETTER
    _, (after_skip,) = protocol.plan(skipped, "a", 11.0, marks(skipped), policy)
    assert (after_skip.start, after_skip.end) == (40, 140)


def test_retention_loss_inside_a_failed_range_retries_what_is_left() -> None:
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, on_data_loss="earliest", max_records_per_run=100)
    state, (first,) = protocol.plan(one_shard(policy), "a", 5.0, {"s0": Watermark(low=0, high=50)}, policy)
    state, _ = protocol.fail(state, report(first), "boom", 6.0, policy)
    _, (retry,) = protocol.plan(state, "a", 7.0, {"s0": Watermark(low=20, high=500)}, policy)
    assert (retry.start, retry.end) == (20, 50)
    _, (past,) = protocol.plan(state, "a", 7.0, {"s0": Watermark(low=80, high=500)}, policy)
    assert (past.start, past.end) == (80, 180)


def test_only_the_run_in_flight_may_report_a_failure() -> None:
    """A stale run of the same range (same protocol run key, earlier epoch or another member) must not
    clear its successor's in-flight record: that would start a second concurrent run of the range."""
    state, (launch,) = protocol.plan(one_shard(), "a", 5.0, marks(one_shard()), POLICY)
    for stale in (
        report(launch).model_copy(update={"epoch": launch.epoch - 1}),
        report(launch).model_copy(update={"member_id": "z"}),
    ):
        assert protocol.fail(state, stale, "stale", 6.0, POLICY) == (state, FailOutcome.IGNORED)
    assert protocol.fail(state, report(launch), "boom", 6.0, POLICY)[1] is FailOutcome.RETRY


def test_committed_offset_past_the_high_watermark_waits_then_parks() -> None:
    state, (launch,) = protocol.plan(one_shard(), "a", 5.0, {"s0": Watermark(low=0, high=100)}, POLICY)
    state, _ = protocol.commit(state, report(launch))
    recreated = {"s0": Watermark(low=0, high=30)}
    state, launches = protocol.plan(state, "a", 10.0, recreated, POLICY)
    assert launches == [] and state.shards["s0"].parked is None and state.shards["s0"].ahead_since == 10.0
    # a new owner starts its own observation
    handed = protocol.leave(state, "a", 11.0)
    assert handed.shards["s0"].ahead_since is None
    # a high watermark that catches up within a session timeout (a Kafka leader change) clears it
    caught_up, (next_launch,) = protocol.plan(state, "a", 15.0, {"s0": Watermark(low=0, high=150)}, POLICY)
    assert caught_up.shards["s0"].ahead_since is None and (next_launch.start, next_launch.end) == (100, 150)
    state, launches = protocol.plan(state, "a", 10.0 + POLICY.session_timeout_s, recreated, POLICY)
    shard = state.shards["s0"]
    assert launches == [] and shard.parked is not None and shard.committed == 100
    event = state.events[-1]
    assert event.kind is EventKind.OFFSETS_AHEAD and (event.start, event.end) == (30, 100)
    assert "recreated or truncated" in event.detail
    # nothing to skip: --skip only resumes it, with no dead letter and no offset moved
    resumed = protocol.unpark(state, "s0", 40.0, skip=True)
    assert resumed.shards["s0"].committed == 100 and resumed.events[-1].kind is EventKind.UNPARKED


def test_a_retry_past_a_lowered_high_watermark_waits_instead_of_stalling() -> None:
    """The failed range's records existed when it was planned; a stream that now ends below them was
    truncated (or a new leader lags): no run that would wait out its stall timeout and burn an attempt."""
    state, (first,) = protocol.plan(one_shard(), "a", 5.0, {"s0": Watermark(low=0, high=100)}, POLICY)
    state, _ = protocol.fail(state, report(first), "boom", 6.0, POLICY)
    state, launches = protocol.plan(state, "a", 7.0, {"s0": Watermark(low=0, high=50)}, POLICY)
    assert launches == [] and state.shards["s0"].ahead_since == 7.0 and state.shards["s0"].attempt == 1
    _, (retry,) = protocol.plan(state, "a", 8.0, {"s0": Watermark(low=0, high=100)}, POLICY)
    assert (retry.start, retry.end, retry.attempt) == (0, 100, 1)
    parked, _ = protocol.plan(state, "a", 7.0 + POLICY.session_timeout_s, {"s0": Watermark(low=0, high=50)}, POLICY)
    assert parked.shards["s0"].parked is not None and parked.events[-1].kind is EventKind.OFFSETS_AHEAD
    assert (parked.events[-1].start, parked.events[-1].end) == (50, 100)
    skipped = protocol.unpark(parked, "s0", 40.0, skip=True)
    assert skipped.shards["s0"].committed == 0, "skip never gives up records the stream still holds"


def test_dead_letter_moves_on_and_records_the_range() -> None:
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, max_attempts=1, after_max_attempts="dead_letter")
    state, (launch,) = protocol.plan(one_shard(policy), "a", 5.0, marks(one_shard()), policy)
    state, outcome = protocol.fail(state, report(launch), "bad record", 6.0, policy)
    assert outcome is FailOutcome.DEAD_LETTERED
    assert state.shards["s0"].committed == launch.end
    assert (state.events[-1].kind, state.events[-1].start, state.events[-1].end) == (
        EventKind.DEAD_LETTER,
        launch.start,
        launch.end,
    )


def test_policy_errors_name_the_field() -> None:
    with pytest.raises(ValidationError, match="session_timeout_s"):
        GroupPolicy(heartbeat_interval_s=10, session_timeout_s=15)
    with pytest.raises(ValidationError, match="max_records_per_run"):
        GroupPolicy(max_records_per_run=0)
    with pytest.raises(ValidationError, match="after_max_attempts"):
        GroupPolicy(after_max_attempts="ignore")  # type: ignore[arg-type]
