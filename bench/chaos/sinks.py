"""The chaos run's sinks: the main group's runs commit what they read into a Delta table and a Kafka topic, and
the check counts every record of the stream in each.

Each run writes its records' coordinates and payloads through ``dagster_streamgroup.sinks`` (``DeltaSink`` and
``KafkaTopicSink``), after its function saw them and before its state commit, so every fault that kills, pauses,
fences or retries a run lands between or around those commits: a run killed at its hold (``run_kill_before_commit``)
is killed after its sink commits, before its state commit. At the end, every record of ``[0, high)`` of each
partition must have exactly one row in the table and exactly one record in the topic (read ``read_committed``),
and neither may hold a record of no partition's range: ``lost``, ``doubled`` and ``extra`` are counted for each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dagster_streamgroup.sinks import SOURCE_HEADER, DeltaSink, KafkaTopicSink

DELTA_DIR = "sink-delta"


def delta_sink(work_dir: Path) -> DeltaSink:
    return DeltaSink(table=str(work_dir / DELTA_DIR))


def kafka_sink(bootstrap: str, topic: str, group: str) -> KafkaTopicSink:
    return KafkaTopicSink(topic=topic, bootstrap_servers=bootstrap, marker_group=f"{group}.sink", key_column=None)


def counts(
    found: Counter[tuple[str, int]], highs: Mapping[str, int], excluded: Iterable[tuple[str, int, int]]
) -> dict[str, int]:
    """Records of ``[0, high)`` of each shard with no entry (``lost``) or several (``doubled``), and entries of no
    such record (``extra``). The ``excluded`` ranges (dead letters: given up, so a failed attempt may have left
    rows) are left out of both sides."""
    skip = list(excluded)

    def given_up(shard: str, offset: int) -> bool:
        return any(s == shard and a <= offset < b for s, a, b in skip)

    expected = {(s, o) for s, high in highs.items() for o in range(high) if not given_up(s, o)}
    kept = {key: n for key, n in found.items() if not given_up(*key)}
    return {
        "records": len(expected),
        "entries": sum(kept.values()),
        "lost": len(expected - set(kept)),
        "doubled": sum(1 for key, n in kept.items() if n > 1 and key in expected),
        "extra": len(set(kept) - expected),
    }


def delta_entries(work_dir: Path) -> Counter[tuple[str, int]]:
    from deltalake import DeltaTable

    path = str(work_dir / DELTA_DIR)
    if not DeltaTable.is_deltatable(path):
        return Counter()
    table = DeltaTable(path).to_pyarrow_table(columns=["topic", "partition", "offset"]).to_pydict()
    return Counter(
        (f"{t}:{p}", int(o)) for t, p, o in zip(table["topic"], table["partition"], table["offset"], strict=True)
    )


def kafka_entries(bootstrap: str, topic: str, partitions: int, timeout_s: float = 120.0) -> Counter[tuple[str, int]]:
    """Every committed record of the output topic, by the source record its header names."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-check",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    found: Counter[tuple[str, int]] = Counter()
    ended: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(ended) < partitions and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() == -191:  # _PARTITION_EOF
                        ended.add(int(message.partition() or 0))
                    continue
                header = dict(message.headers() or []).get(SOURCE_HEADER)
                source = header.decode() if isinstance(header, bytes) else str(header)
                shard, _, offset = source.rpartition(":")
                found[(shard, int(offset))] += 1
    finally:
        consumer.close()
    if len(ended) < partitions:
        raise TimeoutError(f"the output topic {topic} was not read to its end in {timeout_s:.0f} s")
    return found


def sink_verdict(
    work_dir: Path,
    bootstrap: str,
    topic: str,
    partitions: int,
    highs: Mapping[str, int],
    letters: Iterable[tuple[str, int, int]],
) -> dict[str, Any]:
    """Both sinks' counts against the stream's records (the main group's ``highs``)."""
    excluded = list(letters)
    return {
        "delta": counts(delta_entries(work_dir), highs, excluded),
        "kafka": counts(kafka_entries(bootstrap, topic, partitions), highs, excluded),
    }
