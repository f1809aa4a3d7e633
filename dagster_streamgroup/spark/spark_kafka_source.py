"""Exact Kafka offset ranges read through Spark's own Kafka source (``spark-sql-kafka-0-10``, a JVM reader).

A batch read of ``format("kafka")`` with ``startingOffsets`` / ``endingOffsets`` per partition returns exactly the
records of those ranges, with the same schema as our ``streamgroup-kafka`` source (headers included), without a
Python worker per task. It needs the connector on the session's classpath (``spark/connector.py``), and it
speaks the Java client's configuration, not librdkafka's, so a stream's settings are translated here; a setting
with no faithful translation is refused by name (``SparkKafkaUnsupportedError``) and the caller reads through
our Python source instead.

How it matches the Python source's semantics:

- ``kafka.isolation.level=read_committed``: the records of committed transactions only, as ours reads (Spark's
  consumer defaults to ``read_uncommitted``).
- Offsets inside a range that hold no record (compacted away, transaction markers, aborted records) are skipped,
  as ours skips them: Spark's consumer steps over offsets it cannot see while the log still starts at or before
  them (measured: compacted and transactional ranges read exactly under ``failOnDataLoss=true``).
- A range the log no longer holds whole is refused, as ours refuses it: the read checks every range against the
  partition first (its start not below the log start: ``OffsetOutOfRangeError``; its end not past the log end:
  ``RangeIncompleteError``, a topic recreated or truncated under the range), and runs with
  ``failOnDataLoss=true``, so that records deleted between that check and the read fail the task instead of
  giving a short DataFrame (Spark's option of that name was ``false`` here once: ``[0, 150)`` over a partition of
  100 records gave 100 rows and a WARN).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dagster_streamgroup.spark.ranges import ShardRange, as_shard_ranges
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig, PropertyValue

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FORMAT = "kafka"

_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}

SAME_NAME_PROPERTIES = frozenset(
    {
        "client.id",
        "client.rack",
        "fetch.min.bytes",
        "fetch.max.bytes",
        "max.partition.fetch.bytes",
        "receive.buffer.bytes",
        "send.buffer.bytes",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "retry.backoff.ms",
        "socket.connection.setup.timeout.ms",
        "socket.connection.setup.timeout.max.ms",
        "connections.max.idle.ms",
        "metadata.max.age.ms",
        "isolation.level",
        "check.crcs",
    }
)
"""librdkafka properties whose name and meaning the Java consumer shares, passed through as they are."""

RENAMED_PROPERTIES = {"fetch.wait.max.ms": "fetch.max.wait.ms", "ssl.endpoint.identification.algorithm": None}
"""librdkafka properties the Java consumer knows under another name (``None``: handled on its own)."""

IGNORED_PROPERTIES = frozenset({"enable.partition.eof", "group.id", "enable.auto.commit", "auto.offset.reset"})
"""Properties of our own consumers that mean nothing to a batch read (Spark assigns exact offsets itself)."""


class SparkKafkaUnsupportedError(ValueError):
    """A stream setting with no faithful translation into the Java client's configuration."""


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_client_options(config: KafkaStreamConfig) -> dict[str, str]:
    """The ``kafka.``-prefixed Java client properties that reach the same cluster the same way as ``config``'s
    librdkafka configuration. SASL credentials become ``kafka.sasl.jaas.config`` (a secret property, redacted in
    what Spark shows); a PEM CA file becomes a PEM trust store. Raises ``SparkKafkaUnsupportedError`` naming the
    first setting that has no translation (client certificates, OAUTHBEARER, other librdkafka-only
    properties)."""
    client = config.client_config()
    out: dict[str, str] = {"kafka.bootstrap.servers": str(client.pop("bootstrap.servers"))}
    protocol = str(client.pop("security.protocol", "PLAINTEXT")).upper()
    out["kafka.security.protocol"] = protocol
    mechanism = client.pop("sasl.mechanism", None)
    username, password = client.pop("sasl.username", None), client.pop("sasl.password", None)
    if protocol.startswith("SASL"):
        mechanism = str(mechanism or "PLAIN").upper()
        if mechanism not in _JAAS_MODULES:
            raise SparkKafkaUnsupportedError(f"sasl_mechanism {mechanism} has no Spark Kafka source translation here")
        if username is None or password is None:
            raise SparkKafkaUnsupportedError("sasl_username and a password are needed for the Java client's SASL")
        out["kafka.sasl.mechanism"] = mechanism
        out["kafka.sasl.jaas.config"] = (
            f"{_JAAS_MODULES[mechanism]} required username={_quoted(str(username))} password={_quoted(str(password))};"
        )
    ca = client.pop("ssl.ca.location", None)
    if ca is not None:
        out["kafka.ssl.truststore.type"] = "PEM"
        out["kafka.ssl.truststore.location"] = str(ca)
    algorithm = client.pop("ssl.endpoint.identification.algorithm", None)
    if algorithm is not None:
        out["kafka.ssl.endpoint.identification.algorithm"] = "" if str(algorithm).lower() == "none" else str(algorithm)
    for key in sorted(client):
        value: PropertyValue = client[key]
        if key in IGNORED_PROPERTIES:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if key in SAME_NAME_PROPERTIES:
            out["kafka." + key] = text
        elif RENAMED_PROPERTIES.get(key):
            out["kafka." + str(RENAMED_PROPERTIES[key])] = text
        else:
            raise SparkKafkaUnsupportedError(
                f"property {key!r} has no Spark Kafka source translation here (the Java client names its settings "
                "differently); read through the streamgroup-kafka source"
            )
    out["kafka.isolation.level"] = out.get("kafka.isolation.level", "read_committed").strip().lower()
    return out


