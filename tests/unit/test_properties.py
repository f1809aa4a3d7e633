"""Property-based tests: random sequences of joins, leaves, crashes, long pauses, skewed clocks, zombie and
replayed commits, failures (stale ones too), retention loss, a stream that ends below the group's offsets
for a while, operator unparks, groups positioned from the stream's own offsets, and the stream's own life (a
shard's log recreated, a part missing for a while, members whose lists of parts change and disagree, operator
resets), with the invariants checked after every step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import GroupPolicy, GroupState, Launch, Watermark
from dagster_streamgroup.protocol.assignment import is_assignable
from dagster_streamgroup.simulation import SimConfig, Simulation, random_scenario
from tests.unit.protocol_helpers import report

POLICY = GroupPolicy(
    heartbeat_interval_s=5, session_timeout_s=20, drain_timeout_s=30, max_records_per_run=40, max_attempts=2
)
MEMBERS = ("a", "b", "c", "d")

op = st.one_of(
    st.tuples(st.just("tick"), st.sampled_from(MEMBERS), st.floats(0, 8), st.floats(-3, 3)),
    st.tuples(st.just("pause"), st.floats(0, 60)),
    st.tuples(st.just("leave"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("commit"), st.integers(0, 50)),
    st.tuples(st.just("replay"), st.integers(0, 50)),
    st.tuples(st.just("zombie"), st.integers(0, 50)),
    st.tuples(st.just("fail"), st.integers(0, 50)),
    st.tuples(st.just("trim"), st.integers(0, 30)),
    st.tuples(st.just("cut"), st.integers(0, 150)),
    st.tuples(st.just("stale_fail"), st.integers(0, 50)),
    st.tuples(st.just("unpark"), st.integers(0, 8), st.booleans()),
    st.tuples(st.just("recreate"), st.integers(0, 8)),
    st.tuples(st.just("scope"), st.sampled_from(MEMBERS), st.integers(0, 3)),
    st.tuples(st.just("missing"), st.integers(0, 1), st.booleans()),
    st.tuples(st.just("reset"), st.integers(0, 8), st.floats(0, 1)),
)
SCOPES: tuple[tuple[str, ...] | None, ...] = (None, ("p0",), ("p1",), ("p0", "p1"))


@dataclass
class World:
    state: GroupState
    now: float = 0.0
    low: int = 0
    runs: list[Launch] = field(default_factory=list)
    cursor: dict[str, int] = field(default_factory=dict)
    cut: int = 0
    """How far the stream's end has dropped (a truncated or recreated stream, a lagging new leader)."""
    in_stream: int | None = None
    """The group's offset as the stream records it, for shards not positioned yet."""
    incarnation: dict[str, int] = field(default_factory=dict)
    """How many times each shard's log was recreated (its identity is ``<shard>#<n>``)."""
    born: dict[str, float] = field(default_factory=dict)
    """When each shard's current log was created (its offsets count from there)."""
    missing: set[str] = field(default_factory=set)
    scopes: dict[str, tuple[str, ...] | None] = field(default_factory=dict)

    def identity(self, sid: str) -> str:
        return f"{sid}#{self.incarnation.get(sid, 0)}"

    def mark(self, sid: str) -> Watermark:
        high = max(0, 100 + int((self.now - self.born.get(sid, 0.0)) * 10) - self.cut)
        return Watermark(
            low=min(self.low, high), high=high, group_committed=self.in_stream, identity=self.identity(sid)
        )

    def marks(self) -> dict[str, Watermark]:
        return {sid: self.mark(sid) for sid in self.state.shards if protocol.part_of(sid) not in self.missing}

    def view(self, member: str) -> protocol.StreamView:
        scope = self.scopes.get(member)
        return protocol.StreamView(
            shards=tuple(s for s in self.state.shards if protocol.part_of(s) not in self.missing),
            parts=scope,
            identities={sid: self.identity(sid) for sid in self.state.shards},
            missing=frozenset(self.missing),
        )


