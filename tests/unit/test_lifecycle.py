"""The stream's life in the protocol, pure: a shard's log recreated, a part missing or taken off every member's
list, an operator's reset, and offsets in the stream's record of the group that something else wrote."""

from __future__ import annotations

import pytest

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import EventKind, GroupState, StreamView, Watermark
from dagster_streamgroup.protocol.assignment import is_assignable
from tests.unit.protocol_helpers import POLICY, policy_with, report

PARTS = ("a", "b")


def started(policy: protocol.GroupPolicy = POLICY) -> tuple[GroupState, list[protocol.Launch]]:
    """Member ``m`` owns ``a:0`` and ``b:0`` (logs ``A1``, ``B1``) with ``[0, 100)`` in flight on each."""
    view = StreamView(shards=("a:0", "b:0"), parts=PARTS, identities={"a": "A1", "b": "B1"})
    state = protocol.new_group("stream", "g", 0.0)
    state = protocol.membership_step(state, "m", 0.0, policy, view=view)
    state = protocol.membership_step(state, "m", 10.0, policy, view=view)
    marks = {s: Watermark(low=0, high=500, identity=view.identities[s[0]]) for s in state.shards}
    state, launches = protocol.plan(state, "m", 10.0, marks, policy)
    assert sorted((x.shard, x.start, x.end) for x in launches) == [("a:0", 0, 50), ("b:0", 0, 50)]
    return state, launches


def step(state: GroupState, now: float, policy: protocol.GroupPolicy = POLICY, **view: object) -> GroupState:
    fields: dict[str, object] = {"shards": ("a:0", "b:0"), "parts": PARTS, "identities": {"a": "A1", "b": "B1"}}
    return protocol.membership_step(state, "m", now, policy, view=StreamView(**{**fields, **view}))  # type: ignore[arg-type]


def kinds(state: GroupState, kind: EventKind) -> list[protocol.GroupEvent]:
    return [e for e in state.events if e.kind == kind]


@pytest.mark.parametrize("on_recreated", ["park", "earliest"])
def test_a_recreated_log_fences_the_old_range_names_what_was_not_read_and_starts_the_new_log_at_its_start(
    on_recreated: str,
) -> None:
    policy = policy_with(on_recreated=on_recreated, max_records_per_run=100)
    state, launches = started(policy)
    a = next(x for x in launches if x.shard == "a:0")
    state, outcome = protocol.commit_run(state, [report(x) for x in launches if x.shard == "b:0"])
    assert outcome.accepted
    state = step(state, 20.0, policy, identities={"a": "A2", "b": "B1"})
    [event] = kinds(state, EventKind.RECREATED)
    assert event.shard == "a:0" and event.start == 0 and "A1 -> A2" in event.detail and "[0, 50)" in event.detail
    shard = state.shards["a:0"]
    assert shard.identity == "A2" and shard.committed is None and shard.inflight is None and shard.late
    assert shard.repositioned is not None and shard.repositioned.cause == "recreated"
    _, refused = protocol.commit_run(state, [report(a)])
    assert refused.refusals["a:0"].refusal == protocol.Refusal.RECREATED
    assert state.shards["b:0"].identity == "B1" and state.shards["b:0"].committed == 50, "the other log goes on"
    if on_recreated == "park":
        assert shard.parked is not None and shard.parked.cause == "recreated"
        state = protocol.unpark(state, "a:0", 21.0)
    state, launches = protocol.plan(state, "m", 22.0, {"a:0": Watermark(low=0, high=30, identity="A2")}, policy)
    assert [(x.shard, x.start, x.end) for x in launches] == [("a:0", 0, 30)], "from the new log's first offset"


def test_a_commit_that_sees_another_identity_is_refused_before_any_tick_does() -> None:
    state, launches = started()
    same, outcome = protocol.commit_run(state, [report(x) for x in launches], {"a:0": "A2", "b:0": "B1"})
    assert same is state and not outcome.accepted
    assert outcome.outcomes["a:0"].refusal == protocol.Refusal.RECREATED
    assert protocol.commit_run(state, [report(x) for x in launches], {"a:0": "A1", "b:0": "B1"})[1].accepted


