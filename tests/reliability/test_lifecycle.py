"""A topic over the group's whole life, against Apache Kafka: recreated (past the committed offset, under a range in
flight), added to and removed from the group's list, the state store lost after a ``seek="latest"`` start, reset
with Kafka's own consumer-groups tool, and deleted beside a healthy topic.

Each drives real ``GroupMember`` ticks over a real ``KafkaBackend`` and SQLite store; what a run does (read, then
``commit_run``) is done in the test. Every case says what the group read, what it committed and which event names
what it did not read: no offset of any topic version is skipped without an event.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dagster_streamgroup import protocol
from dagster_streamgroup.local.kafka_data import create_topics, delete_topics, produce_records, produce_sample
from dagster_streamgroup.member import GroupMember, TickReport, update_state
from dagster_streamgroup.protocol import GroupEvent, GroupState, Launch, report_of
from dagster_streamgroup.stores.sql import SqlStateStore
from dagster_streamgroup.streams.base import StreamError
from tests.fixtures.kafka import TopicFactory, unique_name
from tests.fixtures.kafka_tools import reset_with_kafkas_tool, topic_id
from tests.reliability.conftest import SESSION_TIMEOUT_S, commit_in_flight, kafka_backend, member_of

pytestmark = pytest.mark.kafka


def _until(condition: Any, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:.0f} s"
        time.sleep(0.2)


def _gone(bootstrap: str, topic: str) -> bool:
    try:
        kafka_backend(bootstrap, topic).shards()
    except StreamError:
        return True
    return False


def recreate(bootstrap: str, topic: str, partitions: int) -> None:
    """The topic deleted and created again under the same name (a new topic id, its offsets from 0)."""
    delete_topics(bootstrap, [topic])
    _until(lambda: _gone(bootstrap, topic), f"the deletion of {topic}")
    create_topics(bootstrap, {topic: partitions})


def tick(member: GroupMember, timeout_s: float = 20.0) -> TickReport:
    """A member tick, again while a topic created a moment ago has no leader yet (Apache Kafka answers
    ``NOT_LEADER_OR_FOLLOWER`` until it is elected)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return member.tick()
        except StreamError as exc:
            if "leader" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def events_of(report: TickReport | GroupState | None, kind: str) -> list[GroupEvent]:
    assert report is not None
    events = report.new_events if isinstance(report, TickReport) else list(report.events)
    return [e for e in events if e.kind == kind]


def unpark(member: GroupMember, shard: str) -> None:
    """``streamgroup unpark --shard ...``, as the CLI writes it."""

    def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, None]:
        assert current is not None
        return protocol.unpark(current, shard, now), None

    update_state(member.store, member.key, transition)


def spans(launches: list[Launch]) -> list[tuple[str, int, int]]:
    return sorted((x.shard, x.start, x.end) for x in launches)


# ----------------------------------------------------------------------------------------------------------------
# 1. a topic recreated


@pytest.mark.parametrize("on_recreated", ["park", "earliest"])
def test_a_topic_recreated_past_the_committed_offset_is_told_apart_by_its_id(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str, on_recreated: str
) -> None:
    """Recreated and grown past the group's offset before the next tick: the high watermark alone cannot tell it
    from the old topic, and its records 0 up to the old offset used to be skipped without a word. The topic id
    tells them apart: an event names both ids and the old offset; ``park`` stops the shard until an operator
    resumes it (then the new topic is read from its first record), ``earliest`` starts the new topic at once."""
    topic = kafka_topics(1)
    shard = f"{topic}:0"
    [old_end] = produce_sample(kafka_bootstrap, topic, 1, 40).values()
    policy = {} if on_recreated == "park" else {"on_recreated": on_recreated}
    member = member_of(SqlStateStore(sqlite_url), kafka_backend(kafka_bootstrap, topic), unique_name("g"), **policy)
    member.tick()
    commit_in_flight(member)
    old_id = topic_id(kafka_bootstrap, topic)
    recreate(kafka_bootstrap, topic, 1)
    [new_end] = produce_sample(kafka_bootstrap, topic, 1, 99).values()
    assert new_end > old_end
    new_id = topic_id(kafka_bootstrap, topic)
    report = tick(member)
    [event] = events_of(report, "recreated")
    assert event.shard == shard and event.start == old_end
    assert old_id in event.detail and new_id in event.detail, event.detail
    if on_recreated == "park":
        assert report.new_launches == [], "nothing of the new topic is read past an offset of the old one"
        parked = report.state.shards[shard].parked
        assert parked is not None and "recreated" in parked.reason
        unpark(member, shard)
        report = member.tick()
    assert spans(report.new_launches) == [(shard, 0, new_end)], "the new topic is read from its first record"


