"""Sample clickstream: JSON page views keyed by user, produced continuously (``python -m jobs.clickstream_events``).

Kafka: after every burst each partition gets one single-record batch (one record more per partition, which
the tests' counts expect). v3io: each user's events go to the shard its key hashes to (CRC-32), chosen here
rather than by the platform, so which records a shard holds depends only on the seed, whatever server routes
them.

``--stream v3io`` reads the access key from ``V3IO_ACCESS_KEY`` only: a key on the command line would show in
process listings.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import v3io.dataplane
from confluent_kafka import Producer

from dagster_streamgroup.local.kafka_data import BULK_PRODUCER, SINGLE_RECORD_BATCHES, create_topics, produce_or_wait
from dagster_streamgroup.streams.kafka_config import PropertyValue
from dagster_streamgroup.streams.v3io_config import ACCESS_KEY_ENV, normalise_endpoint

PAGES = ["/", "/search", "/product", "/cart", "/checkout", "/help", "/account", "/blog"]
REFERRERS = ["direct", "search", "social", "email"]
V3IO_PUT_BATCH = 1000
"""The most records one PutRecords request may carry."""
_NEVER = v3io.dataplane.RaiseForStatus.never


def event(rng: random.Random, now_ms: int) -> tuple[bytes, bytes]:
    user = f"u{rng.randrange(5000)}"
    body = {"user": user, "page": rng.choice(PAGES), "ts": now_ms, "referrer": rng.choice(REFERRERS)}
    return user.encode(), json.dumps(body, separators=(",", ":")).encode()


def produce_burst(
    bulk: Producer,
    trailer: Producer,
    topic: str,
    partitions: int,
    count: int,
    rng: random.Random,
    encode: Callable[[bytes], bytes] | None = None,
) -> None:
    """``count`` events partitioned by key (the user), then one single-record batch per partition; ``encode`` turns
    each JSON event into what is written (``avro_encoder``)."""
    now_ms = int(time.time() * 1000)
    for _ in range(count):
        key, value = event(rng, now_ms)
        produce_or_wait(bulk, topic, encode(value) if encode else value, key=key)
    _flush(bulk)
    for partition in range(partitions):
        key, value = event(rng, now_ms)
        trailer.produce(topic, encode(value) if encode else value, key, partition=partition)
    _flush(trailer)


def avro_encoder(registry_url: str, topic: str) -> Callable[[bytes], bytes]:
    """Events written as real producers write Avro: confluent-kafka's ``AvroSerializer`` registers the schema
    (subject ``<topic>-value``) and frames each record with its id."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from jobs.clickstream import EVENT_AVRO

    client = SchemaRegistryClient({"url": registry_url})
    serializer = AvroSerializer(schema_registry_client=client, schema_str=json.dumps(EVENT_AVRO))
    context = SerializationContext(topic, MessageField.VALUE)

    def encode(value: bytes) -> bytes:
        return bytes(serializer(json.loads(value), context))

    return encode


def _flush(producer: Producer, timeout_s: float = 60.0) -> None:
    left = producer.flush(timeout_s)
    if left:
        raise TimeoutError(f"{left} events undelivered after {timeout_s:.0f} s")


def producers(client: Mapping[str, PropertyValue]) -> tuple[Producer, Producer]:
    return Producer({**BULK_PRODUCER, **client}), Producer({**SINGLE_RECORD_BATCHES, **client})


class V3ioProduceError(RuntimeError):
    """The v3io server refused a request of the producer (the message carries its status and error)."""


def _v3io_failure(what: str, response: Any) -> V3ioProduceError:
    body = response.body.decode("utf-8", "replace") if isinstance(response.body, bytes) else str(response.body)
    return V3ioProduceError(f"{what}: status {response.status_code}: {body[:300]}")


def v3io_client(endpoint: str, access_key: str | None = None) -> Any:
    """A ``v3io`` client; the key defaults to ``$V3IO_ACCESS_KEY`` (errors name the variable, never the key)."""
    key = (access_key or os.environ.get(ACCESS_KEY_ENV, "")).strip()
    if not key:
        raise ValueError(f"no v3io access key: set ${ACCESS_KEY_ENV}")
    return v3io.dataplane.Client(endpoint=normalise_endpoint(endpoint), access_key=key)