def test_a_missing_part_parks_its_shards_after_a_session_timeout_and_one_that_comes_back_as_it_was_resumes() -> None:
    state, launches = started()
    state, _ = protocol.commit_run(state, [report(x) for x in launches])
    state = step(state, 20.0, shards=("a:0",), identities={"a": "A1"}, missing=frozenset({"b"}))
    assert state.shards["b:0"].missing_since == 20.0 and state.shards["b:0"].parked is None
    state = step(state, 20.0 + POLICY.session_timeout_s, shards=("a:0",), identities={"a": "A1"}, missing={"b"})
    [event] = kinds(state, EventKind.MISSING)
    parked = state.shards["b:0"].parked
    assert event.shard == "b:0" and parked is not None and parked.cause == "missing" and parked.start == 50
    assert state.shards["a:0"].parked is None
    back = step(state, 50.0)
    assert back.shards["b:0"].parked is None and back.shards["b:0"].committed == 50
    assert kinds(back, EventKind.UNPARKED)[-1].shard == "b:0"
    recreated = step(state, 50.0, identities={"a": "A1", "b": "B2"})
    assert recreated.shards["b:0"].parked is not None and recreated.shards["b:0"].parked.cause == "recreated"


def test_a_part_no_member_lists_is_released_once_its_run_commits_and_comes_back_at_its_offset() -> None:
    state, launches = started()
    state = step(state, 20.0, parts=("a",), shards=("a:0",), identities={"a": "A1"})
    [event] = kinds(state, EventKind.REMOVED)
    assert event.shard == "b:0" and state.shards["b:0"].removed and state.shards["b:0"].owner == "m"
    state, outcome = protocol.commit_run(state, [report(x) for x in launches])
    assert outcome.accepted, "the run in flight over a removed part commits"
    state = step(state, 25.0, parts=("a",), shards=("a:0",), identities={"a": "A1"})
    assert state.shards["b:0"].owner is None and not is_assignable(state, state.shards["b:0"])
    state, planned = protocol.plan(
        state, "m", 25.0, {"a:0": Watermark(low=0, high=500), "b:0": Watermark(low=0, high=500)}, POLICY
    )
    assert [x.shard for x in planned] == ["a:0"]
    state = step(state, 30.0)
    assert not state.shards["b:0"].removed and state.shards["b:0"].owner == "m" and state.shards["b:0"].committed == 50


def test_members_that_disagree_about_the_parts_each_read_only_theirs_and_every_listed_shard_is_owned() -> None:
    view_a = StreamView(shards=("a:0", "a:1"), parts=("a",))
    view_ab = StreamView(shards=("a:0", "a:1", "b:0", "b:1"), parts=("a", "b"))
    state = protocol.new_group("stream", "g", 0.0)
    for now in (0.0, 10.0, 20.0):
        state = protocol.membership_step(state, "old", now, POLICY, view=view_a)
        state = protocol.membership_step(state, "new", now + 1, POLICY, view=view_ab)
    owners = {sid: s.owner for sid, s in state.shards.items()}
    assert all(owners[s] == "new" for s in ("b:0", "b:1")), "only a member that lists b reads it"
    assert all(owner is not None for owner in owners.values())
    assert not any(s.removed for s in state.shards.values())


def test_a_reset_moves_fences_resumes_and_names_what_is_skipped_or_read_again() -> None:
    state, launches = started()
    state = protocol.fail_run(
        state, [report(x) for x in launches if x.shard == "b:0"], "boom", 11.0, policy_with(max_attempts=1)
    )[0]
    assert state.shards["b:0"].parked is not None
    state = protocol.reset(state, {"a:0": 300, "b:0": 0}, 12.0, {"a:0": "A1"})
    a, b = state.shards["a:0"], state.shards["b:0"]
    assert (a.committed, a.inflight, b.committed, b.parked) == (300, None, 0, None)
    events = kinds(state, EventKind.RESET)
    assert [(e.shard, e.start, e.end) for e in events] == [("a:0", 0, 300), ("b:0", 0, 0)]
    assert "[0, 300) skipped" in events[0].detail and "fenced" in events[0].detail
    _, outcome = protocol.commit_run(state, [report(x) for x in launches if x.shard == "a:0"])
    assert outcome.refusals["a:0"].refusal == protocol.Refusal.RESET
    back = protocol.reset(state, {"a:0": 100}, 13.0)
    assert "[100, 300) read again" in kinds(back, EventKind.RESET)[-1].detail
    with pytest.raises(ValueError, match="not a shard"):
        protocol.reset(state, {"z:0": 1}, 14.0)