def check_step(before: GroupState, after: GroupState, world: World) -> None:
    known = set(before.events)
    added = [e for e in after.events if e not in known]
    for sid, new in after.shards.items():
        old = before.shards[sid]
        moved = new.identity != old.identity or new.repositioned != old.repositioned
        if old.committed is not None and not moved:
            assert new.committed is not None and new.committed >= old.committed, "committed offsets never decrease"
        if old.committed is not None and old.identity is not None and new.identity != old.identity:
            assert any(e.kind == "recreated" and e.shard == sid and e.start == old.committed for e in added), (
                "a log recreated under a positioned shard is an event naming the first offset not read"
            )
        if new.repositioned != old.repositioned:
            assert new.inflight is None, "a repositioned shard holds no range of its old position"
        if old.inflight is not None and new.inflight == old.inflight:
            assert new.owner == old.owner, "a shard with a range in flight is never released"
        if new.owner != old.owner:
            assert new.epoch > old.epoch, "every ownership change bumps the epoch"
    committable: dict[str, int] = {}
    for run in world.runs:
        shard = after.shards[run.shard]
        if shard.inflight and shard.inflight.run_key == run.run_key and shard.epoch == run.epoch:
            committable[run.shard] = committable.get(run.shard, 0) + 1
    assert all(n <= 1 for n in committable.values()), "two runs could commit one shard"


def apply(world: World, step: tuple[object, ...]) -> None:
    kind = step[0]
    before = world.state
    if kind == "tick":
        _, member, dt, skew = step
        world.now += float(dt)  # type: ignore[arg-type]
        view = world.view(str(member))
        state = protocol.membership_step(world.state, str(member), world.now + float(skew), POLICY, view=view)  # type: ignore[arg-type]
        marks = world.marks()
        world.state, launches = protocol.plan(state, str(member), world.now, marks, POLICY)
        for sid, shard in world.state.shards.items():
            if state.shards[sid].committed is None and shard.committed is not None:
                mark = marks[sid]
                assert shard.committed in (mark.low, mark.group_committed), (
                    "a shard's first position in a log is its start (or the group's offset the stream records): "
                    "nothing of a new log is skipped"
                )
        world.runs.extend(launches)
    elif kind == "recreate":
        shard_ids = sorted(world.state.shards)
        sid = shard_ids[int(step[1]) % len(shard_ids)]  # type: ignore[call-overload]
        world.incarnation[sid] = world.incarnation.get(sid, 0) + 1
        world.born[sid] = world.now
    elif kind == "scope":
        world.scopes[str(step[1])] = SCOPES[int(step[2])]  # type: ignore[call-overload]
    elif kind == "missing":
        part = f"p{step[1]}"
        if step[2]:
            world.missing.add(part)
        else:
            world.missing.discard(part)
    elif kind == "reset":
        shard_ids = sorted(world.state.shards)
        sid = shard_ids[int(step[1]) % len(shard_ids)]  # type: ignore[call-overload]
        mark = world.mark(sid)
        target = mark.low + int(float(step[2]) * (mark.high - mark.low))  # type: ignore[arg-type]
        world.state = protocol.reset(world.state, {sid: target}, world.now, {sid: world.identity(sid)})
        if before.shards[sid].inflight is not None:
            assert world.state.shards[sid].inflight is None, "a reset fences the range in flight"
    elif kind == "pause":
        world.now += float(step[1])  # type: ignore[arg-type]
    elif kind == "leave":
        world.state = protocol.leave(world.state, str(step[1]), world.now)
    elif kind == "trim":
        world.low += int(step[1])  # type: ignore[call-overload]
    elif kind == "cut":
        world.cut = int(step[1])  # type: ignore[call-overload]
    elif kind == "unpark":
        shard_ids = sorted(world.state.shards)
        sid = shard_ids[int(step[1]) % len(shard_ids)]  # type: ignore[call-overload]
        parked = world.state.shards[sid].parked
        world.state = protocol.unpark(world.state, sid, world.now, skip=bool(step[2]))
        if parked is not None:
            assert world.state.shards[sid].parked is None and world.state.shards[sid].epoch > before.shards[sid].epoch
    elif world.runs:
        run = world.runs[int(step[1]) % len(world.runs)]  # type: ignore[call-overload]
        shard = world.state.shards[run.shard]
        if kind in ("commit", "replay", "zombie"):
            presented = report(run)
            if kind == "zombie":
                presented = presented.model_copy(update={"epoch": run.epoch - 1})
            valid = (
                shard.owner == presented.member_id
                and shard.epoch == presented.epoch
                and shard.committed == presented.start
                and shard.inflight is not None
                and shard.inflight.run_key == presented.run_key
            )
            world.state, outcome = protocol.commit(world.state, presented)
            if not outcome.already_committed:
                assert outcome.accepted == valid, "a commit is accepted exactly when it is fenced correctly"
            if outcome.accepted and not outcome.already_committed:
                assert world.cursor.get(run.shard, run.start) == run.start, "committed ranges are contiguous"
                world.cursor[run.shard] = run.end
            if kind == "replay":
                again, second = protocol.commit(world.state, presented)
                assert again is world.state and (second.accepted == outcome.accepted or second.already_committed)
        elif kind == "stale_fail":  # a run of an earlier epoch, or another member's, reports a failure
            for stale in (
                report(run).model_copy(update={"epoch": run.epoch - 1}),
                report(run).model_copy(update={"member_id": "z"}),
            ):
                same, ignored = protocol.fail(world.state, stale, "stale", world.now, POLICY)
                assert same is world.state and ignored is protocol.FailOutcome.IGNORED, "only the run in flight fails"
        else:
            world.state, _ = protocol.fail(world.state, report(run), "boom", world.now, POLICY)
    check_step(before, world.state, world)
    for sid, shard in world.state.shards.items():
        if shard.committed is None:
            world.cursor.pop(sid, None)  # a recreated log: positioned again
        elif sid in world.cursor and shard.committed != world.cursor[sid]:
            # committed moved other than by a commit: a dead letter, a retention skip, a reset, a first positioning
            world.cursor[sid] = shard.committed