def offsets_json(ranges: Sequence[ShardRange], bound: str) -> str:
    """``{"topic": {"partition": offset}}`` of each range's ``start`` or ``end``, as Spark's offsets options take."""
    from dagster_streamgroup.streams.kafka import parse_shard

    by_topic: dict[str, dict[str, int]] = {}
    for r in ranges:
        topic, partition = parse_shard(r.shard)
        by_topic.setdefault(topic, {})[str(partition)] = r.start if bound == "start" else r.end
    return json.dumps(by_topic, sort_keys=True)


def read_options(
    config: KafkaStreamConfig, ranges: Sequence[ShardRange], *, max_records_per_partition: int | None = None
) -> dict[str, str]:
    """The options of one batch read of exactly ``ranges`` (each partition at most once)."""
    from dagster_streamgroup.streams.kafka import parse_shard

    assign: dict[str, list[int]] = {}
    for r in ranges:
        topic, partition = parse_shard(r.shard)
        if partition in assign.get(topic, []):
            raise ValueError(f"range {r.shard}: one read cannot hold two ranges of the same partition")
        assign.setdefault(topic, []).append(partition)
    options = {
        **java_client_options(config),
        "assign": json.dumps({t: sorted(p) for t, p in sorted(assign.items())}),
        "startingOffsets": offsets_json(ranges, "start"),
        "endingOffsets": offsets_json(ranges, "end"),
        "includeHeaders": "true",
        "failOnDataLoss": "true",
    }
    if max_records_per_partition is not None:
        options["maxRecordsPerPartition"] = str(max_records_per_partition)
    return options


def check_log_holds(config: KafkaStreamConfig, ranges: Sequence[ShardRange]) -> None:
    """Raise for a range the partition does not hold whole now (one metadata round trip in the driver):
    ``OffsetOutOfRangeError`` for a start that retention already deleted, ``RangeIncompleteError`` for an end past
    the partition's end (the Python reader's rules: it fails both, the first at once, the second once it stalls).
    Spark's own check (``failOnDataLoss``) reports both too, as a task failure with a message about data loss;
    this one names the shard and the offsets before any task runs."""
    from confluent_kafka import Consumer, TopicPartition

    from dagster_streamgroup.streams.base import OffsetOutOfRangeError, RangeIncompleteError
    from dagster_streamgroup.streams.kafka import new_client, parse_shard, reader_config

    wanted = [r for r in ranges if r.end > r.start]
    if not wanted:
        return
    consumer = new_client(Consumer, reader_config(config.client_config()))
    try:
        for r in wanted:
            topic, partition = parse_shard(r.shard)
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
            if r.start < low:
                raise OffsetOutOfRangeError(r.shard, r.start, low)
            if r.end > high:
                raise RangeIncompleteError(
                    f"{r.shard} [{r.start}, {r.end}): the partition ends at {high}, below the range's end: the topic "
                    "was recreated or truncated since the range was planned; nothing was read or committed"
                )
    finally:
        consumer.close()


def read_ranges_with_spark_kafka(
    spark: SparkSession,
    config: KafkaStreamConfig,
    ranges: Mapping[str, tuple[int, int]] | Sequence[ShardRange],
    *,
    max_records_per_partition: int | None = None,
) -> DataFrame:
    """A DataFrame of exactly the records of ``ranges`` read by Spark's Kafka source (lazy; the check that the log
    holds each range runs now). Raises ``SparkKafkaUnsupportedError`` for a configuration it cannot carry."""
    shard_ranges = as_shard_ranges(ranges)
    options = read_options(config, shard_ranges, max_records_per_partition=max_records_per_partition)
    check_log_holds(config, shard_ranges)
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    df = spark.read.format(FORMAT).options(**options).load()
    # Spark's source types the timestamp column as TIMESTAMP like ours, and names the rest identically.
    return df.select("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", F.col("headers"))
