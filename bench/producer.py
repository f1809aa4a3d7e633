"""The example's clickstream at a fixed rate, from a process of its own (``bench.sustained`` starts one per rate).

``python -m bench.producer --bootstrap HOST:PORT --topic T --partitions 32 --rate 50000 --seconds 240``

A process of its own so that producing 50,000 events/s does not share an interpreter (and its GIL) with the
benchmark's samplers. The events are the example's (``jobs.clickstream_events.event``: JSON page views keyed by
user, so partitioned by user): a pool is generated once and each event is sent with the current event time
spliced into its JSON, so the CPU goes to producing, not to ``json.dumps``. Every ``--tick-s`` it sends what
the rate owes since the start; a producer that cannot keep up falls behind, and its achieved rate shows it.
It ends with one single-record batch per partition.

The first line of its output says it starts producing (``{"started": true}``, after its imports and the
pool), the last line is one JSON object: ``produced``, ``seconds``, ``events_per_s``, ``cpu_s`` (from the
start of producing), ``late_ticks`` (ticks that took longer than ``--tick-s``).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time

from confluent_kafka import Producer

from dagster_streamgroup.local.kafka_data import BULK_PRODUCER, SINGLE_RECORD_BATCHES, produce_or_wait
from jobs.clickstream_events import event

POOL = 65_536
TS_FIELD = b'"ts":0,'


def cpu_seconds() -> float:
    """This process's CPU so far, librdkafka's threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def event_pool(size: int, seed: int) -> list[tuple[bytes, bytes, bytes]]:
    """``(key, head, tail)``: an event's JSON is ``head + <ms since epoch> + tail``."""
    rng = random.Random(seed)
    pool = []
    for _ in range(size):
        key, value = event(rng, 0)
        head, found, tail = value.partition(TS_FIELD)
        if not found:
            raise RuntimeError(f"event {value!r} has no {TS_FIELD!r} to put the event time into")
        pool.append((key, head + b'"ts":', b"," + tail))
    return pool


def produce_at_rate(
    producer: Producer, topic: str, rate: float, seconds: float, tick_s: float, pool: list[tuple[bytes, bytes, bytes]]
) -> tuple[int, float, int]:
    """Send ``rate`` events/s for ``seconds``; returns (events sent, seconds taken, late ticks)."""
    started = time.monotonic()
    produced = late = index = 0
    total = round(rate * seconds)
    while True:
        tick = time.monotonic()
        owed = min(total, int(rate * (tick - started))) - produced
        now_ms = str(int(time.time() * 1000)).encode()
        for _ in range(owed):
            key, head, tail = pool[index]
            index = (index + 1) % len(pool)
            produce_or_wait(producer, topic, head + now_ms + tail, key=key)
        produced += max(0, owed)
        producer.poll(0)
        if produced >= total:
            return produced, time.monotonic() - started, late
        spent = time.monotonic() - tick
        if spent > tick_s:
            late += 1
        time.sleep(max(0.0, tick_s - spent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="bootstrap servers of the broker")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True, help="partitions of the topic (for the last batches)")
    parser.add_argument("--rate", type=float, required=True, help="events per second")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--tick-s", type=float, default=0.05, help="how often the owed events are sent")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.seconds <= 0 or args.partitions < 1:
        parser.error("--rate and --seconds must be > 0 and --partitions >= 1")
    if not 0.001 <= args.tick_s <= 1:
        parser.error("--tick-s must be within 0.001..1")
    client = {"bootstrap.servers": args.bootstrap}
    pool = event_pool(POOL, args.seed)
    bulk, trailer = Producer({**BULK_PRODUCER, **client}), Producer({**SINGLE_RECORD_BATCHES, **client})
    print(json.dumps({"started": True}), flush=True)  # imports and the pool are done: the rate starts now
    cpu_before = cpu_seconds()
    produced, seconds, late = produce_at_rate(bulk, args.topic, args.rate, args.seconds, args.tick_s, pool)
    left = bulk.flush(60)
    for partition in range(args.partitions):
        key, head, tail = pool[partition]
        trailer.produce(args.topic, head + str(int(time.time() * 1000)).encode() + tail, key, partition=partition)
    left += trailer.flush(60)
    if left:
        raise SystemExit(f"{left} events undelivered after 60 s")
    result = {
        "produced": produced + args.partitions,
        "seconds": round(seconds, 3),
        "events_per_s": round(produced / seconds, 1),
        "cpu_s": round(cpu_seconds() - cpu_before, 2),
        "late_ticks": late,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
