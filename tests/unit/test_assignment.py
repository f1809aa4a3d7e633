import pytest

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import GroupPolicy
from tests.unit.protocol_helpers import POLICY, balanced_start, group, marks, owned


@pytest.mark.parametrize(("shards", "members"), [(10, 3), (3, 5), (1, 1), (12, 4), (0, 2), (7, 7)])
def test_quotas_cover_every_shard_and_differ_by_at_most_one(shards: int, members: int) -> None:
    ids = tuple(f"m{i}" for i in range(members))
    quotas = protocol.quotas(group(shards, ids))
    assert sum(quotas.values()) == shards
    assert max(quotas.values()) - min(quotas.values()) <= 1


def test_no_assignment_before_the_join_grace() -> None:
    state = group(8, ("a", "b"))
    assert protocol.rebalance(state, "a", POLICY.grace_s - 0.01, POLICY) is state


def test_cold_start_balances_in_one_write() -> None:
    ids = tuple(f"m{i}" for i in range(5))
    state = balanced_start(23, ids)
    counts = [len(owned(state, m)) for m in ids]
    assert sum(counts) == 23 and max(counts) - min(counts) <= 1
    assert all(s.epoch == 1 for s in state.shards.values()), "each ownership change bumps the epoch once"
    assert protocol.rebalance(state, "m3", 10.0, POLICY) is state, "a balanced group is left alone"


def test_new_member_gets_idle_surplus_but_never_a_shard_in_flight() -> None:
    state = balanced_start(4, ("a",))
    state, launches = protocol.plan(state, "a", 5.0, {"s0": marks(state)["s0"]}, POLICY)
    assert [launch.shard for launch in launches] == ["s0"]
    state = protocol.heartbeat(state, "b", 6.0)
    state = protocol.rebalance(state, "a", 6.0, POLICY)
    assert state.shards["s0"].owner == "a"
    assert len(owned(state, "a")) == 2 and len(owned(state, "b")) == 2


def test_surplus_shard_in_flight_moves_after_its_commit() -> None:
    state = balanced_start(2, ("a",))
    state, launches = protocol.plan(state, "a", 5.0, marks(state), POLICY)
    state = protocol.heartbeat(state, "b", 6.0)
    state = protocol.rebalance(state, "b", 6.0 + POLICY.grace_s, POLICY)
    assert len(owned(state, "a")) == 2, "both shards are in flight: nothing moves"
    from tests.unit.protocol_helpers import report

    state, outcome = protocol.commit(state, report(launches[1]))
    assert outcome.accepted
    state = protocol.rebalance(state, "b", 7.0 + POLICY.grace_s, POLICY)
    assert owned(state, "b") == [launches[1].shard]


def test_departed_member_shards_with_nothing_in_flight_are_reassigned_in_the_evicting_write() -> None:
    state = balanced_start(6, ("a", "b", "c"))
    policy = GroupPolicy(heartbeat_interval_s=5, session_timeout_s=20)
    state = protocol.heartbeat(protocol.heartbeat(state, "b", 30.0), "c", 30.0)
    state = protocol.membership_step(state, "b", 30.0, policy)
    assert len(owned(state, "b")) == 3 and len(owned(state, "c")) == 3
