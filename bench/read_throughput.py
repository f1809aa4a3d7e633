"""Read throughput of exact Kafka offset ranges: raw confluent-kafka against the Spark range source.

    python -m bench.read_throughput [--records 2000000] [--partitions 8] [--value-size 100] [--rounds 3] [--warmup 3]

Produces the records once (on the local broker, or on STREAMGROUP_KAFKA_BOOTSTRAP), then alternates in each
round (a) one raw confluent-kafka consumer draining exactly the ranges in this process, (b) the
``streamgroup-kafka`` Spark source counting them (local[2], a session warmed by ``--warmup`` reads: the
first reads of a session run while the JVM is still compiling its Arrow-to-row copy), (c) the same source writing them
as Parquet. Every variant must return exactly the produced records. The last line is one JSON object with
the medians over the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator

from confluent_kafka import Consumer, Message, TopicPartition

from dagster_streamgroup.local.kafka_broker import BrokerInfo, external_bootstrap, running_broker
from dagster_streamgroup.local.kafka_data import create_topics, delete_topics, produce_sample
from dagster_streamgroup.local.procfs import ProcfsUnavailableError, tree_cpu_seconds
from dagster_streamgroup.spark.kafka_source import read_kafka_ranges
from dagster_streamgroup.spark.session import local_spark_session
from dagster_streamgroup.streams.kafka import READER_DEFAULTS
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

RAW_BATCH = 10_000


def raw_drain(bootstrap: str, topic: str, ends: dict[int, int], timeout_s: float = 120.0) -> int:
    """The baseline: one consumer on all partitions with the best settings measured, requests sized to what
    is left (an unsized last request waits out its timeout), stopping each partition exactly at its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-raw",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "auto.offset.reset": "error",
            **READER_DEFAULTS,
        }
    )
    left = {p: end for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, 0) for p in left])
    count = 0
    remaining = sum(left.values())
    deadline = time.monotonic() + timeout_s
    try:
        while remaining > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"raw read incomplete: {remaining} records left")
            msgs = consumer.consume(min(RAW_BATCH, remaining), 1.0)
            if not msgs:
                continue
            if any(map(Message.error, msgs)):
                errors = [m.error() for m in msgs if m.error() is not None]
                raise RuntimeError(f"raw read failed: {errors[0]}")
            last = dict(zip(map(Message.partition, msgs), map(Message.offset, msgs), strict=True))
            n = len(msgs)
            for p, off in last.items():
                end = left[p]
                if off >= end - 1:
                    if off >= end:  # records past the end arrived: count only the range's records
                        n -= sum(1 for m in msgs if m.partition() == p and m.offset() >= end)
                    consumer.pause([TopicPartition(topic, p)])
            count += n
            remaining -= n
    finally:
        consumer.close()
    return count


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    started = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - started


@contextlib.contextmanager
def broker() -> Iterator[tuple[str, int | None]]:
    """The bootstrap address, and the broker's PID when it runs here (its CPU is then measured too)."""
    external = external_bootstrap()
    if external is not None:
        yield external, None
        return
    info: BrokerInfo
    with running_broker() as info:
        yield info.bootstrap, info.pid


