"""The mirror into Kafka's group offsets survives Kafka's own housekeeping, and the state is keyed by the cluster.

Our mirrored group never has members, so Kafka expires each partition's offset ``offsets.retention.minutes``
after its last commit; the member sensors commit their shards' mirrored offsets again every
``mirror_keep_alive_s``, so an idle partition keeps its mirror and a group started again from the mirror (a
lost state store) resumes there. Measured on a broker of this test with a one-minute offset retention, next to
a group nobody keeps alive, whose offsets do expire. The state key names the cluster by its id, so another
spelling of the bootstrap list keys the same state, and a state kept under the old bootstrap-list key is
carried over once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from dagster_streamgroup import protocol
from dagster_streamgroup.dagster.resources import release_cached_clients
from dagster_streamgroup.local.kafka_broker import BrokerInfo, running_broker
from dagster_streamgroup.local.kafka_data import create_topics, produce_sample
from dagster_streamgroup.protocol import EventKind, report_of
from dagster_streamgroup.stores.base import state_key
from dagster_streamgroup.stores.sql import SqlStateStore
from tests.dagster.helpers import SensorDriver, counting_asset, group_name, group_resource, sensors_for
from tests.fixtures.kafka import TopicFactory, unique_name
from tests.reliability.conftest import kafka_backend, member_of

pytestmark = pytest.mark.kafka

RETENTION_S = 60


@pytest.fixture
def short_retention_broker() -> Iterator[BrokerInfo]:
    with running_broker(properties={"offsets.retention.minutes": "1"}) as broker:
        yield broker
        release_cached_clients()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_member_sensors_keep_idle_partitions_mirrored_offsets_past_kafkas_offset_retention(
    short_retention_broker: BrokerInfo, tmp_path: Path
) -> None:
    bootstrap = short_retention_broker.bootstrap
    topic = unique_name("idle")
    create_topics(bootstrap, {topic: 2})
    ends = produce_sample(bootstrap, topic, 2, 200)
    group, unattended = group_name(), group_name()
    resource = group_resource(bootstrap, topic, group, tmp_path, mirror_keep_alive_s=15.0)
    [sensor] = sensors_for(counting_asset(group, []), members=1)
    backend = resource.backend()
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensor, instance, resource)
        driver.tick()
        member = resource.member("committer")
        state = member.load()
        assert state is not None
        launches = protocol.inflight_launches(state, next(iter(state.members)))
        assert {x.shard for x in launches} == {f"{topic}:0", f"{topic}:1"}
        for launch in launches:  # what the run does: commit, then mirror
            member.commit(report_of(launch))
        mirrored = {x.shard: x.end for x in launches}
        backend.commit(group, mirrored)
        backend.commit(unattended, mirrored)  # the same offsets, in a group nobody keeps alive
        assert mirrored == {f"{topic}:{p}": end for p, end in ends.items()}
        committed_at = time.monotonic()
        while time.monotonic() - committed_at < RETENTION_S + 25:  # idle partitions: nothing new to commit
            driver.tick()
            time.sleep(3)
    assert backend.committed(unattended, list(mirrored)) == dict.fromkeys(mirrored), "Kafka expired nothing"
    assert backend.committed(group, list(mirrored)) == mirrored, "the kept-alive mirror expired"
    # The state is lost: a group started again from the mirror resumes at the mirrored offsets.
    fresh = member_of(SqlStateStore(f"sqlite:///{tmp_path / 'lost.db'}"), kafka_backend(bootstrap, topic), group)
    assert fresh.tick().new_launches == []
    state = fresh.load()
    assert state is not None and {s: x.committed for s, x in state.shards.items()} == mirrored


def test_the_state_is_keyed_by_the_cluster_not_by_the_bootstrap_spelling(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topics(1)
    port = kafka_bootstrap.rsplit(":", 1)[1]
    by_ip = kafka_backend(kafka_bootstrap, topic)
    by_name = kafka_backend(f"localhost:{port}", topic)
    assert by_ip.stream_id == by_name.stream_id
    assert by_ip.stream_id.startswith("kafka://cluster=") and "127.0.0.1" not in by_ip.stream_id


@pytest.mark.parametrize("which", [0, 1], ids=["cluster and topic list", "bootstrap and topic list"])
def test_a_state_kept_under_an_earlier_key_is_carried_over_once_and_closed(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, which: int
) -> None:
    """Earlier versions keyed the state by the cluster id and the topic list, and before that by the bootstrap list
    and the topic list. A state under either is carried over once, with an event, and the old object is closed
    (written at this schema, naming the new key): a member of the earlier version, which cannot read it any more,
    stops instead of planning the same shards in a second state."""
    topic = kafka_topics(1)
    produce_sample(kafka_bootstrap, topic, 1, 100)
    store = SqlStateStore(f"sqlite:///{tmp_path / 'state.db'}")
    backend = kafka_backend(kafka_bootstrap, topic)
    old_stream = backend.legacy_stream_ids[which]
    assert backend.stream_id.startswith("kafka://cluster=") and topic not in backend.stream_id
    group = unique_name("g")
    old = protocol.new_group(old_stream, group, store.now())
    old = protocol.membership_step(old, "m0", store.now(), member_of(store, backend, group).policy, backend.shards())
    old = old.model_copy(
        update={"shards": {sid: dataclasses.replace(s, committed=30) for sid, s in old.shards.items()}}
    )
    assert store.save_if(state_key(old_stream, group), old, None)
    member = member_of(store, backend, group)
    [launch] = member.tick().new_launches
    assert launch.start == 30, "the carried-over state's offsets hold"
    state = member.load()
    assert state is not None and state.stream == backend.stream_id and state.moved_to is None
    assert [e.kind for e in state.events].count(EventKind.CARRIED_OVER) == 1
    member.commit(report_of(launch))
    member.tick()
    after = member.load()
    assert after is not None and [e.kind for e in after.events].count(EventKind.CARRIED_OVER) == 1
    closed, _ = store.load(state_key(old_stream, group))
    assert closed is not None and closed.moved_to == member.key
    assert closed.model_copy(update={"moved_to": None, "revision": old.revision}) == old, "closed, otherwise as it was"
