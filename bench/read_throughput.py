"""Read throughput of exact Kafka offset ranges: raw confluent-kafka and Spark's own Kafka source against the
Spark range source, like with like.

    python -m bench.read_throughput [--records 2000000] [--partitions 8] [--value-size 100] [--parallelism 2]
        [--rounds 5] [--warmup 3] [--variants raw,arrow,spark,spark_kafka,parquet]

Produces the records once (on the local broker, or on STREAMGROUP_KAFKA_BOOTSTRAP), then times each variant
reading exactly them:

- ``raw_1``, ``raw_N``: confluent-kafka consumers that only count messages, in 1 and in N (``--parallelism``)
  processes, each process draining a disjoint set of partitions (``split_partitions``). The wall clock runs
  from the first process's start to the last one's end; each process's CPU comes from its own ``/proc``;
- ``arrow_1``, ``arrow_N``: the same with the project's range reader (``streams.kafka.read_ranges``), which
  builds the Arrow batches the Spark source hands to Spark: the raw side doing the same work per record;
- ``spark_local_1``, ``spark_local_N``: the ``streamgroup-kafka`` Spark source counting them in a session of
  ``local[1]`` (one task at a time) and ``local[N]`` (N tasks side by side), each session in a process of its
  own (one Spark context per process) whose whole tree (driver, JVM, Python workers) is measured from ``/proc``;
- ``spark_kafka_local_1``, ``spark_kafka_local_N``: Spark's own Kafka source (``spark-sql-kafka-0-10``)
  counting them as a batch read (``spark.read.format("kafka")``, ``assign`` of the topic, ``startingOffsets``
  and ``endingOffsets`` the exact per-partition offsets, ``kafka.isolation.level=read_committed`` as ours reads,
  ``includeHeaders=true`` as our schema has headers; ``spark_kafka_options``), in ``local[1]`` and ``local[N]``
  sessions built like ours but in processes of their own, so that neither source's compiled code or heap is
  shaped by the other's reads. Both sources plan one task per Kafka partition by default; ``--min-partitions``
  and ``--max-records-per-partition`` set the options of the same names (and meaning) on both;
- ``spark_parquet_local_N``: the source writing them as Parquet in the ``local[N]`` session.

The comparison is like with like: ``ratio`` = ``spark_local_N`` / ``raw_N`` (records per second, equal
parallelism), beside ``ratio_one_task`` (``spark_local_1`` / ``raw_1``), ``ratio_vs_arrow_readers``
(``spark_local_N`` / ``arrow_N``) and, for continuity only, ``ratio_unequal`` (``spark_local_N`` / ``raw_1``:
the comparison before, N Spark tasks against one consumer). Against Spark's own source: ``ratio_spark_kafka`` =
``spark_local_N`` / ``spark_kafka_local_N`` (equal parallelism; the goal is >= 0.9, printed as a target, never
asserted), ``ratio_spark_kafka_one_task`` (the ``local[1]`` pair), ``round_ratios_spark_kafka`` and
``cpu_ratio_spark_kafka`` (our sessions' CPU per record over theirs). Every variant is warmed before the rounds
(Spark sessions by ``--warmup`` reads of their source: the first reads of a session run while the JVM is still
compiling its row copy; raw readers by one read each), and each round rotates the order of the variants, so no
variant always goes first after producing or right after a Spark job. ``cpu_s_per_million_records`` gives
each variant's CPU beside its rate (the readers' processes, and the broker apart), and ``cpu_ratio`` the
Spark/raw ratio of CPU per record at equal parallelism. Every variant must return exactly the produced
records in every reading (their count); each Spark session's source is also checked once, after its warm-up and
off the clock, to return every produced offset of every partition exactly once (``offset_mismatches``). The
last line is one JSON object with the medians over the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from typing import TYPE_CHECKING, Any

from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.kafka_broker import BrokerInfo, external_bootstrap, running_broker
from dagster_streamgroup.local.kafka_data import create_topics, delete_topics, produce_sample
from dagster_streamgroup.spark.connector import spark_kafka_jars

if TYPE_CHECKING:  # pyspark is imported by the Spark session processes only
    from pyspark.sql import DataFrame, SparkSession

RAW_BATCH = 10_000
COMMAND_TIMEOUT_S = 900.0
"""A reader process that has not answered a command within this long is killed: the run stays bounded."""
FAMILIES = ("raw", "arrow", "spark", "spark_kafka", "parquet")
SPARK_KAFKA_TARGET = 0.9
"""The goal for ``ratio_spark_kafka``: our range read at least this fast as Spark's own Kafka source."""