@pytest.mark.parametrize("tick_between", [True, False], ids=["a tick sees it first", "the commit sees it"])
def test_a_range_in_flight_when_its_topic_is_recreated_is_refused_with_a_typed_reason(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str, tick_between: bool
) -> None:
    """A run that read its range from the new topic (or from the old one, gone now) must not commit it over the
    new topic's offsets: refused as ``recreated`` (fenced by the tick that saw the new id, or by the commit's own
    look at the topic's id), and nothing is mirrored onto the new topic."""
    topic = kafka_topics(1)
    shard = f"{topic}:0"
    produce_sample(kafka_bootstrap, topic, 1, 40)
    backend = kafka_backend(kafka_bootstrap, topic)
    group = unique_name("g")
    member = member_of(SqlStateStore(sqlite_url), backend, group)
    [launch] = member.tick().new_launches
    recreate(kafka_bootstrap, topic, 1)
    produce_sample(kafka_bootstrap, topic, 1, 99)
    if tick_between:
        tick(member)
    outcome = member.commit_run([report_of(launch)])
    assert not outcome.accepted and outcome.outcomes[shard].refusal == "recreated", outcome
    assert backend.committed(group, [shard]) == {shard: None}, "nothing mirrored onto the new topic"
    report = tick(member)
    state = report.state.shards[shard]
    assert state.committed is None or state.committed == 0 or state.parked is not None


# ----------------------------------------------------------------------------------------------------------------
# 2. the topic list changes; the state is lost


