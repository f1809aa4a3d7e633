"""A run that carries on: after its commit, its shards' next ranges under its own run key."""

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import GroupState, Launch, Watermark
from tests.unit.protocol_helpers import POLICY, balanced_start, marks, policy_with, report


def first_run(state: GroupState, member: str, now: float = 5.0) -> tuple[GroupState, list[Launch]]:
    return protocol.plan(state, member, now, marks(state, high=250), POLICY)


def commit_and_carry_on(
    state: GroupState, launches: list[Launch], now: float, high: int = 250
) -> tuple[GroupState, list[Launch]]:
    state, outcome, carried = protocol.commit_and_carry_on(
        state, [report(x) for x in launches], now, marks(state, high=high), POLICY
    )
    assert outcome.accepted
    return state, carried


def test_a_committed_run_takes_its_shards_next_ranges_under_its_own_key() -> None:
    state, launches = first_run(balanced_start(2, ("a",)), "a")
    key = launches[0].run_key
    assert [(x.shard, x.start, x.end) for x in launches] == [("s0", 0, 50), ("s1", 0, 50)]

    state, carried = commit_and_carry_on(state, launches, 6.0)
    assert [(x.shard, x.start, x.end, x.run_key) for x in carried] == [("s0", 50, 100, key), ("s1", 50, 100, key)]
    for launch in carried:
        shard = state.shards[launch.shard]
        assert shard.committed == 50
        assert shard.inflight is not None and (shard.inflight.start, shard.inflight.run_key) == (50, key)
    # The orchestrator's run for the key exists, so a tick requests nothing, and plans nothing for these shards.
    assert {x.run_key for x in protocol.inflight_launches(state, "a")} == {key}
    _, planned = protocol.plan(state, "a", 6.5, marks(state, high=250), POLICY)
    assert planned == []
    # The next wave commits like the first.
    state, carried_again = commit_and_carry_on(state, carried, 7.0)
    assert [(x.start, x.end) for x in carried_again] == [(100, 150), (100, 150)]
    assert [r for r in state.unrecorded_runs[key].ranges] == [
        ("s0", 0, 50),
        ("s1", 0, 50),
        ("s0", 50, 100),
        ("s1", 50, 100),
    ]
    # The run recorded a wave's materializations before it read the next: its entry keeps the last two waves.
    state, _ = commit_and_carry_on(state, carried_again, 8.0)
    assert [r for r in state.unrecorded_runs[key].ranges] == [
        ("s0", 50, 100),
        ("s1", 50, 100),
        ("s0", 100, 150),
        ("s1", 100, 150),
    ]


def test_a_replayed_write_returns_the_ranges_it_already_took() -> None:
    """A commit whose write landed but whose answer was lost is retried on the state it left: the next ranges
    are those that write took, not none (they would stay in flight under a run that ended)."""
    state, launches = first_run(balanced_start(1, ("a",)), "a")
    reports = [report(x) for x in launches]
    state, _, carried = protocol.commit_and_carry_on(state, reports, 6.0, marks(state, high=250), POLICY)
    again, outcome, replayed = protocol.commit_and_carry_on(state, reports, 6.1, marks(state, high=400), POLICY)
    assert outcome.accepted and all(o.already_committed for o in outcome.outcomes.values())
    assert replayed == carried and again.shards == state.shards


def test_a_refused_commit_carries_nothing_on_and_changes_nothing() -> None:
    state, launches = first_run(balanced_start(1, ("a",)), "a")
    moved = protocol.leave(state, "a", 5.5)
    moved = protocol.heartbeat(moved, "b", 5.5)
    stale = launches[0].model_copy(update={"start": 10})
    after, outcome, carried = protocol.commit_and_carry_on(moved, [report(stale)], 6.0, marks(moved), POLICY)
    assert not outcome.accepted and carried == [] and after is moved


def test_nothing_is_carried_on_without_a_backlog_worth_a_run() -> None:
    waits = policy_with(heartbeat_interval_s=5, session_timeout_s=20, max_records_per_run=100, min_backlog=500)
    state, launches = protocol.plan(
        balanced_start(1, ("a",), waits), "a", 5.0, {"s0": Watermark(low=0, high=600)}, waits
    )
    state, _ = protocol.commit_run(state, [report(x) for x in launches])
    state, carried = protocol.carry_on(
        state, "a", launches[0].run_key, ["s0"], 6.0, {"s0": Watermark(low=0, high=550)}, waits
    )
    assert carried == []
    assert state.shards["s0"].inflight is None and state.shards["s0"].committed == 100