def settle(world: World, live: list[str]) -> None:
    """No more faults: every live member ticks and every run commits, until the group is quiet."""
    world.cut = 0
    world.missing.clear()
    world.scopes.clear()
    for _ in range(12):
        for member in live:
            world.now += POLICY.heartbeat_interval_s / len(live)
            apply(world, ("tick", member, 0.0, 0.0))
        for run in list(world.runs):
            apply(world, ("commit", world.runs.index(run)))
        world.runs = []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(op, max_size=80), shards=st.integers(1, 9), in_stream=st.none() | st.integers(0, 150))
def test_invariants_hold_under_random_faults_and_the_group_converges(
    steps: list[tuple[object, ...]], shards: int, in_stream: int | None
) -> None:
    state = protocol.sync_shards(protocol.new_group("s", "g", 0.0), [f"p{i % 2}:{i}" for i in range(shards)], 0.0)
    world = World(state=state, in_stream=in_stream)
    for step in steps:
        apply(world, step)
    live = ["a", "b"]
    world.now += POLICY.drain_timeout_s + POLICY.session_timeout_s
    settle(world, live)
    final = world.state
    assert set(final.members) == set(live), "silent members are evicted"
    counts = {m: 0 for m in live}
    for shard in final.shards.values():
        if is_assignable(final, shard):
            assert shard.owner in counts, "once membership is quiet every shard is owned"
            counts[shard.owner] += 1
    assert max(counts.values()) - min(counts.values()) <= 1, counts


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
@example(seed=89519987)  # a log recreated in the step that dead-lettered its range in flight (its member evicted)
def test_simulated_groups_keep_every_invariant(seed: int) -> None:
    result = Simulation(random_scenario(seed)).run()
    assert result.violations == []