def ensure_v3io_stream(client: Any, container: str, stream_path: str, shards: int, *, timeout_s: float = 30.0) -> int:
    """Create the stream with ``shards`` shards unless it exists; its shard count (an existing stream keeps its own).

    Connection errors are retried until ``timeout_s``, so a server still starting is waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            created = client.stream.create(container, stream_path, shard_count=shards, raise_for_status=_NEVER)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    if created.status_code not in (200, 204, 409):
        raise _v3io_failure(f"creating stream {container}/{stream_path}", created)
    described = client.stream.describe(container, stream_path, raise_for_status=_NEVER)
    if described.status_code != 200:
        raise _v3io_failure(f"describing stream {container}/{stream_path}", described)
    return int(described.output.shard_count)


def shard_of(key: bytes, shards: int) -> int:
    """The shard of a user's events: fixed by the key, so each user's clicks stay in order on one shard."""
    return zlib.crc32(key) % shards


def produce_v3io_burst(
    client: Any, container: str, stream_path: str, shards: int, count: int, rng: random.Random
) -> dict[str, int]:
    """``count`` events, each on the shard of its user; the records written per shard id (``"0"``, ...).

    A record the server refuses stops the burst with its error: retrying it alone would put it after later
    records of the same user."""
    now_ms = int(time.time() * 1000)
    written: Counter[str] = Counter()
    for first in range(0, count, V3IO_PUT_BATCH):
        records = []
        for _ in range(min(V3IO_PUT_BATCH, count - first)):
            key, value = event(rng, now_ms)
            records.append({"shard_id": shard_of(key, shards), "partition_key": key.decode(), "data": value})
        response = client.stream.put_records(container, stream_path, records, raise_for_status=_NEVER)
        what = f"putting records to {container}/{stream_path}"
        if response.status_code != 200:
            raise _v3io_failure(what, response)
        out = response.output
        if out.failed_record_count:
            error = next(r for r in out.records if r.error_code is not None)
            raise V3ioProduceError(f"{what}: {out.failed_record_count} refused, first: {error.error_message}")
        written.update(str(r.shard_id) for r in out.records)
    return dict(written)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stream", choices=["kafka", "v3io"], default="kafka")
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="kafka: bootstrap servers")
    parser.add_argument("--topic", default="clicks", help="kafka: the topic")
    parser.add_argument("--v3io-api", default="http://127.0.0.1:8081", help="v3io: the web API endpoint")
    parser.add_argument("--container", default="bigdata", help="v3io: the container")
    parser.add_argument("--stream-path", default="clicks", help="v3io: the stream's path in the container")
    parser.add_argument("--partitions", type=int, default=8, help="partitions (kafka) or shards (v3io) to create")
    parser.add_argument("--rate", type=int, default=500, help="events per second")
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (0: until Ctrl-C)")
    parser.add_argument("--format", choices=["json", "avro"], default="json", help="kafka: how events are written")
    parser.add_argument("--registry", default=None, help="--format avro: the Schema Registry's URL")
    args = parser.parse_args()
    if args.format == "avro" and (args.stream != "kafka" or not args.registry):
        parser.error("--format avro: Kafka only, with --registry URL")
    if args.rate < 1 or args.partitions < 1:
        parser.error("--rate and --partitions must be >= 1")
    burst: Callable[[random.Random], int]
    if args.stream == "kafka":
        client: dict[str, PropertyValue] = {"bootstrap.servers": args.bootstrap}
        create_topics(client, {args.topic: args.partitions}, exist_ok=True)
        bulk, trailer = producers(client)
        target = f"{args.topic} on {args.bootstrap}" + (f" as Avro ({args.registry})" if args.format == "avro" else "")
        encode = avro_encoder(args.registry, args.topic) if args.format == "avro" else None

        def burst(rng: random.Random) -> int:
            produce_burst(bulk, trailer, args.topic, args.partitions, args.rate, rng, encode)
            return int(args.rate + args.partitions)

    else:
        if not os.environ.get(ACCESS_KEY_ENV, "").strip():
            parser.error(f"--stream v3io reads the access key from ${ACCESS_KEY_ENV}, which is not set")
        try:
            v3io_api = v3io_client(args.v3io_api)
        except ValueError as exc:
            parser.error(f"--v3io-api: {exc}")
        shards = ensure_v3io_stream(v3io_api, args.container, args.stream_path, args.partitions)
        target = f"{args.container}/{args.stream_path} ({shards} shards) on {args.v3io_api}"

        def burst(rng: random.Random) -> int:
            return sum(produce_v3io_burst(v3io_api, args.container, args.stream_path, shards, args.rate, rng).values())

    rng = random.Random()
    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    total = 0
    print(f"producing ~{args.rate} clickstream events/s to {target}", flush=True)
    while not stop and (args.seconds <= 0 or time.monotonic() - started < args.seconds):
        tick = time.monotonic()
        total += burst(rng)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    print(f"produced {total} events", flush=True)


if __name__ == "__main__":
    main()