def test_an_offset_something_else_wrote_is_refused_when_positioned_and_adopted_when_not() -> None:
    state, launches = started()
    state, _ = protocol.commit_run(state, [report(x) for x in launches])
    marks = {
        "a:0": Watermark(low=0, high=500, group_committed=10, mirror_foreign=True, identity="A1"),
        "b:0": Watermark(low=0, high=500, group_committed=50, mirror_foreign=True, identity="B1"),
    }
    state, launches = protocol.plan(state, "m", 20.0, marks, POLICY)
    [refused] = kinds(state, EventKind.RESET_REFUSED)
    assert refused.shard == "a:0" and (refused.start, refused.end) == (10, 50) and "streamgroup reset" in refused.detail
    assert sorted((x.shard, x.start) for x in launches) == [("a:0", 50), ("b:0", 50)], "not applied"
    fresh = protocol.membership_step(
        protocol.new_group("stream", "g", 0.0), "m", 0.0, POLICY, view=StreamView(shards=("a:0",))
    )
    fresh = protocol.membership_step(fresh, "m", 10.0, POLICY, view=StreamView(shards=("a:0",)))
    mark = {"a:0": Watermark(low=0, high=500, group_committed=10, mirror_foreign=True)}
    fresh, launches = protocol.plan(fresh, "m", 10.0, mark, POLICY)
    [adopted] = kinds(fresh, EventKind.ADOPTED)
    assert adopted.start == 10 and [x.start for x in launches] == [10]


def test_a_log_start_past_an_open_transaction_waits_instead_of_parking() -> None:
    policy = policy_with(on_data_loss="earliest", max_records_per_run=100)
    state, launches = started(policy)
    state, _ = protocol.commit_run(state, [report(x) for x in launches])
    held = {"a:0": Watermark(low=60, high=55, uncommitted_high=70, identity="A1")}
    for now in (20.0, 50.0, 100.0):
        state, planned = protocol.plan(state, "m", now, held, policy)
        assert planned == [] and state.shards["a:0"].parked is None and state.shards["a:0"].ahead_since is None
    assert [(e.start, e.end) for e in kinds(state, EventKind.DATA_LOSS)] == [(50, 60)]
    state, planned = protocol.plan(state, "m", 101.0, {"a:0": Watermark(low=60, high=70, identity="A1")}, policy)
    assert [(x.start, x.end) for x in planned] == [(60, 70)]


@pytest.mark.parametrize("on_recreated", ["park", "earliest"])
def test_a_shard_gone_with_its_log_names_what_was_not_read_once(on_recreated: str) -> None:
    """v3io shards carry identities of their own and shard counts only grow, so a shard the stream no longer has
    went with a stream deleted and created again with fewer shards: a ``recreated`` event naming its unread
    offsets, once; a shard of that number that comes later is a new log read from its start. Before, the shard kept
    its old offset with no event, and a stream grown back to it was read from there."""
    policy = policy_with(on_recreated=on_recreated, max_records_per_run=100)
    view = StreamView(shards=("0", "1"), identities={"0": "S0", "1": "S1"})
    state = protocol.new_group("stream", "g", 0.0)
    state = protocol.membership_step(state, "m", 0.0, policy, view=view)
    state = protocol.membership_step(state, "m", 10.0, policy, view=view)
    marks = {s: Watermark(low=1, high=41, identity=view.identities[s]) for s in state.shards}
    state, launches = protocol.plan(state, "m", 10.0, marks, policy)
    state, outcome = protocol.commit_run(state, [report(x) for x in launches])
    assert outcome.accepted and state.shards["1"].committed == 41
    fewer = StreamView(shards=("0",), identities={"0": "T0"})
    before = state
    state = protocol.membership_step(state, "m", 20.0, policy, view=fewer)
    events = {e.shard: e for e in kinds(state, EventKind.RECREATED)}
    assert set(events) == {"0", "1"} and events["1"].start == 41 and "S1 -> none" in events["1"].detail
    assert state.shards["1"].committed is None and state.shards["1"].identity is None
    again = protocol.membership_step(state, "m", 21.0, policy, view=fewer)
    assert len(kinds(again, EventKind.RECREATED)) == 2, "told once"
    empty = protocol.membership_step(before, "m", 20.0, policy, view=StreamView(shards=("0",)))
    assert kinds(empty, EventKind.RECREATED) == [], "a listing without identities says nothing"


