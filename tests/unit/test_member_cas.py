"""The CAS loop of member.py over the in-process store: conflicts re-run the transition on fresh state."""

import pytest

from dagster_streamgroup import protocol
from dagster_streamgroup.member import ContentionError, update_state
from dagster_streamgroup.protocol import GroupState
from dagster_streamgroup.stores.memory import MemoryStore


def test_conflict_reruns_the_transition_on_fresh_state() -> None:
    store = MemoryStore(clock=lambda: 1.0)
    assert store.save_if("k", protocol.new_group("s", "g", 0.0), None)
    seen: list[set[str]] = []

    def add_member(current: GroupState | None, now: float) -> tuple[GroupState, int]:
        assert current is not None
        seen.append(set(current.members))
        if len(seen) == 1:  # another member writes between our load and our save
            other, token = store.load("k")
            assert other is not None
            assert store.save_if("k", protocol.heartbeat(other, "other", now), token)
        return protocol.heartbeat(current, "me", now), len(seen)

    attempts, stats = update_state(store, "k", add_member, sleep=lambda _s: None)
    assert attempts == 2 and stats.conflicts == 1
    assert seen == [set(), {"other"}]
    final, _ = store.load("k")
    assert final is not None and set(final.members) == {"me", "other"}
    assert final.revision == 1, "update_state counts its own write"


def test_persistent_contention_gives_up_with_a_clear_error() -> None:
    store = MemoryStore(clock=lambda: 1.0)
    assert store.save_if("k", protocol.new_group("s", "g", 0.0), None)

    def always_raced(current: GroupState | None, now: float) -> tuple[GroupState, None]:
        other, token = store.load("k")
        assert other is not None and current is not None
        store.save_if("k", other.model_copy(update={"revision": other.revision + 1}), token)
        return protocol.heartbeat(current, "me", now), None

    with pytest.raises(ContentionError, match="3 attempts"):
        update_state(store, "k", always_raced, max_attempts=3, sleep=lambda _s: None)


def test_no_write_when_nothing_changes() -> None:
    store = MemoryStore(clock=lambda: 1.0)
    assert store.save_if("k", protocol.new_group("s", "g", 0.0), None)
    _, token_before = store.load("k")
    result, stats = update_state(store, "k", lambda current, _now: (current, "same"), sleep=lambda _s: None)
    _, token_after = store.load("k")
    assert result == "same" and stats.attempts == 1 and token_before == token_after


class _RacedStore(MemoryStore):
    """A real in-process store where another writer gets in between each load and save, ``races`` times."""

    def __init__(self, races: int) -> None:
        super().__init__(clock=lambda: 1.0)
        self.races = races

    def save_if(self, key: str, state: GroupState, token: str | None) -> bool:
        if self.races > 0 and token is not None:
            self.races -= 1
            other, current = super().load(key)
            assert other is not None
            super().save_if(key, other.model_copy(update={"revision": other.revision + 1}), current)
        return super().save_if(key, state, token)


def test_a_runs_commit_outlasts_more_contention_than_a_tick() -> None:
    """A tick gives up after 6 conflicts (its work waits for the next tick); a run's commit keeps trying, or all
    its records would be read again."""
    from dagster_streamgroup.member import GroupMember
    from dagster_streamgroup.protocol import GroupPolicy, Watermark
    from dagster_streamgroup.streams.kafka import KafkaBackend
    from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

    store = _RacedStore(races=0)
    config = KafkaStreamConfig(bootstrap_servers="127.0.0.1:9", topics=["t"])
    backend = KafkaBackend(config, cluster_id="unit-test")  # never connects
    policy = GroupPolicy(join_grace_s=0, min_backlog=1)
    member = GroupMember(store, backend, "g", "m", policy, sleep=lambda _s: None)
    state = protocol.sync_shards(protocol.new_group(backend.stream_id, "g", 0.0), ["t:0"], 0.0)
    state = protocol.heartbeat(state, "m", 1.0)
    state = protocol.rebalance(state, "m", 1.0, policy)
    state, launches = protocol.plan(state, "m", 1.0, {"t:0": Watermark(low=0, high=10)}, policy)
    assert store.save_if(member.key, state, None)
    store.races = 10
    outcome, stats = member.commit_run_state_only([protocol.report_of(x) for x in launches])
    assert outcome.accepted and stats.conflicts == 10
