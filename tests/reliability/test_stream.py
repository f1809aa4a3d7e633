"""The stream changing under the group: a topic deleted or recreated with fewer partitions, offsets past the
end, retention loss, access denied, and a v3io consumer group that v3io-go/Nuclio consumers already manage.

For each: the error or event names the stream, shard and offsets; no committed offset moves backwards or
past a record nobody processed; and the member ticks on by itself once the fault is gone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import v3io.dataplane
from confluent_kafka import KafkaError
from confluent_kafka.admin._metadata import ClusterMetadata, PartitionMetadata, TopicMetadata

from dagster_streamgroup.dagster import V3ioStreamGroup
from dagster_streamgroup.local.kafka_data import create_topics, delete_topics, produce_records, produce_sample
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo, V3ioServerProcess
from dagster_streamgroup.member import GroupMember, TickReport
from dagster_streamgroup.protocol import EventKind, GroupEvent, report_of
from dagster_streamgroup.stores.sql import SqlStateStore
from dagster_streamgroup.streams.base import OffsetOutOfRangeError, StreamError, Watermarks
from dagster_streamgroup.streams.v3io import V3ioBackend, committed_attribute
from dagster_streamgroup.streams.v3io_config import V3ioStreamConfig
from tests.fixtures.kafka import TopicFactory, unique_name
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io.conftest import CONTAINER, NewStream, put
from tests.reliability.conftest import (
    SESSION_TIMEOUT_S,
    commit_in_flight,
    kafka_backend,
    member_of,
    offsets,
)


def _until(condition: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the broker did not show the change in time"
        time.sleep(0.2)


def tick_until_parked(member: GroupMember, shards: list[str]) -> tuple[TickReport, list[GroupEvent]]:
    """Tick once per heartbeat, as the member's sensor does, until ``shards`` are parked (at most three session
    timeouts); the last report and every event of those ticks."""
    events: list[GroupEvent] = []
    deadline = time.monotonic() + 3 * SESSION_TIMEOUT_S
    while True:
        report = member.tick()
        events += report.new_events
        if all(report.state.shards[s].parked is not None for s in shards):
            return report, events
        assert time.monotonic() < deadline, (
            f"not parked: {[s for s in shards if report.state.shards[s].parked is None]}"
        )
        time.sleep(member.policy.heartbeat_interval_s)


def _topic_gone(bootstrap: str, topic: str) -> bool:
    try:
        kafka_backend(bootstrap, topic).shards()
    except StreamError:
        return True
    return False


def _tick_once_leaders_are_elected(member: GroupMember, timeout_s: float = 20.0) -> TickReport:
    """A topic created a moment ago may answer ``NOT_LEADER_OR_FOLLOWER`` until its leaders are elected (Apache
    Kafka does); the member's next ticks go on then."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return member.tick()
        except StreamError as exc:
            if "leader" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.kafka