def raw_drain(bootstrap: str, topic: str, ends: Mapping[int, int], timeout_s: float = 120.0) -> int:
    """The raw baseline: one consumer on the given partitions with the best settings measured, requests sized
    to what is left (an unsized last request waits out its timeout), stopping each partition exactly at its
    end; it counts messages and builds nothing."""
    from confluent_kafka import Consumer, Message, TopicPartition

    from dagster_streamgroup.streams.kafka import READER_DEFAULTS

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


def arrow_drain(bootstrap: str, topic: str, ends: Mapping[int, int]) -> int:
    """The project's range reader over the partitions: what a Spark task of the source runs, Arrow batches
    of the source's schema included, without Spark."""
    from dagster_streamgroup.streams.kafka import PartitionRange, read_ranges

    ranges = [PartitionRange(topic, p, 0, end) for p, end in sorted(ends.items()) if end > 0]
    return sum(batch.num_rows for batch in read_ranges({"bootstrap.servers": bootstrap}, ranges))


READERS: dict[str, Callable[[str, str, Mapping[int, int]], int]] = {"raw": raw_drain, "arrow": arrow_drain}


def split_partitions(ends: Mapping[int, int], n: int) -> list[dict[int, int]]:
    """``ends`` dealt over ``n`` disjoint sets, as even in records as whole partitions allow: the largest
    partition first to the set holding the fewest records (ties to the lower set). Sets left empty (fewer
    partitions than ``n``) are dropped, so every set is one reader's share of the work."""
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    sets: list[dict[int, int]] = [{} for _ in range(n)]
    loads = [0] * n
    for partition, end in sorted(ends.items(), key=lambda item: (-item[1], item[0])):
        i = min(range(n), key=lambda k: (loads[k], k))
        sets[i][partition] = end
        loads[i] += end
    return [s for s in sets if s]


def own_cpu_s() -> float:
    """This process's user + system CPU from ``/proc`` (librdkafka's threads included)."""
    return procfs.cpu_seconds(os.getpid())


def _reader_main(conn: multiprocessing.connection.Connection) -> None:
    """A raw reader process: imports once, then for each command ``(kind, bootstrap, topic, ends)`` reads and
    answers ``(records, started, ended, cpu_s)`` (``time.monotonic``, one clock for every process here)."""
    import confluent_kafka  # noqa: F401  # imported before the first command, not on its clock
    import pyarrow  # noqa: F401

    import dagster_streamgroup.streams.kafka  # noqa: F401

    conn.send("ready")
    while True:
        command = conn.recv()
        if command is None:
            return
        kind, bootstrap, topic, ends = command
        try:
            cpu_before, started = own_cpu_s(), time.monotonic()
            records = READERS[kind](bootstrap, topic, ends)
            ended, cpu = time.monotonic(), own_cpu_s() - cpu_before
            conn.send((records, started, ended, cpu))
        except Exception as exc:  # reported to the parent, which raises it (as text: any exception pickles)
            conn.send(RuntimeError(f"{type(exc).__name__}: {exc}"))


@dataclass(frozen=True)
class Reading:
    """One timed read of every record by one variant."""

    records: int
    seconds: float
    cpu_s: dict[str, float]
    """CPU seconds by part: ``readers`` (the processes that read: raw readers, or the Spark session's whole
    tree) and its parts, and the ``broker``."""


def _answer(conn: multiprocessing.connection.Connection, proc: SpawnProcess, what: str) -> Any:
    if not conn.poll(COMMAND_TIMEOUT_S):
        proc.kill()
        raise TimeoutError(f"{what}: no answer within {COMMAND_TIMEOUT_S:.0f} s")
    answer = conn.recv()
    if isinstance(answer, Exception):
        raise RuntimeError(f"{what} failed") from answer
    return answer


