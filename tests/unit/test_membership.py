from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import EventKind
from tests.unit.protocol_helpers import POLICY, balanced_start, group, marks, owned


def test_join_then_heartbeat_moves_forward_only() -> None:
    state = protocol.heartbeat(group(), "a", 10.0)
    assert state.members["a"].joined == 10.0
    later = protocol.heartbeat(state, "a", 12.0)
    assert later.members["a"].heartbeat == 12.0 and later.members["a"].joined == 10.0
    skewed = protocol.heartbeat(later, "a", 11.0)
    assert skewed is later, "a heartbeat from a clock running behind must not move the heartbeat back"


def test_heartbeat_is_idempotent() -> None:
    state = protocol.heartbeat(group(), "a", 3.0)
    assert protocol.heartbeat(state, "a", 3.0) is state


def test_evict_stale_returns_idle_shards_at_committed_offsets_with_new_epoch() -> None:
    state = balanced_start(4, ("a", "b"))
    state = state.model_copy(
        update={"shards": {sid: protocol.state.evolve(s, committed=7) for sid, s in state.shards.items()}}
    )
    a_shards = owned(state, "a")
    state = protocol.heartbeat(state, "b", 30.0)
    evicted = protocol.evict_stale(state, 30.0, POLICY.session_timeout_s)
    assert "a" not in evicted.members and "b" in evicted.members
    for sid in a_shards:
        shard = evicted.shards[sid]
        assert shard.owner is None and shard.committed == 7
        assert shard.epoch == state.shards[sid].epoch + 1
    assert evicted.events[-1].kind is EventKind.EVICTED and evicted.events[-1].member_id == "a"
    assert protocol.evict_stale(evicted, 30.0, POLICY.session_timeout_s) is evicted


def test_evicted_member_with_range_in_flight_drains_instead_of_losing_the_shard() -> None:
    state = balanced_start(2, ("a", "b"))
    state, launches = protocol.plan(state, "a", 5.0, marks(state), POLICY)
    (launch,) = launches
    state = protocol.heartbeat(state, "b", 40.0)
    evicted = protocol.evict_stale(state, 40.0, POLICY.session_timeout_s)
    shard = evicted.shards[launch.shard]
    assert shard.owner == "a" and shard.epoch == launch.epoch, "a shard with a range in flight is never released"
    assert shard.inflight is not None and shard.inflight.orphaned_at == 40.0
    assert protocol.is_draining(evicted, shard)
    rebalanced = protocol.rebalance(evicted, "b", 40.0, POLICY)
    assert rebalanced.shards[launch.shard].owner == "a", "a draining shard is not reassigned"


def test_drain_expiry_reassigns_and_fences_the_old_run() -> None:
    state = balanced_start(2, ("a", "b"))
    state, (launch,) = protocol.plan(state, "a", 5.0, marks(state), POLICY)
    state = protocol.heartbeat(state, "b", 40.0)
    state = protocol.evict_stale(state, 40.0, POLICY.session_timeout_s)
    assert protocol.expire_drains(state, 99.0, POLICY.drain_timeout_s) is state
    expired = protocol.expire_drains(state, 100.0, POLICY.drain_timeout_s)
    shard = expired.shards[launch.shard]
    assert shard.owner is None and shard.inflight is None and shard.epoch == launch.epoch + 1
    assert expired.events[-1].kind is EventKind.DRAIN_EXPIRED
    _, outcome = protocol.commit(expired, _report(launch))
    assert not outcome.accepted and outcome.refusal is protocol.Refusal.OWNERSHIP_MOVED


def test_commit_of_a_draining_run_is_accepted_and_frees_the_shard() -> None:
    state = balanced_start(2, ("a", "b"))
    state, (launch,) = protocol.plan(state, "a", 5.0, marks(state), POLICY)
    state = protocol.heartbeat(state, "b", 40.0)
    state = protocol.evict_stale(state, 40.0, POLICY.session_timeout_s)
    committed, outcome = protocol.commit(state, _report(launch))
    assert outcome.accepted
    shard = committed.shards[launch.shard]
    assert shard.committed == launch.end and shard.owner is None and shard.epoch == launch.epoch + 1


def test_explicit_leave_hands_shards_back_now() -> None:
    state = balanced_start(4, ("a", "b"))
    left = protocol.leave(state, "a", 6.0)
    assert "a" not in left.members
    assert all(s.owner != "a" for s in left.shards.values())
    assert left.events[-1].kind is EventKind.LEFT
    assert protocol.leave(left, "a", 6.0) is left


def test_a_member_that_returns_under_its_id_keeps_its_draining_runs() -> None:
    state = balanced_start(2, ("a", "b"))
    state, (launch,) = protocol.plan(state, "a", 5.0, marks(state), POLICY)
    state = protocol.leave(state, "a", 6.0)
    back = protocol.heartbeat(state, "a", 7.0)
    shard = back.shards[launch.shard]
    assert shard.owner == "a" and shard.inflight is not None and shard.inflight.orphaned_at is None
    assert protocol.expire_drains(back, 1000.0, POLICY.drain_timeout_s) is back


def _report(launch: protocol.Launch) -> protocol.RangeReport:
    from tests.unit.protocol_helpers import report

    return report(launch)


def test_a_range_handed_over_keeps_its_bounds() -> None:
    """After a drain expiry (or a run that stopped saying it is alive) the new owner reads exactly the range the
    old run held first, whatever the backlog now: a zombie that still writes its output writes the same range's
    output, which the relaunch replaces, never an overlapping one."""
    state = balanced_start(2, ("a", "b"))
    small = {sid: protocol.Watermark(low=0, high=30) for sid in state.shards}
    state, launches = protocol.plan(state, "a", 5.0, small, POLICY)
    (launch,) = launches
    assert (launch.start, launch.end) == (0, 30)
    state = protocol.heartbeat(state, "b", 40.0)
    state = protocol.evict_stale(state, 40.0, POLICY.session_timeout_s)
    expired = protocol.expire_drains(state, 100.0, POLICY.drain_timeout_s)
    assert expired.shards[launch.shard].retry_end == 30 and expired.shards[launch.shard].attempt == 0
    taken = protocol.rebalance(protocol.heartbeat(expired, "b", 101.0), "b", 101.0, POLICY)
    grown = {sid: protocol.Watermark(low=0, high=100_000) for sid in taken.shards}
    _, relaunched = protocol.plan(taken, "b", 101.0, grown, POLICY)
    assert [(x.start, x.end, x.attempt) for x in relaunched if x.shard == launch.shard] == [(0, 30, 0)]
