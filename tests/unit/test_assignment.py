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


def test_the_surplus_is_asked_of_a_member_that_can_give_it_not_of_one_whose_shards_are_all_in_flight() -> None:
    """Seven shards: a and b hold three each, c one; one of a and b gives a shard to c. b's shards are all in
    flight under a long run and a's are idle: a gives, so the group balances now instead of waiting for b's run
    while a keeps launching (by id alone, b would be the one asked, and c would wait)."""
    state = group(7, ("a", "b", "c"))
    owners = {"s0": "a", "s1": "a", "s2": "a", "s3": "b", "s4": "b", "s5": "b", "s6": "c"}
    shards = {sid: protocol.state.evolve(shard, owner=owners[sid]) for sid, shard in state.shards.items()}
    state = state.model_copy(update={"shards": shards})
    state, launches = protocol.plan(state, "b", 1.0, {s: marks(state)[s] for s in ("s3", "s4", "s5")}, POLICY)
    assert {x.shard for x in launches} == {"s3", "s4", "s5"}
    state = protocol.rebalance(state, "c", POLICY.grace_s, POLICY)
    counts = {m: len(owned(state, m)) for m in ("a", "b", "c")}
    assert counts == {"a": 2, "b": 3, "c": 2}, counts
    assert protocol.quotas(state) == {"a": 2, "b": 3, "c": 2}