class RawReaders:
    """``n`` reader processes (spawned: nothing of this process's state is shared), started once and warm."""

    def __init__(self, n: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.workers: list[tuple[SpawnProcess, multiprocessing.connection.Connection]] = []
        for i in range(n):
            parent, child = context.Pipe()
            proc = context.Process(target=_reader_main, args=(child,), name=f"raw-reader-{i}", daemon=True)
            proc.start()
            child.close()
            self.workers.append((proc, parent))
        for proc, conn in self.workers:
            _answer(conn, proc, f"raw reader {proc.pid} start")

    def read(self, kind: str, bootstrap: str, topic: str, shares: Sequence[Mapping[int, int]]) -> Reading:
        """Each share read by a process of its own, all at once: records, first start to last end, and the
        CPU the processes spent reading (each process's own reading of ``/proc/self/stat``)."""
        if len(shares) > len(self.workers):
            raise ValueError(f"{len(shares)} shares for {len(self.workers)} reader processes")
        used = self.workers[: len(shares)]
        for (_, conn), ends in zip(used, shares, strict=True):
            conn.send((kind, bootstrap, topic, dict(ends)))
        answers = [_answer(conn, proc, f"{kind} reader {proc.pid}") for proc, conn in used]
        started = min(a[1] for a in answers)
        ended = max(a[2] for a in answers)
        return Reading(sum(a[0] for a in answers), ended - started, {"readers": sum(a[3] for a in answers)})

    def close(self) -> None:
        for proc, conn in self.workers:
            with contextlib.suppress(OSError):
                conn.send(None)
            proc.join(10)
            if proc.is_alive():
                proc.kill()


def spark_kafka_options(
    bootstrap: str,
    topic: str,
    ends: Mapping[int, int],
    *,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> dict[str, str]:
    """Options of Spark's own Kafka source for a batch read of exactly the produced records, offsets ``0`` to
    ``end`` (exclusive) of every partition: ``assign`` (not ``subscribe``) so that the partitions read are the
    ones named; ``read_committed`` because ours reads committed records only (Spark's default is
    ``read_uncommitted``); headers because our schema has them. ``failOnDataLoss`` stays at its default (true):
    a missing offset fails the read instead of shortening it."""
    partitions = sorted(ends)
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "assign": json.dumps({topic: partitions}),
        "startingOffsets": json.dumps({topic: {str(p): 0 for p in partitions}}),
        "endingOffsets": json.dumps({topic: {str(p): ends[p] for p in partitions}}),
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "true",
    }
    for name, value in (("minPartitions", min_partitions), ("maxRecordsPerPartition", max_records_per_partition)):
        if value is not None:
            options[name] = str(value)
    return options


OffsetSummary = tuple[int, int, int, int, int]
"""One partition of a read: ``(partition, records, distinct offsets, first offset, last offset)``."""


def offset_mismatches(found: Sequence[OffsetSummary], ends: Mapping[int, int]) -> list[str]:
    """How a read's per-partition summary differs from the produced records (offsets ``0`` to ``end - 1`` of each
    partition, each once): empty when it returned exactly them. A total count alone could hide one partition's
    missing records behind another's duplicates."""
    expected = {p: (end, end, 0, end - 1) for p, end in ends.items() if end > 0}
    got = {row[0]: tuple(row[1:]) for row in found}
    fields = "records, distinct offsets, first, last"
    return [
        f"partition {p}: expected ({fields}) {expected.get(p)}, got {got.get(p)}"
        for p in sorted({*expected, *got})
        if expected.get(p) != got.get(p)
    ]


def partition_offsets(df: DataFrame) -> list[OffsetSummary]:
    """``offset_mismatches``'s input from a DataFrame of the Kafka schema (one Spark job, off the clock)."""
    from pyspark.sql import functions as sf

    rows = (
        df.groupBy("partition")
        .agg(sf.count("*"), sf.count_distinct("offset"), sf.min("offset"), sf.max("offset"))
        .collect()
    )
    return [(int(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows]


SOURCE_COMMANDS = {"ours": ("count", "offsets"), "kafka": ("kafka_count", "kafka_offsets")}
"""A session's counting command and its exactness check, by the source it reads."""


def _spark_command(
    spark: SparkSession, command: str, frames: Mapping[str, Callable[[], DataFrame]], out: str
) -> int | list[OffsetSummary]:
    """One command of a session: ``count``/``kafka_count`` (records read by our source / Spark's),
    ``parquet`` (ours written, -1: counted by ``verify_parquet``, after the clock and the CPU reading),
    ``offsets``/``kafka_offsets`` (``partition_offsets`` of either source)."""
    for source, (count, offsets) in SOURCE_COMMANDS.items():
        if command == count:
            return int(frames[source]().count())
        if command == offsets:
            return partition_offsets(frames[source]())
    if command == "parquet":
        frames["ours"]().write.mode("overwrite").parquet(out)
        return -1
    if command == "verify_parquet":
        return int(spark.read.parquet(out).count())
    raise ValueError(f"unknown command {command!r}")


def _spark_main(conn: multiprocessing.connection.Connection, master: str, settings: dict[str, Any]) -> None:
    """A Spark session of its own (one context per process), built the same way whichever source it reads:
    for each command (``_spark_command``) answers ``(result, seconds)``."""
    from dagster_streamgroup.spark.kafka_source import read_kafka_ranges
    from dagster_streamgroup.spark.session import local_spark_session
    from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

    started = time.perf_counter()
    conf = {"spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false"}  # no progress bars in the log
    app_name = f"bench-read-throughput-{settings['source']}-{master}"
    spark = local_spark_session(master=master, app_name=app_name, conf=conf)
    config = KafkaStreamConfig(bootstrap_servers=settings["bootstrap"], topics=[settings["topic"]])
    ranges = {f"{settings['topic']}:{p}": (0, end) for p, end in settings["ends"].items()}
    splits = {
        "min_partitions": settings["min_partitions"],
        "max_records_per_partition": settings["max_records_per_partition"],
    }
    kafka_options = spark_kafka_options(settings["bootstrap"], settings["topic"], settings["ends"], **splits)
    frames: dict[str, Callable[[], DataFrame]] = {
        "ours": lambda: read_kafka_ranges(spark, config, ranges, **splits),
        "kafka": lambda: spark.read.format("kafka").options(**kafka_options).load(),
    }
    conn.send(("ready", time.perf_counter() - started))
    try:
        while True:
            command = conn.recv()
            if command is None:
                return
            try:
                started = time.perf_counter()
                result = _spark_command(spark, command, frames, settings["out"])
                conn.send((result, time.perf_counter() - started))
            except Exception as exc:  # reported to the parent, which raises it (as text: any exception pickles)
                conn.send(RuntimeError(f"{type(exc).__name__}: {exc}"))
    finally:
        spark.stop()


def tree_cpu_by_part(root: int, parts: Callable[[int], str]) -> dict[str, float]:
    """CPU so far (own + waited-for children, from ``/proc``) of ``root``'s tree by part: differences of
    two readings are exact for processes their parents reap within the tree (Spark's Python workers)."""
    out: dict[str, float] = {}
    for pid, cpu in procfs.tree_cpu_seconds(root).items():
        out[parts(pid)] = out.get(parts(pid), 0.0) + cpu
    return out


class SparkSessionProcess:
    """A ``local[k]`` session in a spawned process, measured as a whole: driver, JVM, Python workers.
    ``settings["source"]`` (``ours`` or ``kafka``) names the source its counting command reads."""

    def __init__(self, master: str, settings: dict[str, Any]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.label = f"{settings['source']} {master}"
        self.proc = context.Process(target=_spark_main, args=(child, master, settings), name=self.label, daemon=True)
        self.proc.start()
        child.close()
        self.master = master
        self.count_command, self.offsets_command = SOURCE_COMMANDS[settings["source"]]
        _, self.session_s = _answer(self.conn, self.proc, f"spark session {self.label}")

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def part_of(self, pid: int) -> str:
        if pid == self.pid:
            return "driver"
        argv = procfs.cmdline(pid)
        return "jvm" if argv and argv[0].endswith(b"java") else "python_workers"

    def cpu(self) -> dict[str, float]:
        return tree_cpu_by_part(self.pid, self.part_of)

    def ask(self, command: str) -> tuple[Any, float]:
        self.conn.send(command)
        result, seconds = _answer(self.conn, self.proc, f"{self.label} {command}")
        return result, float(seconds)

    def command(self, command: str) -> tuple[int, float]:
        records, seconds = self.ask(command)
        return int(records), seconds

    def offsets(self) -> list[OffsetSummary]:
        """Its source's ``partition_offsets`` of the whole read."""
        summary, _ = self.ask(self.offsets_command)
        return list(summary)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(60)
        if self.proc.is_alive():
            self.proc.kill()


@dataclass(frozen=True)
class Variant:
    name: str
    read: Callable[[], Reading]


def spent(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {part: after.get(part, 0.0) - before.get(part, 0.0) for part in sorted({*before, *after})}


def spark_reading(session: SparkSessionProcess, command: str, broker_cpu: Callable[[], float]) -> Reading:
    """One timed command of a session: the seconds the session timed, the CPU of its tree and the broker."""
    before, broker_before = session.cpu(), broker_cpu()
    records, seconds = session.command(command)
    after, broker_after = session.cpu(), broker_cpu()
    cpu = spent(before, after)
    if command == "parquet":
        records, _ = session.command("verify_parquet")
    return Reading(records, seconds, {"readers": sum(cpu.values()), **cpu, "broker": broker_after - broker_before})


def raw_reading(
    readers: RawReaders,
    kind: str,
    shares: Sequence[Mapping[int, int]],
    target: tuple[str, str],
    broker_cpu: Callable[[], float],
) -> Reading:
    broker_before = broker_cpu()
    reading = readers.read(kind, target[0], target[1], shares)
    return Reading(reading.records, reading.seconds, {**reading.cpu_s, "broker": broker_cpu() - broker_before})


def rotated(items: Sequence[Variant], round_no: int) -> list[Variant]:
    """The variants in round ``round_no``'s order (0-based): each round starts one further along."""
    k = round_no % len(items) if items else 0
    return [*items[k:], *items[:k]]


def per_million(values: Sequence[float], records: int) -> float:
    return round(statistics.median(values) * 1e6 / records, 2)


def cpu_ratio_of(cpu_per_million: Mapping[str, Mapping[str, float]], a: str, b: str) -> float | None:
    """``a``'s readers' CPU per record over ``b``'s, when both ran (and ``b`` spent any)."""
    if a not in cpu_per_million or b not in cpu_per_million or cpu_per_million[b]["readers"] <= 0:
        return None
    return round(cpu_per_million[a]["readers"] / cpu_per_million[b]["readers"], 2)


def round_ratios_of(rates: Mapping[str, Sequence[float]], a: str, b: str) -> list[float]:
    """``a`` / ``b`` records/s round by round (both ran in every round): how far the rounds spread."""
    if a not in rates or b not in rates:
        return []
    return [round(x / y, 3) for x, y in zip(rates[a], rates[b], strict=True)]


def summarize(
    rates: Mapping[str, Sequence[float]], cpu: Mapping[str, Sequence[Mapping[str, float]]], records: int, n: int
) -> dict[str, Any]:
    """The JSON figures from every round's records/s and CPU per variant (pure: unit-tested)."""
    medians = {name: statistics.median(values) for name, values in rates.items() if values}

    def ratio(a: str, b: str) -> float | None:
        return round(medians[a] / medians[b], 3) if a in medians and b in medians else None

    cpu_per_million = {
        name: {part: per_million([r.get(part, 0.0) for r in runs], records) for part in sorted({*runs[0]})}
        for name, runs in cpu.items()
        if runs
    }
    spark_n, raw_n, kafka_n = f"spark_local_{n}", f"raw_{n}", f"spark_kafka_local_{n}"
    return {
        "records_per_s": {name: round(value) for name, value in medians.items()},
        "ratio": ratio(spark_n, raw_n),
        "ratio_one_task": ratio("spark_local_1", "raw_1"),
        "ratio_vs_arrow_readers": ratio(spark_n, f"arrow_{n}"),
        "ratio_unequal": ratio(spark_n, "raw_1"),
        "round_ratios": round_ratios_of(rates, spark_n, raw_n),
        "ratio_spark_kafka": ratio(spark_n, kafka_n),
        "ratio_spark_kafka_one_task": ratio("spark_local_1", "spark_kafka_local_1"),
        "round_ratios_spark_kafka": round_ratios_of(rates, spark_n, kafka_n),
        "cpu_s_per_million_records": cpu_per_million,
        "cpu_ratio": cpu_ratio_of(cpu_per_million, spark_n, raw_n),
        "cpu_ratio_spark_kafka": cpu_ratio_of(cpu_per_million, spark_n, kafka_n),
    }


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


def parse_families(text: str) -> tuple[str, ...]:
    families = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [f for f in families if f not in FAMILIES]
    if not families or unknown:
        raise argparse.ArgumentTypeError(f"--variants: some of {','.join(FAMILIES)}, got {text!r}")
    return families


def raw_variants(
    readers: RawReaders,
    families: set[str],
    ends: Mapping[int, int],
    shares: Sequence[Mapping[int, int]],
    n: int,
    target: tuple[str, str],
    broker_cpu: Callable[[], float],
) -> list[Variant]:
    """``raw_1``/``raw_N`` and ``arrow_1``/``arrow_N`` (one variant each with ``--parallelism 1``)."""
    variants: list[Variant] = []
    for kind in ("raw", "arrow"):
        if kind not in families:
            continue
        for name, kind_shares in ((f"{kind}_1", [ends]), (f"{kind}_{n}", shares)):
            if any(v.name == name for v in variants):
                continue

            def read(kind: str = kind, kind_shares: Sequence[Mapping[int, int]] = kind_shares) -> Reading:
                return raw_reading(readers, kind, kind_shares, target, broker_cpu)

            variants.append(Variant(name, read))
    return variants


def spark_variants(
    sessions: Mapping[str, Mapping[int, SparkSessionProcess]],
    families: set[str],
    n: int,
    broker_cpu: Callable[[], float],
) -> list[Variant]:
    """``spark_local_1``/``spark_local_N`` (counting with our source), ``spark_kafka_local_1``/
    ``spark_kafka_local_N`` (counting with Spark's, in sessions of their own) and ``spark_parquet_local_N``.
    ``sessions`` is by source (``ours``, ``kafka``), then by ``k`` of ``local[k]``."""
    variants: list[Variant] = []

    def reading(session: SparkSessionProcess, command: str) -> Callable[[], Reading]:
        return lambda: spark_reading(session, command, broker_cpu)

    for family, source, prefix in (("spark", "ours", "spark_local"), ("spark_kafka", "kafka", "spark_kafka_local")):
        if family in families:
            variants += [
                Variant(f"{prefix}_{k}", reading(session, session.count_command))
                for k, session in sorted(sessions[source].items())
            ]
    if "parquet" in families:
        variants.append(Variant(f"spark_parquet_local_{n}", reading(sessions["ours"][n], "parquet")))
    return variants


def session_sizes(families: set[str], n: int) -> dict[str, list[int]]:
    """The ``k`` of the ``local[k]`` sessions each source needs: both sizes to count, ``N`` only for Parquet."""
    sizes: dict[str, list[int]] = {}
    if "spark" in families:
        sizes["ours"] = sorted({1, n})
    elif "parquet" in families:
        sizes["ours"] = [n]
    if "spark_kafka" in families:
        sizes["kafka"] = sorted({1, n})
    return sizes


def open_session(master: str, settings: dict[str, Any], warmup: int, ends: Mapping[int, int]) -> SparkSessionProcess:
    """A session started, warmed by ``warmup`` reads of its source (the first reads of a session run while the JVM
    still compiles its row copy), then checked once to return every produced offset exactly once, off the clock."""
    session = SparkSessionProcess(master, settings)
    print(f"spark session {session.label} in {session.session_s:.1f} s (its own process)", flush=True)
    try:
        for i in range(warmup):
            records, secs = session.command(session.count_command)
            print(f"warm-up {session.label} read {i + 1}: {records} records in {secs:.2f} s", flush=True)
        mismatches = offset_mismatches(session.offsets(), ends)
        if mismatches:
            raise RuntimeError(f"{session.label} did not read exactly the produced records: {'; '.join(mismatches)}")
        print(f"exact: {session.label} read every produced offset of the {len(ends)} partitions once", flush=True)
    except BaseException:
        session.close()
        raise
    return session


def run_rounds(
    variants: Sequence[Variant], rounds: int, total: int
) -> tuple[dict[str, list[float]], dict[str, list[dict[str, float]]]]:
    """Each variant once per round, in an order rotated every round; records/s and CPU of every reading."""
    rates: dict[str, list[float]] = {v.name: [] for v in variants}
    cpu: dict[str, list[dict[str, float]]] = {v.name: [] for v in variants}
    for round_no in range(rounds):
        order = rotated(variants, round_no)
        print(f"round {round_no + 1}: {', '.join(v.name for v in order)}", flush=True)
        for variant in order:
            reading = variant.read()
            if reading.records != total:
                raise RuntimeError(f"{variant.name} read {reading.records} records, expected {total}")
            rates[variant.name].append(total / reading.seconds)
            cpu[variant.name].append(reading.cpu_s)
            shown = {part: round(value, 2) for part, value in reading.cpu_s.items()}
            print(
                f"  {variant.name:>22}: {reading.seconds:6.2f} s {total / reading.seconds:12,.0f} rec/s cpu s {shown}",
                flush=True,
            )
    return rates, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--parallelism", type=int, default=2, help="N: raw reader processes and Spark's local[N]")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--warmup", type=int, default=3, help="Spark reads per session before the rounds (the JVM compiles its copy)"
    )
    parser.add_argument("--variants", type=parse_families, default=FAMILIES, help="families to run, comma-separated")
    parser.add_argument(
        "--min-partitions", type=int, default=None, help="minPartitions of both Spark sources (ours and Spark's)"
    )
    parser.add_argument(
        "--max-records-per-partition", type=int, default=None, help="maxRecordsPerPartition of both Spark sources"
    )
    args = parser.parse_args(argv)
    for name in ("records", "partitions", "parallelism", "rounds", "value_size", "warmup"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    n, families = args.parallelism, set(args.variants)
    if "spark_kafka" in families and not spark_kafka_jars():
        parser.error("spark_kafka: Spark's Kafka source jars are missing (bash scripts/setup.sh fetches them)")

    with broker() as (bootstrap, broker_pid), tempfile.TemporaryDirectory(prefix="bench-read-") as tmp:
        topic = f"bench-read-{time.time_ns()}"
        create_topics(bootstrap, {topic: args.partitions})
        closers: list[Callable[[], None]] = []
        try:
            started = time.perf_counter()
            ends = produce_sample(bootstrap, topic, args.partitions, args.records, value_size=args.value_size)
            total = sum(ends.values())
            print(
                f"produced {total} records of {args.value_size} B over {args.partitions} partitions "
                f"in {time.perf_counter() - started:.1f} s (the last record of each partition is its own batch)",
                flush=True,
            )

            def broker_cpu() -> float:
                return sum(procfs.tree_cpu_seconds(broker_pid).values()) if broker_pid is not None else 0.0

            variants: list[Variant] = []
            shares = split_partitions(ends, n)
            if len(shares) < n:
                print(f"only {len(shares)} partitions: {len(shares)} raw reader processes, not {n}", flush=True)
            if families & {"raw", "arrow"}:
                readers = RawReaders(len(shares))
                closers.append(readers.close)
                variants += raw_variants(readers, families, ends, shares, n, (bootstrap, topic), broker_cpu)
            sessions: dict[str, dict[int, SparkSessionProcess]] = {}
            for source, sizes in session_sizes(families, n).items():
                settings = {
                    "source": source,
                    "bootstrap": bootstrap,
                    "topic": topic,
                    "ends": ends,
                    "out": f"{tmp}/out",
                    "min_partitions": args.min_partitions,
                    "max_records_per_partition": args.max_records_per_partition,
                }
                for k in sizes:
                    session = open_session(f"local[{k}]", settings, args.warmup, ends)
                    closers.append(session.close)
                    sessions.setdefault(source, {})[k] = session
            variants += spark_variants(sessions, families, n, broker_cpu)
            for variant in variants:  # every variant warm before the rounds, as it will be measured
                print(f"warm-up {variant.name:>22}: {variant.read().seconds:6.2f} s", flush=True)
            rates, cpu = run_rounds(variants, args.rounds, total)
        finally:
            for close in reversed(closers):
                with contextlib.suppress(Exception):
                    close()
            delete_topics(bootstrap, [topic])

    figures = summarize(rates, cpu, total, n)
    print(
        f"spark local[{n}] / raw x{n} (records/s): {figures['ratio']}, per round {figures['round_ratios']}; "
        f"CPU per record spark/raw: {figures['cpu_ratio']}",
        flush=True,
    )
    if figures["ratio_spark_kafka"] is not None:
        print(
            f"spark local[{n}] ours / Spark's Kafka source (records/s): {figures['ratio_spark_kafka']} "
            f"(target >= {SPARK_KAFKA_TARGET}), per round {figures['round_ratios_spark_kafka']}; local[1]: "
            f"{figures['ratio_spark_kafka_one_task']}; CPU per record ours/theirs: {figures['cpu_ratio_spark_kafka']}",
            flush=True,
        )
    print(
        json.dumps(
            {"records": total, "partitions": args.partitions, "parallelism": n, "rounds": args.rounds, **figures}
        )
    )


if __name__ == "__main__":
    main()
