"""A backfill's lease on a shard: granted only while no range of the shard is in flight, and while it is held or
waited for, no member plans the shard (ticks and runs that carry on alike); a silent backfill loses it."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import EventKind, GroupState, Launch, LeaseOutcome
from tests.unit.protocol_helpers import POLICY, balanced_start, marks, report

TIMEOUT = POLICY.session_timeout_s


def _planned(state: GroupState, member: str, now: float) -> tuple[GroupState, list[Launch]]:
    return protocol.plan(state, member, now, marks(state), POLICY)


def test_a_lease_is_granted_at_once_on_an_idle_shard_and_the_member_plans_around_it() -> None:
    state = balanced_start(2, ("a",))
    state, status = protocol.request_lease(state, "s0", "run-1", 10.0, TIMEOUT)
    assert status.outcome is LeaseOutcome.GRANTED and status.lease is not None and status.lease.granted_at == 10.0
    state, launches = _planned(state, "a", 11.0)
    assert [x.shard for x in launches] == ["s1"], "the leased shard is not planned"
    state = protocol.release_lease(state, "s0", "run-1")
    _, launches = _planned(state, "a", 12.0)
    assert [x.shard for x in launches] == ["s0"], "released, it is planned again"


def test_a_lease_waits_for_the_range_in_flight_and_nothing_new_is_planned_meanwhile() -> None:
    state = balanced_start(1, ("a",))
    state, (launch,) = _planned(state, "a", 10.0)
    state, status = protocol.request_lease(state, "s0", "run-1", 11.0, TIMEOUT)
    assert status.outcome is LeaseOutcome.WAITING and f"[{launch.start}, {launch.end})" in status.detail
    state, outcome = protocol.commit(state, report(launch))
    assert outcome.accepted
    state, launches = _planned(state, "a", 12.0)
    assert launches == [], "a waiting lease holds the shard's next range back"
    state, status = protocol.request_lease(state, "s0", "run-1", 13.0, TIMEOUT)
    assert status.outcome is LeaseOutcome.GRANTED and state.shards["s0"].inflight is None


def test_a_run_that_carries_on_does_not_carry_a_leased_shard_on() -> None:
    state = balanced_start(2, ("a",))
    state, launches = _planned(state, "a", 10.0)
    assert {x.shard for x in launches} == {"s0", "s1"}
    state, status = protocol.request_lease(state, "s0", "run-1", 11.0, TIMEOUT)
    assert status.outcome is LeaseOutcome.WAITING
    reports = [report(x) for x in launches]
    state, outcome, carried = protocol.commit_and_carry_on(state, reports, 12.0, marks(state), POLICY)
    assert outcome.accepted and [x.shard for x in carried] == ["s1"]
    _, status = protocol.request_lease(state, "s0", "run-1", 13.0, TIMEOUT)
    assert status.outcome is LeaseOutcome.GRANTED


def test_a_second_backfill_waits_behind_a_live_one_and_takes_over_a_silent_one() -> None:
    state = balanced_start(1, ("a",))
    state, _ = protocol.request_lease(state, "s0", "run-1", 10.0, TIMEOUT)
    same, status = protocol.request_lease(state, "s0", "run-2", 10.0 + TIMEOUT, TIMEOUT)
    assert status.outcome is LeaseOutcome.BUSY and "run-1 holds it" in status.detail and same is state
    state, status = protocol.request_lease(state, "s0", "run-2", 11.0 + TIMEOUT, TIMEOUT)
    assert status.outcome is LeaseOutcome.GRANTED and status.lease is not None and status.lease.holder == "run-2"
    assert state.events[-1].kind is EventKind.LEASE_EXPIRED and "run-1" in state.events[-1].detail
    _, held = protocol.touch_lease(state, "s0", "run-1", 12.0 + TIMEOUT)
    assert not held, "the silent backfill learns it lost the shard"


def test_a_member_tick_drops_the_lease_of_a_silent_backfill_and_plans_the_shard() -> None:
    state = balanced_start(1, ("a",))
    state, _ = protocol.request_lease(state, "s0", "run-1", 10.0, TIMEOUT)
    state, held = protocol.touch_lease(state, "s0", "run-1", 15.0)
    assert held
    state = protocol.membership_step(state, "a", 15.0, POLICY)
    state = protocol.membership_step(state, "a", 15.0 + TIMEOUT, POLICY)
    assert state.shards["s0"].lease is not None, "alive within the timeout"
    state = protocol.membership_step(state, "a", 16.0 + TIMEOUT, POLICY)
    assert state.shards["s0"].lease is None and state.events[-1].kind is EventKind.LEASE_EXPIRED
    _, launches = _planned(state, "a", 17.0 + TIMEOUT)
    assert [x.shard for x in launches] == ["s0"]


def test_lease_transitions_are_idempotent_and_say_when_nothing_changes() -> None:
    state = balanced_start(1, ("a",))
    assert protocol.release_lease(state, "s0", "run-1") is state
    assert protocol.expire_leases(state, 100.0, TIMEOUT) is state
    state, _ = protocol.request_lease(state, "s0", "run-1", 10.0, TIMEOUT)
    again, status = protocol.request_lease(state, "s0", "run-1", 10.0, TIMEOUT)
    assert again is state and status.outcome is LeaseOutcome.GRANTED
    assert protocol.release_lease(state, "s0", "run-2") is state, "only the holder releases"
    _, status = protocol.request_lease(state, "nope", "run-1", 10.0, TIMEOUT)
    assert status.outcome is LeaseOutcome.UNKNOWN_SHARD


def test_a_lease_survives_its_state_through_the_codec_and_a_delta() -> None:
    state = balanced_start(1, ("a",))
    leased, _ = protocol.request_lease(state, "s0", "run-1", 10.0, TIMEOUT)
    assert protocol.decode_state(protocol.encode_state(leased), where="t") == leased
    from dagster_streamgroup.protocol import delta

    change = delta.decode_delta(delta.encode_delta(delta.diff(state, leased)))
    assert delta.apply(state, change) == leased


holders = ("b1", "b2")
op = st.one_of(
    st.tuples(st.just("tick"), st.sampled_from(("a", "b")), st.floats(0, 6)),
    st.tuples(st.just("commit"), st.integers(0, 40)),
    st.tuples(st.just("fail"), st.integers(0, 40)),
    st.tuples(st.just("request"), st.sampled_from(holders), st.integers(0, 3)),
    st.tuples(st.just("touch"), st.sampled_from(holders)),
    st.tuples(st.just("release"), st.sampled_from(holders)),
    st.tuples(st.just("pause"), st.floats(0, 30)),
)


@dataclass
class World:
    state: GroupState
    now: float = 0.0
    runs: list[Launch] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)
    """holder -> the shard it asked for."""


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(op, max_size=60))
def test_a_backfill_and_the_group_never_hold_one_shard_at_once(steps: list[tuple[object, ...]]) -> None:
    world = World(state=balanced_start(4, ("a", "b")))
    for step in steps:
        kind = step[0]
        if kind == "tick":
            world.now += float(step[2])  # type: ignore[arg-type]
            state = protocol.membership_step(world.state, str(step[1]), world.now, POLICY)
            leased = {sid for sid, s in state.shards.items() if s.lease is not None}
            world.state, launches = protocol.plan(state, str(step[1]), world.now, marks(state), POLICY)
            assert not leased & {x.shard for x in launches}, "a leased shard is never planned"
            world.runs.extend(launches)
        elif kind in ("commit", "fail") and world.runs:
            run = world.runs.pop(int(step[1]) % len(world.runs))  # type: ignore[call-overload]
            if kind == "commit":
                world.state, _ = protocol.commit(world.state, report(run))
            else:
                world.state, _ = protocol.fail(world.state, report(run), "boom", world.now, POLICY)
        elif kind == "request":
            holder, shard = str(step[1]), f"s{step[2]}"
            if world.held.get(holder, shard) != shard:
                continue
            world.state, status = protocol.request_lease(world.state, shard, holder, world.now, TIMEOUT)
            if status.outcome is LeaseOutcome.GRANTED:
                assert world.state.shards[shard].inflight is None, "granted only while no range is in flight"
            if status.outcome in (LeaseOutcome.GRANTED, LeaseOutcome.WAITING):
                world.held[holder] = shard
        elif kind == "touch" and str(step[1]) in world.held:
            holder = str(step[1])
            world.state, held = protocol.touch_lease(world.state, world.held[holder], holder, world.now)
            if not held:
                del world.held[holder]
        elif kind == "release" and str(step[1]) in world.held:
            holder = str(step[1])
            world.state = protocol.release_lease(world.state, world.held.pop(holder), holder)
        elif kind == "pause":
            world.now += float(step[1])  # type: ignore[arg-type]
        for sid, held_shard in world.state.shards.items():
            if held_shard.lease is not None and held_shard.lease.granted_at is not None:
                assert held_shard.inflight is None, f"{sid}: a granted lease beside a range in flight"
    # Every backfill released: the group plans every shard again.
    for holder, shard in list(world.held.items()):
        world.state = protocol.release_lease(world.state, shard, holder)
    assert all(s.lease is None for s in world.state.shards.values())


def test_status_says_which_backfill_holds_or_waits_for_a_shard() -> None:
    from dagster_streamgroup.dagster.operator import shard_rows

    state = balanced_start(2, ("a",))
    state, _ = protocol.request_lease(state, "s1", "run-2", 10.0, TIMEOUT)
    state, (launch,) = _planned(state, "a", 10.0)
    state, _ = protocol.request_lease(state, launch.shard, "run-1", 11.0, TIMEOUT)
    rows = {row.shard: row.waits for row in shard_rows(state, {})}
    assert rows == {"s0": "backfill run run-1 waits for its range in flight", "s1": "backfill run run-2 holds it"}