def test_simulator_detects_a_commit_that_ignores_the_epoch(monkeypatch: object) -> None:
    """The checks can fail: with fencing removed, the simulator reports violations."""
    from dagster_streamgroup.protocol import completion
    from dagster_streamgroup.protocol.completion import commit as fenced_commit

    def unfenced(
        state: GroupState, presented: protocol.RangeReport, identity: str | None = None
    ) -> tuple[GroupState, protocol.CommitOutcome]:
        shard = state.shards[presented.shard]
        if shard.inflight is None or shard.committed is None:
            return fenced_commit(state, presented)
        inflight = protocol.state.evolve(shard.inflight, run_key=presented.run_key)
        forced = protocol.state.evolve(shard, owner=presented.member_id, epoch=presented.epoch, inflight=inflight)
        return fenced_commit(state.model_copy(update={"shards": {**state.shards, presented.shard: forced}}), presented)

    monkeypatch.setattr(completion, "commit", unfenced)  # type: ignore[attr-defined]
    found = [Simulation(random_scenario(seed)).run().violations for seed in range(40)]
    assert any(found), "an unfenced commit must break an invariant in some scenario"


def test_simulator_detects_a_recreated_log_read_from_the_old_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks can fail: with a recreated log taken for the old one (its offsets kept, as before topic ids were
    in the state), the simulator reports the offsets carried into the new log."""
    from dagster_streamgroup.protocol import lifecycle

    def kept(shard_id: str, shard: protocol.ShardState, identity: str, *args: object) -> tuple[object, object]:
        event = protocol.GroupEvent(kind=protocol.EventKind.RECREATED, at=0.0, shard=shard_id, start=shard.committed)
        return protocol.state.evolve(shard, identity=identity), event

    monkeypatch.setattr(lifecycle, "recreated", kept)
    scenarios = [random_scenario(seed) for seed in range(40)]
    found = [Simulation(c).run().violations for c in scenarios if c.lifecycle]
    assert any("carried over into a new log" in v for vs in found for v in vs)


def test_simulator_detects_a_recreated_log_whose_event_names_the_wrong_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks can fail: a ``recreated`` event that names an offset past the group's (records of the old log
    neither read nor named) is reported."""
    from dagster_streamgroup.protocol import lifecycle

    real = lifecycle.recreated

    def misnamed(*args: Any) -> tuple[protocol.ShardState, protocol.GroupEvent]:
        shard, event = real(*args)
        return shard, protocol.state.evolve(event, start=(event.start or 0) + 1)

    monkeypatch.setattr(lifecycle, "recreated", misnamed)
    scenarios = [random_scenario(seed) for seed in range(40)]
    found = [Simulation(c).run().violations for c in scenarios if c.lifecycle]
    assert any("recreated without an event naming" in v for vs in found for v in vs)


def test_cold_start_and_failover_converge_within_their_bounds() -> None:
    policy = GroupPolicy(heartbeat_interval_s=5, session_timeout_s=20, max_records_per_run=10**6)
    result = Simulation(
        SimConfig(members=12, shards=200, seed=7, policy=policy, duration_s=90, quiet_s=0, crash_at_s=50)
    ).run()
    assert result.violations == []
    assert result.ticks_to_balance is not None and result.ticks_to_balance <= 3
    assert result.ticks_to_failover is not None
    assert result.ticks_to_failover <= policy.session_timeout_s / policy.heartbeat_interval_s + 1


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(min_value=0, max_value=10_000))
def test_every_write_is_restored_exactly_from_its_delta(seed: int) -> None:
    """A store may append what a write changed instead of the whole state: the delta of every write of random
    fault scenarios restores the state exactly, and a heartbeat is a few hundred bytes at most."""
    config = random_scenario(seed)
    config.measure_deltas = True
    result = Simulation(config).run()
    assert result.violations == []
    assert result.delta_bytes
    assert all(size < 1_000 for size in result.heartbeat_delta_bytes)