def test_a_topic_added_to_the_list_keeps_the_position_of_a_shard_that_never_committed(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    """``seek="latest"`` put the shard at the end and nothing was committed since; then a topic is added. The
    group keeps its state (keyed by group and cluster, not by the topic list): the records written meanwhile are
    read, and the added topic from its first record."""
    first, added = kafka_topics(1, prefix="first"), kafka_topics(1, prefix="added")
    [end] = produce_sample(kafka_bootstrap, first, 1, 40).values()
    store, group = SqlStateStore(sqlite_url), unique_name("g")
    before = member_of(store, kafka_backend(kafka_bootstrap, first), group, seek="latest")
    assert before.tick().new_launches == []
    waiting = produce_records(kafka_bootstrap, first, 0, [b"w"] * 20)
    [added_end] = produce_sample(kafka_bootstrap, added, 1, 5).values()
    after = member_of(store, kafka_backend(kafka_bootstrap, first, added), group, seek="latest")
    report = after.tick()
    assert spans(report.new_launches) == [(f"{added}:0", 0, added_end), (f"{first}:0", end, waiting[-1] + 1)]


def test_a_range_in_flight_under_the_old_topic_list_is_not_planned_again(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    first, added = kafka_topics(1, prefix="first"), kafka_topics(1, prefix="added")
    produce_sample(kafka_bootstrap, first, 1, 20)
    produce_sample(kafka_bootstrap, added, 1, 5)
    store, group = SqlStateStore(sqlite_url), unique_name("g")
    old = member_of(store, kafka_backend(kafka_bootstrap, first), group)
    [launch] = old.tick().new_launches
    new = member_of(store, kafka_backend(kafka_bootstrap, first, added), group)
    report = new.tick()
    assert [x.shard for x in report.new_launches] == [f"{added}:0"], "the range in flight is not planned twice"
    outcome = old.commit_run([report_of(launch)])
    assert outcome.accepted, "the run launched under the old list commits into the same state"
    assert new.tick().new_launches == [] and commit_in_flight(new)[f"{added}:0"].accepted


def test_a_topic_removed_from_the_list_releases_its_shards_once_their_runs_end(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    kept, removed = kafka_topics(1, prefix="kept"), kafka_topics(1, prefix="removed")
    produce_sample(kafka_bootstrap, kept, 1, 10)
    [removed_end] = produce_sample(kafka_bootstrap, removed, 1, 10).values()
    store, group = SqlStateStore(sqlite_url), unique_name("g")
    both = member_of(store, kafka_backend(kafka_bootstrap, kept, removed), group)
    launches = {x.shard: x for x in both.tick().new_launches}
    one = member_of(store, kafka_backend(kafka_bootstrap, kept), group)
    report = one.tick()
    [event] = events_of(report, "removed")
    assert event.shard == f"{removed}:0" and removed in event.detail
    assert report.state.shards[f"{removed}:0"].inflight is not None, "its run in flight may still commit"
    outcome = one.commit_run([report_of(launches[f"{removed}:0"])])
    assert outcome.accepted, "the commit of a run in flight over a removed topic counts"
    produce_records(kafka_bootstrap, removed, 0, [b"later"] * 3)
    report = one.tick()
    shard = report.state.shards[f"{removed}:0"]
    assert shard.owner is None and shard.committed == removed_end, "released at its committed offset"
    assert all(x.shard != f"{removed}:0" for x in report.new_launches), "nothing of a removed topic is planned"


def test_a_lost_state_resumes_where_seek_latest_first_put_the_shard(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """The shard's starting offset is mirrored into Kafka's group offsets the moment the seek policy positions
    it, so a state lost before its first commit resumes there, never from the seek policy again."""
    topic = kafka_topics(1)
    [end] = produce_sample(kafka_bootstrap, topic, 1, 40).values()
    group = unique_name("g")
    backend = kafka_backend(kafka_bootstrap, topic)
    lost = member_of(SqlStateStore(f"sqlite:///{tmp_path / 'lost.db'}"), backend, group, seek="latest")
    assert lost.tick().new_launches == []
    assert backend.committed(group, [f"{topic}:0"]) == {f"{topic}:0": end}, "mirrored at once"
    waiting = produce_records(kafka_bootstrap, topic, 0, [b"w"] * 20)
    fresh = member_of(SqlStateStore(f"sqlite:///{tmp_path / 'fresh.db'}"), backend, group, seek="latest")
    assert spans(fresh.tick().new_launches) == [(f"{topic}:0", end, waiting[-1] + 1)]


# ----------------------------------------------------------------------------------------------------------------
# 3. Kafka's own reset tool


def test_a_reset_made_with_kafkas_tool_is_refused_visibly_and_the_mirror_restored(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    """The group is Empty to Kafka, so its tool accepts a reset at any time; the group state, fenced, is where the
    group's offsets live, so the reset is not applied: an event says so (and names ``streamgroup reset``), and
    the mirror is restored. Backwards (records would be read again) and forwards over a backlog (records would be
    skipped, while Kafka's lag tools showed lag 0): neither moves what the group reads."""
    topic = kafka_topics(1)
    shard = f"{topic}:0"
    [end] = produce_sample(kafka_bootstrap, topic, 1, 40).values()
    backend, group = kafka_backend(kafka_bootstrap, topic), unique_name("g")
    member = member_of(SqlStateStore(sqlite_url), backend, group)
    member.tick()
    commit_in_flight(member)
    reset_with_kafkas_tool(kafka_bootstrap, group, topic, "--to-offset", "10")
    assert backend.committed(group, [shard]) == {shard: 10}
    report = member.tick()
    [refused] = events_of(report, "reset_refused")
    assert refused.shard == shard and "10" in refused.detail and str(end) in refused.detail
    assert "streamgroup reset" in refused.detail
    assert report.new_launches == [] and report.state.shards[shard].committed == end
    assert backend.committed(group, [shard]) == {shard: end}, "the mirror is restored"

    more = produce_records(kafka_bootstrap, topic, 0, [b"m"] * 50)
    reset_with_kafkas_tool(kafka_bootstrap, group, topic, "--to-latest")
    assert backend.committed(group, [shard]) == {shard: more[-1] + 1}
    report = member.tick()
    assert len(events_of(report, "reset_refused")) == 1
    assert spans(report.new_launches) == [(shard, end, more[-1] + 1)], "the backlog is read, not skipped"
    assert backend.committed(group, [shard]) == {shard: end}


def test_after_a_lost_state_an_offset_set_with_kafkas_tool_is_used_with_an_event(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """With the state gone, Kafka's group offsets are all the group has: an offset that Kafka's tool wrote (not the
    members' mirror) is taken, and an event says where it came from."""
    topic = kafka_topics(1)
    shard = f"{topic}:0"
    [end] = produce_sample(kafka_bootstrap, topic, 1, 40).values()
    backend, group = kafka_backend(kafka_bootstrap, topic), unique_name("g")
    member = member_of(SqlStateStore(f"sqlite:///{tmp_path / 'lost.db'}"), backend, group)
    member.tick()
    commit_in_flight(member)
    reset_with_kafkas_tool(kafka_bootstrap, group, topic, "--to-offset", "10")
    fresh = member_of(SqlStateStore(f"sqlite:///{tmp_path / 'fresh.db'}"), backend, group)
    report = fresh.tick()
    [adopted] = events_of(report, "adopted")
    assert adopted.shard == shard and adopted.start == 10
    assert spans(report.new_launches) == [(shard, 10, end)]


# ----------------------------------------------------------------------------------------------------------------
# 6. a deleted topic beside a healthy one


def test_a_deleted_topic_parks_its_shards_with_an_event_and_the_others_go_on(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    """One deleted topic used to fail every tick of the group (``topic ... does not exist``): no member
    heartbeated and the healthy topic's records waited. Now its shards are parked with a ``missing`` event once
    the topic has been missing for a session timeout, and everything else goes on."""
    healthy, deleted = kafka_topics(1, prefix="healthy"), kafka_topics(2, prefix="deleted")
    produce_sample(kafka_bootstrap, healthy, 1, 10)
    produce_sample(kafka_bootstrap, deleted, 2, 10)
    member = member_of(SqlStateStore(sqlite_url), kafka_backend(kafka_bootstrap, healthy, deleted), unique_name("g"))
    member.tick()
    commit_in_flight(member)
    delete_topics(kafka_bootstrap, [deleted])
    _until(lambda: _gone(kafka_bootstrap, deleted), f"the deletion of {deleted}")
    more = produce_records(kafka_bootstrap, healthy, 0, [b"new"] * 3)
    first = member.tick()
    assert spans(first.new_launches) == [(f"{healthy}:0", more[0], more[-1] + 1)], "the healthy topic goes on"
    heartbeat = first.state.members["m0"].heartbeat
    commit_in_flight(member)
    deadline = time.monotonic() + 3 * SESSION_TIMEOUT_S
    events: list[GroupEvent] = []
    while True:
        report = member.tick()
        events += events_of(report, "missing")
        if all(report.state.shards[f"{deleted}:{p}"].parked is not None for p in range(2)):
            break
        assert time.monotonic() < deadline, "the deleted topic's shards were not parked"
        time.sleep(1)
    assert report.state.members["m0"].heartbeat > heartbeat, "the member keeps heartbeating"
    assert sorted(str(e.shard) for e in events) == [f"{deleted}:0", f"{deleted}:1"]
    assert all(deleted in e.detail for e in events)