def test_a_kafka_partition_missing_from_a_listing_of_its_topic_is_not_a_gone_log() -> None:
    """Kafka's identities are per topic: a partition absent from a listing whose topic keeps its id is no event."""
    state, launches = started()
    state, _ = protocol.commit_run(state, [report(x) for x in launches])
    state = step(state, 20.0, shards=("a:0",))
    assert kinds(state, EventKind.RECREATED) == []


def test_a_shard_positioned_before_its_log_had_an_identity_takes_it_at_its_first_commit() -> None:
    """An empty v3io shard has no object to carry an identity, so a shard positioned then has none; its first range
    is read once records arrive. The run's commit gives it the identity of the log it read (looked up after the
    read), so a stream re-created before the next tick lists the shard is a ``recreated`` event naming the old log's
    unread offsets. Before, that tick adopted the new log's identity silently and those offsets were never read."""
    policy = policy_with(max_records_per_run=100)
    empty = StreamView(shards=("0",))
    state = protocol.new_group("stream", "g", 0.0)
    state = protocol.membership_step(state, "m", 0.0, policy, view=empty)
    state = protocol.membership_step(state, "m", 10.0, policy, view=empty)
    state, launches = protocol.plan(state, "m", 10.0, {"0": Watermark(low=1, high=3)}, policy)
    assert [(x.start, x.end) for x in launches] == [(1, 3)] and state.shards["0"].identity is None
    state, outcome = protocol.commit_run(state, [report(x) for x in launches], {"0": "S0"})
    assert outcome.accepted and state.shards["0"].identity == "S0" and state.shards["0"].committed == 3
    state = protocol.membership_step(state, "m", 11.0, policy, view=StreamView(shards=("0",), identities={"0": "T0"}))
    [event] = kinds(state, EventKind.RECREATED)
    assert event.shard == "0" and event.start == 3 and "S0 -> T0" in event.detail


def test_a_commit_without_an_identity_to_compare_keeps_the_shards() -> None:
    state, launches = started()
    state, outcome = protocol.commit_run(state, [report(x) for x in launches])
    assert outcome.accepted and {s.identity for s in state.shards.values()} == {"A1", "B1"}
    state, launches = protocol.plan(state, "m", 11.0, {"a:0": Watermark(low=0, high=500, identity="A1")}, POLICY)
    state, outcome = protocol.commit_run(state, [report(x) for x in launches], {"a:0": "A1"})
    assert outcome.accepted and state.shards["a:0"].identity == "A1"


def test_a_shard_positioned_without_an_identity_goes_with_a_stream_recreated_under_its_siblings() -> None:
    """v3io deletes and creates a stream as a whole: shard 0 was positioned while empty (no identity) and never
    committed; shard 1 has an identity. When shard 1's log is recreated in a listing, shard 0's old log went too:
    a ``recreated`` event for it as well, naming its offsets from where it was positioned, not a silent adoption of
    the new log's identity (which skipped the records its old log received meanwhile)."""
    policy = policy_with(max_records_per_run=100, on_recreated="earliest")
    view = StreamView(shards=("0", "1"), identities={"1": "S1"})
    state = protocol.new_group("stream", "g", 0.0)
    state = protocol.membership_step(state, "m", 0.0, policy, view=view)
    state = protocol.membership_step(state, "m", 10.0, policy, view=view)
    marks = {"0": Watermark(low=1, high=1), "1": Watermark(low=1, high=41, identity="S1")}
    state, launches = protocol.plan(state, "m", 10.0, marks, policy)
    state, outcome = protocol.commit_run(state, [report(x) for x in launches], {"1": "S1"})
    assert outcome.accepted and state.shards["0"].identity is None and state.shards["0"].committed == 1
    recreated = StreamView(shards=("0", "1"), identities={"0": "T0", "1": "T1"})
    after = protocol.membership_step(state, "m", 11.0, policy, view=recreated)
    events = {e.shard: e for e in kinds(after, EventKind.RECREATED)}
    assert set(events) == {"0", "1"} and events["0"].start == 1 and events["1"].start == 41
    assert after.shards["0"].identity == "T0" and after.shards["0"].committed is None, "read from the new log's start"
    alone = protocol.membership_step(
        state, "m", 11.0, policy, view=StreamView(shards=("0", "1"), identities={"0": "T0", "1": "S1"})
    )
    assert kinds(alone, EventKind.RECREATED) == [] and alone.shards["0"].identity == "T0", "its first records: adopted"
