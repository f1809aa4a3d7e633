"""Leader failover on a three-broker Apache Kafka cluster (KRaft, static quorum, loopback): mid-drain, the
broker that leads most of the topic's partitions is SIGKILLed, and started again some seconds later. The group
goes on through the new leaders; nothing is lost and nothing is committed twice. Opt-in like the long end-to-end
test (``STREAMGROUP_E2E=1 bash scripts/test.sh -m e2e -k failover``); docs/kafka.md has its last result."""

from __future__ import annotations

import time
from collections import Counter

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from dagster_streamgroup.local.kafka_broker import local_cluster
from dagster_streamgroup.protocol import FailOutcome, report_of
from dagster_streamgroup.stores.memory import MemoryStore
from dagster_streamgroup.streams.base import StreamError
from tests.reliability.conftest import kafka_backend, member_of

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 6
RECORDS = 120_000


def _produce(bootstrap: str, topic: str) -> dict[int, int]:
    ends: dict[int, int] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        partition, offset = msg.partition(), msg.offset()  # type: ignore[attr-defined]
        ends[partition] = max(ends.get(partition, 0), offset + 1)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 10})
    for i in range(RECORDS):
        while True:
            try:
                producer.produce(topic, f"r{i:08d}".encode(), partition=i % PARTITIONS, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0
    return ends


@pytest.mark.timeout(900)
def test_the_group_drains_through_a_leader_failover_losing_and_doubling_nothing() -> None:
    with local_cluster(3) as nodes:
        bootstrap = ",".join(n.bootstrap for n in nodes)
        topic = "failover"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        created = admin.create_topics([NewTopic(topic, PARTITIONS, 3, config={"min.insync.replicas": "2"})])
        created[topic].result(60)
        ends = _produce(bootstrap, topic)
        assert sum(ends.values()) == RECORDS

        backend = kafka_backend(bootstrap, topic)
        store = MemoryStore(time.time)
        members = [member_of(store, backend, "failover", f"m{i}", max_records_per_run=4_000) for i in range(2)]
        read: Counter[tuple[int, int]] = Counter()
        failures = 0
        killed = None
        killed_at = 0.0
        restarted = False
        deadline = time.monotonic() + 600
        while True:
            state = store.load(members[0].key)[0]
            if (
                state is not None
                and all(s.committed == ends[int(sid.rsplit(":", 1)[1])] for sid, s in state.shards.items())
                and len(state.shards) == PARTITIONS
            ):
                break
            assert time.monotonic() < deadline, "the group did not drain within 10 minutes"
            committed = sum(s.committed or 0 for s in state.shards.values()) if state else 0
            if killed is None and committed > RECORDS // 3:
                leaders = Counter(
                    p.leader for p in admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
                )
                killed = next(n for n in nodes if n.node_id == leaders.most_common(1)[0][0])
                killed.kill()
                killed_at = time.monotonic()
            if killed is not None and not restarted and time.monotonic() - killed_at > 8:
                killed.start(180)
                restarted = True
            for member in members:
                try:
                    launches = member.tick().new_launches
                except StreamError:
                    failures += 1
                    continue
                for launch in launches:
                    try:
                        batches = list(backend.read_range(launch.shard, launch.start, launch.end))
                    except StreamError as exc:
                        failures += 1
                        assert member.fail(report_of(launch), str(exc)) == FailOutcome.RETRY
                        continue
                    offsets = pa.Table.from_batches(batches, backend.arrow_schema).column("offset").to_pylist()
                    assert offsets == list(range(launch.start, launch.end)), "a range read with gaps or extras"
                    outcome = member.commit(report_of(launch))
                    if outcome.accepted:
                        partition = int(launch.shard.rsplit(":", 1)[1])
                        read.update((partition, o) for o in offsets)
        assert killed is not None and restarted, "the failover never happened"
        expected = {(p, o) for p, end in ends.items() for o in range(end)}
        assert set(read) == expected, "records lost"
        assert [k for k, n in read.items() if n > 1] == [], "records committed twice"
        print(f"failover: broker {killed.node_id} killed and restarted; {failures} failed calls retried")