class CpuMeter:
    """CPU seconds spent over an interval by this process, the Spark JVM, its Python workers and the broker:
    the profile behind the ratio (two cores hold all of them, so whatever one spends, the others lack)."""

    def __init__(self, jvm_pid: int, broker_pid: int | None) -> None:
        self.roots = {"jvm_and_workers": jvm_pid, **({"broker": broker_pid} if broker_pid is not None else {})}
        self.jvm_pid = jvm_pid

    def snapshot(self) -> dict[str, dict[int, float]]:
        try:
            return {name: tree_cpu_seconds(pid) for name, pid in self.roots.items()}
        except ProcfsUnavailableError:
            return {}

    def spent(self, before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]) -> dict[str, float]:
        """Per part: this process (the raw consumer's or the Spark driver's Python), the JVM, its Python workers."""
        parts = {"this_process": 0.0, "jvm": 0.0, "python_workers": 0.0, "broker": 0.0}
        for name, pids in after.items():
            for pid, cpu in pids.items():
                part = "broker" if name == "broker" else "jvm" if pid == self.jvm_pid else "python_workers"
                parts[part] += cpu - before.get(name, {}).get(pid, 0.0)
        return {name: round(value, 2) for name, value in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--warmup", type=int, default=3, help="Spark reads before the rounds (the JVM compiles its row copy)"
    )
    parser.add_argument("--min-partitions", type=int, default=None, help="minPartitions of the Spark source")
    parser.add_argument("--max-records-per-partition", type=int, default=None)
    args = parser.parse_args()

    with broker() as (bootstrap, broker_pid), tempfile.TemporaryDirectory(prefix="bench-read-") as tmp:
        topic = f"bench-read-{time.time_ns()}"
        create_topics(bootstrap, {topic: args.partitions})
        try:
            started = time.perf_counter()
            ends = produce_sample(bootstrap, topic, args.partitions, args.records, value_size=args.value_size)
            total = sum(ends.values())
            print(
                f"produced {total} records of {args.value_size} B over {args.partitions} partitions "
                f"in {time.perf_counter() - started:.1f} s (the last record of each partition is its own batch)"
            )

            started = time.perf_counter()
            spark = local_spark_session(app_name="bench-read-throughput", conf={"spark.driver.memory": "4g"})
            print(f"spark session local[2] in {time.perf_counter() - started:.1f} s")
            config = KafkaStreamConfig(bootstrap_servers=bootstrap, topics=[topic])
            ranges = {f"{topic}:{p}": (0, end) for p, end in ends.items()}

            def df():  # type: ignore[no-untyped-def]
                return read_kafka_ranges(
                    spark,
                    config,
                    ranges,
                    min_partitions=args.min_partitions,
                    max_records_per_partition=args.max_records_per_partition,
                )

            def spark_count() -> int:
                return int(df().count())

            def spark_parquet() -> int:
                df().write.mode("overwrite").parquet(f"{tmp}/out")
                return -1  # counted after the clock stops

            variants: dict[str, Callable[[], int]] = {
                "raw": lambda: raw_drain(bootstrap, topic, ends),
                "spark": spark_count,
                "spark_parquet": spark_parquet,
            }
            for _ in range(max(args.warmup, 1)):
                n, secs = timed(spark_count)
                print(f"warm-up spark read: {n} records in {secs:.2f} s ({n / secs:,.0f} rec/s)")
            meter = CpuMeter(int(spark.sparkContext._jvm.ProcessHandle.current().pid()), broker_pid)
            rates: dict[str, list[float]] = {name: [] for name in variants}
            cpu: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
            for round_no in range(1, args.rounds + 1):
                for name, fn in variants.items():
                    own_before, before = os.times(), meter.snapshot()
                    n, secs = timed(fn)
                    after, own_after = meter.snapshot(), os.times()
                    spent = meter.spent(before, after)
                    spent["this_process"] = round(
                        own_after.user + own_after.system - own_before.user - own_before.system, 2
                    )
                    if n == -1:
                        n = int(spark.read.parquet(f"{tmp}/out").count())
                    if n != total:
                        raise RuntimeError(f"{name} read {n} records, expected {total}")
                    rates[name].append(total / secs)
                    cpu[name].append(spent)
                    print(f"round {round_no} {name:>13}: {secs:6.2f} s  {total / secs:12,.0f} rec/s  cpu s {spent}")
            spark.stop()
        finally:
            delete_topics(bootstrap, [topic])

    medians = {name: statistics.median(values) for name, values in rates.items()}
    ratios = [s / r for s, r in zip(rates["spark"], rates["raw"], strict=True)]
    print(f"per-round ratios spark/raw: {', '.join(f'{x:.2f}' for x in ratios)}")
    print(
        json.dumps(
            {
                "records": total,
                "rounds": args.rounds,
                "raw_records_per_s": round(medians["raw"]),
                "spark_records_per_s": round(medians["spark"]),
                "spark_parquet_records_per_s": round(medians["spark_parquet"]),
                "ratio": round(medians["spark"] / medians["raw"], 3),
                "round_ratios": [round(x, 3) for x in ratios],
                "cpu_s_per_million_records": {
                    name: {
                        part: round(statistics.median(r[part] for r in runs) * 1e6 / total, 2)
                        for part in runs[0]
                        if any(r[part] for r in runs)
                    }
                    for name, runs in cpu.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
