"""Read throughput of exact Kafka offset ranges: raw confluent-kafka against the Spark range source, like with like.

    python -m bench.read_throughput [--records 2000000] [--partitions 8] [--value-size 100] [--parallelism 2]
        [--rounds 5] [--warmup 3] [--variants raw,arrow,spark,parquet]

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
- ``spark_parquet_local_N``: the source writing them as Parquet in the ``local[N]`` session.

The comparison is like with like: ``ratio`` = ``spark_local_N`` / ``raw_N`` (records per second, equal
parallelism), beside ``ratio_one_task`` (``spark_local_1`` / ``raw_1``), ``ratio_vs_arrow_readers``
(``spark_local_N`` / ``arrow_N``) and, for continuity only, ``ratio_unequal`` (``spark_local_N`` / ``raw_1``:
the comparison before, N Spark tasks against one consumer). Every variant is warmed before the rounds (Spark
sessions by ``--warmup`` reads: the first reads of a session run while the JVM is still compiling its
Arrow-to-row copy; raw readers by one read each), and each round rotates the order of the variants, so no
variant always goes first after producing or right after a Spark job. ``cpu_s_per_million_records`` gives
each variant's CPU beside its rate (the readers' processes, and the broker apart), and ``cpu_ratio`` the
Spark/raw ratio of CPU per record at equal parallelism. Every variant must return exactly the produced
records. The last line is one JSON object with the medians over the rounds.
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
from typing import Any

from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.kafka_broker import BrokerInfo, external_bootstrap, running_broker
from dagster_streamgroup.local.kafka_data import create_topics, delete_topics, produce_sample

RAW_BATCH = 10_000
COMMAND_TIMEOUT_S = 900.0
"""A reader process that has not answered a command within this long is killed: the run stays bounded."""
FAMILIES = ("raw", "arrow", "spark", "parquet")


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


def _spark_main(conn: multiprocessing.connection.Connection, master: str, settings: dict[str, Any]) -> None:
    """A Spark session of its own (one context per process): commands ``count``, ``parquet`` (write, timed)
    and ``verify_parquet`` (count what was written, after the clock stopped); answers ``(records, seconds)``."""
    from pyspark.sql import DataFrame

    from dagster_streamgroup.spark.kafka_source import read_kafka_ranges
    from dagster_streamgroup.spark.session import local_spark_session
    from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

    started = time.perf_counter()
    conf = {"spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false"}  # no progress bars in the log
    spark = local_spark_session(master=master, app_name=f"bench-read-throughput-{master}", conf=conf)
    config = KafkaStreamConfig(bootstrap_servers=settings["bootstrap"], topics=[settings["topic"]])
    ranges = {f"{settings['topic']}:{p}": (0, end) for p, end in settings["ends"].items()}
    out = settings["out"]
    conn.send(("ready", time.perf_counter() - started))

    def df() -> DataFrame:
        return read_kafka_ranges(
            spark,
            config,
            ranges,
            min_partitions=settings["min_partitions"],
            max_records_per_partition=settings["max_records_per_partition"],
        )

    try:
        while True:
            command = conn.recv()
            if command is None:
                return
            try:
                started = time.perf_counter()
                if command == "count":
                    records = int(df().count())
                elif command == "parquet":
                    df().write.mode("overwrite").parquet(out)
                    records = -1  # counted by verify_parquet, after the clock and the CPU reading
                elif command == "verify_parquet":
                    records = int(spark.read.parquet(out).count())
                else:
                    raise ValueError(f"unknown command {command!r}")
                conn.send((records, time.perf_counter() - started))
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
    """A ``local[k]`` session in a spawned process, measured as a whole: driver, JVM, Python workers."""

    def __init__(self, master: str, settings: dict[str, Any]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.proc = context.Process(target=_spark_main, args=(child, master, settings), name=master, daemon=True)
        self.proc.start()
        child.close()
        self.master = master
        _, self.session_s = _answer(self.conn, self.proc, f"spark session {master}")

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

    def command(self, command: str) -> tuple[int, float]:
        self.conn.send(command)
        records, seconds = _answer(self.conn, self.proc, f"{self.master} {command}")
        return int(records), float(seconds)

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
    spark_n, raw_n = f"spark_local_{n}", f"raw_{n}"
    cpu_ratio = None
    if spark_n in cpu_per_million and raw_n in cpu_per_million and cpu_per_million[raw_n]["readers"] > 0:
        cpu_ratio = round(cpu_per_million[spark_n]["readers"] / cpu_per_million[raw_n]["readers"], 2)
    round_ratios = (
        [round(s / r, 3) for s, r in zip(rates[spark_n], rates[raw_n], strict=True)]
        if spark_n in rates and raw_n in rates
        else []
    )
    return {
        "records_per_s": {name: round(value) for name, value in medians.items()},
        "ratio": ratio(spark_n, raw_n),
        "ratio_one_task": ratio("spark_local_1", "raw_1"),
        "ratio_vs_arrow_readers": ratio(spark_n, f"arrow_{n}"),
        "ratio_unequal": ratio(spark_n, "raw_1"),
        "round_ratios": round_ratios,
        "cpu_s_per_million_records": cpu_per_million,
        "cpu_ratio": cpu_ratio,
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
    sessions: Mapping[int, SparkSessionProcess], families: set[str], n: int, broker_cpu: Callable[[], float]
) -> list[Variant]:
    """``spark_local_1``/``spark_local_N`` (counting) and ``spark_parquet_local_N``."""
    variants: list[Variant] = []

    def reading(session: SparkSessionProcess, command: str) -> Callable[[], Reading]:
        return lambda: spark_reading(session, command, broker_cpu)

    if "spark" in families:
        variants += [Variant(f"spark_local_{k}", reading(session, "count")) for k, session in sorted(sessions.items())]
    if "parquet" in families:
        variants.append(Variant(f"spark_parquet_local_{n}", reading(sessions[n], "parquet")))
    return variants


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
    parser.add_argument("--min-partitions", type=int, default=None, help="minPartitions of the Spark source")
    parser.add_argument("--max-records-per-partition", type=int, default=None)
    args = parser.parse_args(argv)
    for name in ("records", "partitions", "parallelism", "rounds", "value_size", "warmup"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    n, families = args.parallelism, set(args.variants)

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
            if families & {"spark", "parquet"}:
                settings = {
                    "bootstrap": bootstrap,
                    "topic": topic,
                    "ends": ends,
                    "out": f"{tmp}/out",
                    "min_partitions": args.min_partitions,
                    "max_records_per_partition": args.max_records_per_partition,
                }
                sessions: dict[int, SparkSessionProcess] = {}
                for k in sorted({1, n}) if "spark" in families else [n]:
                    sessions[k] = SparkSessionProcess(f"local[{k}]", settings)
                    closers.append(sessions[k].close)
                    print(f"spark session local[{k}] in {sessions[k].session_s:.1f} s (its own process)", flush=True)
                for k, session in sessions.items():
                    for i in range(args.warmup):
                        records, secs = session.command("count")
                        print(f"warm-up local[{k}] read {i + 1}: {records} records in {secs:.2f} s", flush=True)
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
    print(
        json.dumps(
            {"records": total, "partitions": args.partitions, "parallelism": n, "rounds": args.rounds, **figures}
        )
    )


if __name__ == "__main__":
    main()