def test_a_deleted_topic_parks_its_shards_and_the_member_keeps_heartbeating(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    """The group's only topic is deleted: the tick goes on (the member heartbeats, nothing is launched), and once
    the topic has been missing for a session timeout its shards are parked with a ``missing`` event naming it.
    It used to fail every tick (``topic ... does not exist``), without a heartbeat. The topic created again
    under the name is a new log: parked as ``recreated`` (``on_recreated="park"``), never read from the old
    offsets."""
    topic = kafka_topics(2)
    produce_sample(kafka_bootstrap, topic, 2, 20)
    member = member_of(SqlStateStore(sqlite_url), kafka_backend(kafka_bootstrap, topic), unique_name("g"))
    member.tick()
    commit_in_flight(member)
    before = offsets(member.load())
    delete_topics(kafka_bootstrap, [topic])
    _until(lambda: _topic_gone(kafka_bootstrap, topic))
    first = member.tick()
    assert first.new_launches == [] and first.state.members["m0"].heartbeat > 0
    later, events = tick_until_parked(member, [f"{topic}:0", f"{topic}:1"])
    missing = [e for e in events if e.kind == EventKind.MISSING]
    assert sorted(str(e.shard) for e in missing) == [f"{topic}:0", f"{topic}:1"]
    assert all(f"{topic!r} does not exist" in e.detail for e in missing)
    assert later.state.members["m0"].heartbeat > first.state.members["m0"].heartbeat, "the member heartbeats"
    assert offsets(later.state) == before, "parked at the committed offsets"
    create_topics(kafka_bootstrap, {topic: 2})
    report = _tick_once_leaders_are_elected(member)
    recreated = [e for e in report.new_events if e.kind == EventKind.RECREATED]
    assert sorted(str(e.shard) for e in recreated) == [f"{topic}:0", f"{topic}:1"]
    assert report.new_launches == [] and all(s.parked is not None for s in report.state.shards.values())


@pytest.mark.kafka
def test_a_topic_recreated_with_fewer_partitions_parks_what_vanished_and_the_rest_goes_on(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    """A vanished partition used to fail every tick of the group ("reading low watermarks: Local: Unknown
    partition"), forever, for every shard. The recreated topic's new id tells the group at the next tick: each of
    its shards is parked with a ``recreated`` event (``on_recreated="park"``; the vanished partitions too), and
    the other topic's shards keep launching."""
    steady, recreated = kafka_topics(1, prefix="steady"), kafka_topics(3, prefix="shrunk")
    produce_sample(kafka_bootstrap, steady, 1, 10)
    ends = produce_sample(kafka_bootstrap, recreated, 3, 30)
    member = member_of(SqlStateStore(sqlite_url), kafka_backend(kafka_bootstrap, steady, recreated), unique_name("g"))
    member.tick()
    commit_in_flight(member)
    before = offsets(member.load())
    assert before[f"{recreated}:2"] == ends[2]
    delete_topics(kafka_bootstrap, [recreated])
    _until(lambda: _topic_gone(kafka_bootstrap, recreated))
    create_topics(kafka_bootstrap, {recreated: 1})
    more = produce_records(kafka_bootstrap, steady, 0, [b"new-1", b"new-2"])
    first = _tick_once_leaders_are_elected(member)
    assert [(x.shard, x.start, x.end) for x in first.new_launches] == [
        (f"{steady}:0", before[f"{steady}:0"], more[-1] + 1)
    ]
    events = [e for e in first.new_events if e.kind == EventKind.RECREATED]
    assert sorted(str(e.shard) for e in events) == [f"{recreated}:{p}" for p in range(3)]
    assert {e.shard: e.start for e in events} == {f"{recreated}:{p}": ends[p] for p in range(3)}
    for p in range(3):
        parked = first.state.shards[f"{recreated}:{p}"].parked
        assert parked is not None and parked.cause == "recreated"
    assert first.state.shards[f"{steady}:0"].committed == before[f"{steady}:0"], "the steady range is in flight"


@pytest.mark.kafka
def test_a_recreated_topic_parks_the_shard_and_reads_nothing_of_the_new_topic(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    topic = kafka_topics(1)
    ends = produce_sample(kafka_bootstrap, topic, 1, 40)
    member = member_of(SqlStateStore(sqlite_url), kafka_backend(kafka_bootstrap, topic), unique_name("g"))
    member.tick()
    commit_in_flight(member)
    delete_topics(kafka_bootstrap, [topic])
    _until(lambda: _topic_gone(kafka_bootstrap, topic))
    create_topics(kafka_bootstrap, {topic: 1})
    produce_records(kafka_bootstrap, topic, 0, [b"a", b"b", b"c"])
    first = _tick_once_leaders_are_elected(member)
    [event] = [e for e in first.new_events if e.kind == EventKind.RECREATED]
    assert event.shard == f"{topic}:0" and event.start == ends[0] and str(ends[0]) in event.detail
    assert first.new_launches == [] and first.state.shards[f"{topic}:0"].parked is not None
    assert member.tick().new_launches == [], "nothing of the new topic is read until an operator says so"


@pytest.mark.v3io
def test_a_committed_offset_past_the_end_of_the_stream_parks_instead_of_reading(
    new_stream: NewStream, v3io_client: Any, sqlite_url: str
) -> None:
    """The group's offset that v3io keeps (the shard attribute) is past the shard's last record, as after a
    stream was deleted and recreated: nothing is launched, nothing is rewound, and the shard is parked."""
    backend = new_stream(1)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"x"] * 3)
    group = unique_v3io_name("cg")
    v3io_client.kv.update(CONTAINER, path, "0", attributes={committed_attribute(group): 500})
    member = member_of(SqlStateStore(sqlite_url), backend, group)
    first = member.tick()
    assert first.new_launches == [] and first.state.shards["0"].committed == 501
    later, events = tick_until_parked(member, ["0"])
    [event] = [e for e in events if e.kind == EventKind.OFFSETS_AHEAD]
    assert event.shard == "0" and "501" in event.detail
    assert later.state.shards["0"].committed == 501
    assert backend.committed(group, ["0"]) == {"0": 501}, "the stream's own record of the group is not rewound"


@pytest.fixture
def trimming_v3io(tmp_path: Path) -> Iterator[V3ioServerInfo]:
    """A v3io server whose retention hour lasts half a second: records older than that are trimmed as new
    ones arrive (the session's server keeps everything)."""
    server = V3ioServerProcess(tmp_path / "trimming", env={"STREAMGROUP_V3IO_HOUR_SECONDS": "0.5"})
    info = server.start()
    try:
        yield info
    finally:
        server.stop()


def _trimmed_stream(info: V3ioServerInfo) -> tuple[V3ioBackend, Any, str]:
    client = v3io.dataplane.Client(**info.client_kwargs())
    path = unique_v3io_name("trimmed")
    client.stream.create(CONTAINER, path, shard_count=1, retention_period_hours=1)
    config = V3ioStreamConfig(endpoint=info.endpoint, container=CONTAINER, stream_path=path, access_key=info.access_key)
    return V3ioBackend(config, stall_timeout_s=1.0), client, path


@pytest.mark.v3io
@pytest.mark.parametrize("on_data_loss", ["fail", "earliest"])
def test_offsets_lost_to_retention_are_an_event_and_never_a_silent_reset(
    trimming_v3io: V3ioServerInfo, sqlite_url: str, on_data_loss: str
) -> None:
    backend, client, path = _trimmed_stream(trimming_v3io)
    try:
        put(client, path, 0, [b"old"] * 4)
        member = member_of(SqlStateStore(sqlite_url), backend, "cg", on_data_loss=on_data_loss, max_records_per_run=2)
        member.tick()
        commit_in_flight(member)  # [1, 3) processed; 3 and 4 not yet
        time.sleep(1.0)
        put(client, path, 0, [b"new"] * 5)  # trims 1..4: records 3 and 4 were never processed
        assert backend.watermarks(["0"]) == {"0": Watermarks(5, 10)}
        report = member.tick()
        [loss] = [e for e in report.new_events if e.kind == EventKind.DATA_LOSS]
        assert (loss.shard, loss.start, loss.end) == ("0", 3, 5)
        shard = report.state.shards["0"]
        if on_data_loss == "fail":
            assert shard.parked is not None and shard.committed == 3 and report.new_launches == []
        else:
            assert [(x.start, x.end) for x in report.new_launches] == [(5, 7)]
            assert shard.committed == 5
    finally:
        backend.close()
        client.close()


@pytest.mark.v3io
def test_records_trimmed_between_the_plan_and_the_read_fail_the_read_by_range(
    trimming_v3io: V3ioServerInfo, sqlite_url: str
) -> None:
    backend, client, path = _trimmed_stream(trimming_v3io)
    try:
        put(client, path, 0, [b"old"] * 4)
        member = member_of(SqlStateStore(sqlite_url), backend, "cg")
        [launch] = member.tick().new_launches
        assert (launch.start, launch.end) == (1, 5)
        time.sleep(1.0)
        put(client, path, 0, [b"new"] * 3)  # the planned range is gone before its run reads it
        with pytest.raises(OffsetOutOfRangeError, match=r"shard 0: offsets \[1, 5\) are no longer in the stream"):
            list(backend.read_range("0", launch.start, launch.end))
        member.fail(report_of(launch), "OffsetOutOfRangeError: offsets [1, 5) are no longer in the stream")
        state = member.load()
        assert state is not None and state.shards["0"].committed == 1, "a failed read commits nothing"
        report = member.tick()
        assert any(e.kind == EventKind.DATA_LOSS and (e.start, e.end) == (1, 5) for e in report.new_events)
        assert report.new_launches == [] and report.state.shards["0"].parked is not None
    finally:
        backend.close()
        client.close()


@pytest.fixture
def locked_v3io(tmp_path: Path) -> Iterator[V3ioServerInfo]:
    server = V3ioServerProcess(tmp_path / "locked", access_key="the-right-key-0000")
    info = server.start()
    try:
        yield info
    finally:
        server.stop()


@pytest.mark.v3io
def test_a_refused_access_key_fails_the_tick_and_a_rotated_key_file_recovers(
    locked_v3io: V3ioServerInfo, sqlite_url: str, tmp_path: Path
) -> None:
    client = v3io.dataplane.Client(**locked_v3io.client_kwargs())
    path = unique_v3io_name("acl")
    client.stream.create(CONTAINER, path, shard_count=1)
    put(client, path, 0, [b"a", b"b"])
    client.close()
    key_file = tmp_path / "v3io-access-key"
    key_file.write_text("an-old-revoked-key")
    resource = V3ioStreamGroup(
        group="cg", endpoint=locked_v3io.endpoint, container=CONTAINER, stream_path=path,
        access_key_file=str(key_file), store_url=sqlite_url, heartbeat_interval_s=1, session_timeout_s=5,
        join_grace_s=0, min_backlog=1, max_wait_s=0,
    )  # fmt: skip
    with pytest.raises(StreamError, match=r"status 40[13]") as caught:
        resource.member("m0").tick()
    assert path in str(caught.value) and "an-old-revoked-key" not in str(caught.value)
    assert "the-right-key-0000" not in str(caught.value)
    assert resource.store().load(resource.state_key()) == (None, None), "a refused tick writes nothing"
    key_file.write_text("the-right-key-0000")  # the secret is rotated: the next tick uses the new key
    report = resource.member("m0").tick()
    assert [(x.shard, x.start, x.end) for x in report.new_launches] == [("0", 1, 3)]


@pytest.mark.kafka
def test_a_topic_the_broker_denies_is_named_with_the_brokers_error(kafka_bootstrap: str) -> None:
    """The local broker does not enforce ACLs, so the metadata answer of a broker that does (a topic with
    TOPIC_AUTHORIZATION_FAILED) is given to the backend by a stand-in admin client: the one mock here."""
    backend = kafka_backend(kafka_bootstrap, "orders")

    class DeniedAdmin:
        def list_topics(self, timeout: float) -> ClusterMetadata:
            denied = TopicMetadata()
            denied.topic, denied.error = "orders", KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
            denied.partitions = {0: PartitionMetadata()}
            metadata = ClusterMetadata()
            metadata.topics = {"orders": denied}
            return metadata

    backend._admin = DeniedAdmin()  # type: ignore[assignment]
    with pytest.raises(StreamError, match=r"topic 'orders': .*[Aa]uthorization") as caught:
        backend.shards()
    assert caught.value.__cause__ is not None and caught.value.__cause__.args[0].code() == 29


def _v3io_go_group(client: Any, path: str, group: str, shards: list[int]) -> dict[str, Any]:
    """A consumer group exactly as v3io-go creates it: its state item beside the shards, one live session."""
    state = json.dumps(
        {"schema_version": "0.0.1",
         "session_states": [{"member_id": f"fn-{group}", "last_heartbeat_time": "2026-11-24T03:04:05.1+02:00",
                             "shards": shards}]}
    )  # fmt: skip
    client.kv.update(
        CONTAINER, path, f"{group}-state.json", attributes={"state": state}, condition="not(exists(state))"
    )
    names = ["__mtime_secs", "__mtime_nsecs", "state"]
    found: dict[str, Any] = client.kv.get(CONTAINER, path, f"{group}-state.json", attribute_names=names).output.item
    return found


def _attribute(client: Any, path: str, shard: int, group: str) -> Any:
    name = committed_attribute(group)
    return client.kv.get(CONTAINER, path, str(shard), attribute_names=[name]).output.item.get(name)


def _v3io_resource(server: V3ioServerInfo, path: str, group: str, store_url: str | None = None) -> V3ioStreamGroup:
    return V3ioStreamGroup(
        group=group, endpoint=server.endpoint, container=CONTAINER, stream_path=path,
        access_key=server.access_key.get_secret_value(), store_url=store_url, heartbeat_interval_s=1,
        session_timeout_s=5, join_grace_s=0, min_backlog=1, max_wait_s=0,
    )  # fmt: skip


@pytest.mark.v3io
def test_a_v3io_go_group_is_refused_with_the_default_store(
    v3io_server: V3ioServerInfo,
    v3io_client: Any,
    new_stream: NewStream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The refusal used to run only with store_url="v3io" (where our state item and theirs are the same item):
    with the default SQLite store, a live v3io-go group of the same name had its committed attributes read as
    ours and pushed forward by our commits."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    backend = new_stream(2)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"a"] * 6)
    put(v3io_client, path, 1, [b"b"] * 4)
    group = unique_v3io_name("nuclio")
    item = _v3io_go_group(v3io_client, path, group, [0, 1])
    v3io_client.kv.update(CONTAINER, path, "0", attributes={committed_attribute(group): 3})  # theirs: 1..3 done
    resource = _v3io_resource(v3io_server, path, group)
    assert resource.resolved_store_url().startswith("sqlite:///"), "the default store, not the stream"
    with pytest.raises(StreamError, match="managed by v3io-go/Nuclio consumers") as caught:
        for _ in range(2):
            resource.member("m0").tick()
    assert f"{CONTAINER}/{path}/{group}-state.json" in str(caught.value)
    with pytest.raises(StreamError, match="managed by v3io-go/Nuclio consumers"):
        resource.backend().commit(group, {"0": 7, "1": 5})  # what a run's offset mirror would write
    assert _attribute(v3io_client, path, 0, group) == 3 and _attribute(v3io_client, path, 1, group) is None
    names = ["__mtime_secs", "__mtime_nsecs", "state"]
    after = v3io_client.kv.get(CONTAINER, path, f"{group}-state.json", attribute_names=names).output.item
    assert after == item, "their state item is never written"
    state, _ = resource.store().load(resource.state_key())
    assert state is None or all(s.inflight is None for s in state.shards.values()), "nothing was launched"


@pytest.mark.v3io
def test_a_v3io_go_group_appearing_under_a_running_group_stops_its_ticks_and_mirror(
    v3io_server: V3ioServerInfo, v3io_client: Any, new_stream: NewStream, sqlite_url: str
) -> None:
    """Our group already ran (its shards positioned) when a Nuclio function of the same group name starts:
    its next tick refuses, and once the function's group is removed the member goes on where it was."""
    backend = new_stream(1)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"a"] * 4)
    group = unique_v3io_name("shared")
    resource = _v3io_resource(v3io_server, path, group, sqlite_url)
    member = resource.member("m0")
    member.tick()
    commit_in_flight(member)
    assert _attribute(v3io_client, path, 0, group) == 4
    put(v3io_client, path, 0, [b"b"] * 3)
    _v3io_go_group(v3io_client, path, group, [0])
    with pytest.raises(StreamError, match="managed by v3io-go/Nuclio consumers"):
        resource.member("m0").tick()
    state = member.load()
    assert state is not None and state.shards["0"].inflight is None and state.shards["0"].committed == 5
    v3io_client.kv.delete(CONTAINER, path, f"{group}-state.json")  # the operator hands the group back
    report = resource.member("m0").tick()
    assert [(x.start, x.end) for x in report.new_launches] == [(5, 8)]
