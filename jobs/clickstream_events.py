"""Sample clickstream: JSON page views keyed by user, produced continuously (``python -m jobs.clickstream_events``).

After every burst each partition gets one single-record batch, so the local broker's high watermark (which
ignores the records of a partition's last batch) counts every record produced; on Kafka it changes nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import time
from collections.abc import Mapping

from confluent_kafka import Producer

from dagster_streamgroup.local.kafka_data import BULK_PRODUCER, SINGLE_RECORD_BATCHES, create_topics
from dagster_streamgroup.streams.kafka_config import PropertyValue

PAGES = ["/", "/search", "/product", "/cart", "/checkout", "/help", "/account", "/blog"]
REFERRERS = ["direct", "search", "social", "email"]


def event(rng: random.Random, now_ms: int) -> tuple[bytes, bytes]:
    user = f"u{rng.randrange(5000)}"
    body = {"user": user, "page": rng.choice(PAGES), "ts": now_ms, "referrer": rng.choice(REFERRERS)}
    return user.encode(), json.dumps(body, separators=(",", ":")).encode()


def produce_burst(
    bulk: Producer, trailer: Producer, topic: str, partitions: int, count: int, rng: random.Random
) -> None:
    """``count`` events partitioned by key (the user), then one single-record batch per partition."""
    now_ms = int(time.time() * 1000)
    for _ in range(count):
        key, value = event(rng, now_ms)
        while True:
            try:
                bulk.produce(topic, value, key)
                break
            except BufferError:
                bulk.poll(0.05)
    _flush(bulk)
    for partition in range(partitions):
        key, value = event(rng, now_ms)
        trailer.produce(topic, value, key, partition=partition)
    _flush(trailer)


def _flush(producer: Producer, timeout_s: float = 60.0) -> None:
    left = producer.flush(timeout_s)
    if left:
        raise TimeoutError(f"{left} events undelivered after {timeout_s:.0f} s")


def producers(client: Mapping[str, PropertyValue]) -> tuple[Producer, Producer]:
    return Producer({**BULK_PRODUCER, **client}), Producer({**SINGLE_RECORD_BATCHES, **client})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="clicks")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rate", type=int, default=500, help="events per second")
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (0: until Ctrl-C)")
    args = parser.parse_args()
    if args.rate < 1 or args.partitions < 1:
        parser.error("--rate and --partitions must be >= 1")
    client: dict[str, PropertyValue] = {"bootstrap.servers": args.bootstrap}
    create_topics(client, {args.topic: args.partitions}, exist_ok=True)
    bulk, trailer = producers(client)
    rng = random.Random()
    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    total = 0
    print(f"producing ~{args.rate} clickstream events/s to {args.topic} on {args.bootstrap}", flush=True)
    while not stop and (args.seconds <= 0 or time.monotonic() - started < args.seconds):
        tick = time.monotonic()
        produce_burst(bulk, trailer, args.topic, args.partitions, args.rate, rng)
        total += args.rate + args.partitions
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    print(f"produced {total} events", flush=True)


if __name__ == "__main__":
    main()