def test_a_member_that_left_or_is_about_to_be_evicted_carries_nothing_on() -> None:
    state, launches = first_run(balanced_start(1, ("a",)), "a")
    key = launches[0].run_key
    left = protocol.leave(state, "a", 5.5)
    left, outcome = protocol.commit_run(left, [report(x) for x in launches])
    assert outcome.accepted and left.shards["s0"].owner is None, "a departed member's shard goes back to the pool"
    after, carried = protocol.carry_on(left, "a", key, ["s0"], 6.0, marks(left), POLICY)
    assert carried == [] and after.shards["s0"].inflight is None
    # Silent since t=0: at t=16 a tick evicts it within one heartbeat, so its run stops at this commit.
    state, _ = protocol.commit_run(state, [report(x) for x in launches])
    after, carried = protocol.carry_on(state, "a", key, ["s0"], 16.0, marks(state), POLICY)
    assert carried == [] and after.shards["s0"].inflight is None


def test_a_member_above_its_fair_share_releases_shards_at_the_commit_and_carries_on_with_the_rest() -> None:
    state, launches = first_run(balanced_start(4, ("a",)), "a")
    assert len(launches) == 4
    state = protocol.heartbeat(state, "b", 1.0)  # b joined, its grace is over at 6
    state, carried = commit_and_carry_on(state, launches, 7.0)
    mine = sorted(sid for sid, s in state.shards.items() if s.owner == "a")
    assert len(mine) == 2 and sorted(x.shard for x in carried) == mine
    theirs = [s for s in state.shards.values() if s.owner == "b"]
    assert len(theirs) == 2 and all(s.inflight is None and s.committed == 25 for s in theirs)


def test_a_run_that_waits_for_its_next_wave_gets_it_once_a_wave_s_worth_waits_unless_a_tick_was_first() -> None:
    waits = policy_with(heartbeat_interval_s=5, session_timeout_s=20, max_records_per_run=1000, min_backlog=500)
    start = balanced_start(2, ("a",), waits)
    high = {"s0": Watermark(low=0, high=600), "s1": Watermark(low=0, high=600)}
    state, launches = protocol.plan(start, "a", 5.0, high, waits)
    assert [(x.start, x.end) for x in launches] == [(0, 500), (0, 500)]
    key = launches[0].run_key
    state, _ = protocol.commit_run(state, [report(x) for x in launches])
    state, carried = protocol.carry_on(state, "a", key, ["s0", "s1"], 6.0, high, waits)
    assert carried == [] and all(s.backlog_since == 6.0 for s in state.shards.values()), "its max_wait_s starts"
    again, carried = protocol.carry_on(state, "a", key, ["s0", "s1"], 7.0, high, waits)
    assert carried == [] and again is state, "nothing to do is no write"
    more = {"s0": Watermark(low=0, high=800), "s1": Watermark(low=0, high=800)}
    after, carried = protocol.carry_on(state, "a", key, ["s0", "s1"], 8.0, more, waits)
    assert [(x.shard, x.start, x.end, x.run_key) for x in carried] == [("s0", 500, 800, key), ("s1", 500, 800, key)]
    assert {s.inflight.run_key for s in after.shards.values() if s.inflight is not None} == {key}
    # The same small backlog, once it has waited max_wait_s (60 s here), is planned too.
    _, carried = protocol.carry_on(state, "a", key, ["s0", "s1"], 66.0, high, waits)
    assert carried == [], "a member silent since t=0 is about to be evicted: its run stops"
    _, carried = protocol.carry_on(protocol.heartbeat(state, "a", 65.0), "a", key, ["s0", "s1"], 66.0, high, waits)
    assert [(x.start, x.end) for x in carried] == [(500, 600), (500, 600)]
    # A tick that planned the shards first: the waiting run takes nothing.
    ticked, planned = protocol.plan(state, "a", 8.0, more, waits)
    assert planned and planned[0].run_key != key
    same, carried = protocol.carry_on(ticked, "a", key, ["s0", "s1"], 8.5, more, waits)
    assert carried == [] and same is ticked
