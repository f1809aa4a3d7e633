"""The peer users would pick instead of us: Spark Structured Streaming's own Kafka source running the example.

    python -m bench.peer_spark_streaming [--records 2000000] [--partitions 32] [--parallelism 2]
        [--warmup-records 8000] [--max-offsets-per-trigger N] [--min-partitions N] [--driver-memory 2g]
        [--timeout 1800]

A Spark user with a Kafka topic and the example's job would write a streaming query: ``spark.readStream``
with Spark's Kafka source (``spark-sql-kafka-0-10``, the version of the session's Spark), ``foreachBatch``
calling their batch function, a checkpoint, and ``Trigger.AvailableNow`` to drain what is there. That query
is built here (``start_query``) with the example's own function (``jobs.clickstream.page_views`` and
``write_page_views``), so both sides compute and write exactly the same thing into the same sink layout:

- the source reads ``subscribe`` = the topic from ``startingOffsets`` (``earliest``, or each partition's offset
  as JSON), with ``kafka.isolation.level=read_committed`` (Spark's consumer defaults to read_uncommitted; ours
  reads committed), ``includeHeaders=true`` (our source's schema has the headers) and, optionally,
  ``maxOffsetsPerTrigger`` and ``minPartitions``;
- each micro-batch is persisted (read from Kafka once), its ranges computed in one small aggregation as
  ``(topic, partition, min(offset), max(offset) + 1)``, and the example's function writes its page views
  into ``range=<topic>-<partition>-<start>-<end>`` folders with dynamic partition overwrite: a batch replayed
  after a failure has the same offsets, so it replaces its own folders and nothing else;
- the session is a classic ``local[N]`` (``--parallelism``, 2 by default: the cores our runs have) in a
  process of its own (``run_peer_in_subprocess``; one Spark context per process), which first drains a small
  warm-up topic with its own checkpoint and output (the JVM compiles the same queries), then the timed query.

The clock of ``peer_available_now_s`` starts when the backlog is fully produced and the warm-up done (just
before the timed query is started) and stops when the AvailableNow query has terminated: its last batch's
output written and its offsets committed to the checkpoint. ``cpu_s`` is the CPU of the peer's process tree
(Python driver, JVM, Python workers, from ``/proc``) and of the local broker over that window. Then a
**probe** (``probe_sink``, no Spark) reads the sink and checks that the views per partition add up to the
records produced per partition; ``sink_views_by_shard`` reads our example's output the same way, so one probe
checks both sides of ``bench.e2e``.

This entry produces the example's clickstream backlog (``--records`` events keyed by user, plus one record per
partition) on the local broker (or on ``STREAMGROUP_KAFKA_BOOTSTRAP``), runs the warm-up and the timed drain,
probes the sink, and prints one JSON object as its last line. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster_streamgroup.dagster import StreamRange
from dagster_streamgroup.dagster.output import RANGE_COLUMN
from dagster_streamgroup.local import procfs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

AVAILABLE_NOW = "available_now"
"""``start_query``'s trigger for draining what is there and stopping (``Trigger.AvailableNow``)."""
DEFAULT_TRIGGER = "default"
"""``start_query``'s trigger for Spark's default: a micro-batch as soon as the previous one ends, forever."""
WARMUP_RECORDS = 8_000
CHILD_GRACE_S = 300.0
"""What the peer's process may take beyond its query's timeout (session start, warm-up, stop) before it is
killed: every run stays bounded."""


def starting_offsets_json(topic: str, starts: Mapping[int, int]) -> str:
    """Spark's ``startingOffsets`` for exact per-partition offsets: ``{"topic": {"0": 123, ...}}``. Spark wants
    every partition of a subscribed topic named once offsets are given."""
    return json.dumps({topic: {str(p): int(offset) for p, offset in sorted(starts.items())}})


def kafka_options(
    bootstrap: str,
    topic: str,
    *,
    starting_offsets: Mapping[int, int] | None = None,
    max_offsets_per_trigger: int | None = None,
    min_partitions: int | None = None,
) -> dict[str, str]:
    """The source options of the peer: what a user of Spark's Kafka source sets to read a topic exactly as our
    runs do (committed records only, headers included), from ``earliest`` or the given offsets."""
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest" if starting_offsets is None else starting_offsets_json(topic, starting_offsets),
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "true",
    }
    if max_offsets_per_trigger is not None:
        options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    if min_partitions is not None:
        options["minPartitions"] = str(min_partitions)
    return options


def batch_ranges(batch: DataFrame) -> list[tuple[StreamRange, int]]:
    """The ranges a micro-batch holds, each with its record count: ``(topic:partition, min(offset),
    max(offset) + 1)`` per partition, in one aggregation (of the persisted batch)."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    rows = (
        batch.groupBy("topic", "partition")
        .agg(F.min("offset").alias("lo"), F.max("offset").alias("hi"), F.count(F.lit(1)).alias("n"))
        .collect()
    )
    found = [(StreamRange(f"{r['topic']}:{r['partition']}", int(r["lo"]), int(r["hi"]) + 1), int(r["n"])) for r in rows]
    return sorted(found, key=lambda item: (item[0].shard, item[0].start))


@dataclass(frozen=True)
class BatchDone:
    """What one micro-batch held and how long its function took (the ``foreachBatch`` call)."""

    batch_id: int
    ranges: list[tuple[str, int, int]]
    records: int
    seconds: float


Inspect = Callable[["DataFrame", int], None]
"""Called with each persisted micro-batch before it is written (tests look at the rows the peer read)."""


class PageViewsBatches:
    """The peer's ``foreachBatch`` function: the batch persisted (read once), its ranges, then the example's
    ``page_views`` written by its ``write_page_views`` under ``output``. It runs in the driver's Python process,
    so what it records (``done``) is there to read when the query ends."""

    def __init__(self, output: str | Path, inspect: Inspect | None = None) -> None:
        self.output = str(output)
        self.inspect = inspect
        self.done: list[BatchDone] = []

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from jobs.clickstream import page_views, write_page_views

        started = time.perf_counter()
        batch.persist()
        try:
            found = batch_ranges(batch)
            if found:
                if self.inspect is not None:
                    self.inspect(batch, batch_id)
                write_page_views(page_views(batch, [r for r, _ in found]), self.output)
        finally:
            batch.unpersist()
        ranges = [(r.shard, r.start, r.end) for r, _ in found]
        self.done.append(BatchDone(batch_id, ranges, sum(n for _, n in found), time.perf_counter() - started))

    @property
    def records(self) -> int:
        return sum(b.records for b in self.done)


class ClickRowsToDelta(PageViewsBatches):
    """The peer's ``foreachBatch`` with the Delta sink (``bench.e2e --sink delta``): the example's ``click_rows`` of
    the batch appended to a Delta table at ``output``, partitioned by day as ours, with Delta's idempotent write
    for ``foreachBatch``: the commit records the application transaction (app id: this query's checkpoint, version:
    the batch id), and a batch whose id the table holds already is skipped (a replayed batch after a failure).

    Delta's own streaming sink (and the ``txnAppId``/``txnVersion`` options of Delta's Spark writer) need
    ``delta-spark`` for Spark 4.2, which Maven Central does not serve (docs/outputs.md), so the rows go through
    delta-rs, as a Spark 4.2 user's ``foreachBatch`` would write them; the batch is persisted and read once."""

    def __init__(self, output: str | Path, app_id: str, inspect: Inspect | None = None) -> None:
        super().__init__(output, inspect)
        self.app_id = app_id

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        from jobs.clickstream import click_rows

        started = time.perf_counter()
        batch.persist()
        try:
            found = batch_ranges(batch)
            exists = DeltaTable.is_deltatable(self.output)
            done = DeltaTable(self.output).transaction_version(self.app_id) if exists else None
            if found and (done is None or done < batch_id):
                if self.inspect is not None:
                    self.inspect(batch, batch_id)
                write_deltalake(
                    self.output,
                    click_rows(batch).toArrow(),
                    mode="append",
                    partition_by=["day"],
                    commit_properties=CommitProperties(app_transactions=[Transaction(self.app_id, batch_id)]),
                )
        finally:
            batch.unpersist()
        ranges = [(r.shard, r.start, r.end) for r, _ in found]
        self.done.append(BatchDone(batch_id, ranges, sum(n for _, n in found), time.perf_counter() - started))


def start_query(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    output: str | Path,
    checkpoint: str | Path,
    *,
    trigger: str = AVAILABLE_NOW,
    starting_offsets: Mapping[int, int] | None = None,
    max_offsets_per_trigger: int | None = None,
    min_partitions: int | None = None,
    inspect: Inspect | None = None,
    sink: str = "parquet",
) -> tuple[StreamingQuery, PageViewsBatches]:
    """Start the peer's streaming query and return it with its batch function (which records each batch).

    ``trigger``: ``AVAILABLE_NOW`` drains what the topic holds when the query starts, in one batch or in
    ``maxOffsetsPerTrigger``-sized ones, then stops; ``DEFAULT_TRIGGER`` runs batches back to back until
    stopped; anything else is a processing-time interval (``"10 seconds"``). A checkpoint that exists resumes
    from its committed offsets, as a restarted streaming job does."""
    source = spark.readStream.format("kafka").options(
        **kafka_options(
            bootstrap,
            topic,
            starting_offsets=starting_offsets,
            max_offsets_per_trigger=max_offsets_per_trigger,
            min_partitions=min_partitions,
        )
    )
    batches = (
        ClickRowsToDelta(output, f"peer:{Path(str(checkpoint)).resolve()}", inspect)
        if sink == "delta"
        else PageViewsBatches(output, inspect)
    )
    writer = source.load().writeStream.foreachBatch(batches).option("checkpointLocation", str(checkpoint))
    writer = writer.queryName(f"peer-{Path(str(checkpoint)).name}")
    if trigger == AVAILABLE_NOW:
        writer = writer.trigger(availableNow=True)
    elif trigger != DEFAULT_TRIGGER:
        writer = writer.trigger(processingTime=trigger)
    return writer.start(), batches


def await_query(query: StreamingQuery, timeout_s: float) -> None:
    """Wait for an AvailableNow query to end; stop it and raise past ``timeout_s`` (a run stays bounded). A
    failed batch raises Spark's ``StreamingQueryException`` from here."""
    if not query.awaitTermination(max(1, round(timeout_s))):
        query.stop()
        raise TimeoutError(f"the peer's query {query.name} did not finish within {timeout_s:.0f} s")
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"the peer's query {query.name} failed: {error}")


@dataclass(frozen=True)
class PeerSpec:
    """One run of the peer: a warm-up drain of ``warmup_topic`` (when given), then the timed drain of ``topic``
    from ``starting_offsets`` (``None``: earliest). Outputs and checkpoints live under ``work``."""

    bootstrap: str
    topic: str
    work: str
    warmup_topic: str | None = None
    starting_offsets: dict[int, int] | None = None
    parallelism: int = 2
    driver_memory: str = "2g"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    timeout_s: float = 1800.0
    broker_pid: int | None = None
    """The local broker's PID, to count its CPU over the timed drain (``None``: an external cluster)."""
    extra_conf: dict[str, str] = field(default_factory=dict)
    sink: str = "parquet"
    """``parquet``: the example's page views per range folder; ``delta``: its click rows into a Delta table."""

    @property
    def output(self) -> Path:
        return Path(self.work) / "output"

    @property
    def checkpoint(self) -> Path:
        return Path(self.work) / "checkpoint"


def tree_cpu_s(pid: int | None) -> float:
    """CPU so far of ``pid``'s process tree (own and reaped children; 0 without a PID)."""
    return sum(procfs.tree_cpu_seconds(pid).values()) if pid is not None else 0.0


def drain(
    spark: SparkSession, spec: PeerSpec, topic: str, work: Path, offsets: dict[int, int] | None
) -> dict[str, Any]:
    """One AvailableNow query over ``topic`` into ``work/output`` with ``work/checkpoint``: its seconds (start
    to termination), batches, records and the CPU of this process tree and of the broker."""
    cpu_before, broker_before = tree_cpu_s(os.getpid()), tree_cpu_s(spec.broker_pid)
    started = time.perf_counter()
    query, batches = start_query(
        spark,
        spec.bootstrap,
        topic,
        work / "output",
        work / "checkpoint",
        starting_offsets=offsets,
        max_offsets_per_trigger=spec.max_offsets_per_trigger,
        min_partitions=spec.min_partitions,
        sink=spec.sink,
    )
    await_query(query, spec.timeout_s)
    seconds = time.perf_counter() - started
    cpu = {"peer": tree_cpu_s(os.getpid()) - cpu_before}
    if spec.broker_pid is not None:
        cpu["broker"] = tree_cpu_s(spec.broker_pid) - broker_before
    return {
        "seconds": seconds,
        "batches": len(batches.done),
        "records": batches.records,
        "batch_seconds": [round(b.seconds, 3) for b in batches.done],
        "cpu_s": {part: round(value, 2) for part, value in cpu.items()},
    }


def run_peer(spec: PeerSpec) -> dict[str, Any]:
    """The peer in this process: a ``local[N]`` session, the warm-up drain, the timed drain; its figures.

    The session is stopped at the end: its JVM must not share the machine with what the caller runs next."""
    import jobs.clickstream  # noqa: F401  # the example's function, imported before any clock
    from dagster_streamgroup.spark.session import local_spark_session

    started = time.perf_counter()
    conf = {"spark.driver.memory": spec.driver_memory, "spark.ui.showConsoleProgress": "false", **spec.extra_conf}
    spark = local_spark_session(master=f"local[{spec.parallelism}]", app_name="bench-peer-spark-streaming", conf=conf)
    try:
        session_s = time.perf_counter() - started
        warmup: dict[str, Any] | None = None
        if spec.warmup_topic is not None:
            warmup = drain(spark, spec, spec.warmup_topic, Path(spec.work) / "warmup", None)
            print(
                f"peer warm-up: {warmup['records']} records in {warmup['seconds']:.2f} s, {warmup['batches']} batches",
                flush=True,
            )
        timed = drain(spark, spec, spec.topic, Path(spec.work), spec.starting_offsets)
    finally:
        spark.stop()
    print(
        f"peer AvailableNow drain: {timed['records']} records in {timed['seconds']:.2f} s, {timed['batches']} "
        f"batches, CPU s {timed['cpu_s']}",
        flush=True,
    )
    return {
        "peer_available_now_s": round(timed["seconds"], 3),
        "records": timed["records"],
        "records_per_s": round(timed["records"] / timed["seconds"]) if timed["seconds"] > 0 else None,
        "batches": timed["batches"],
        "batch_seconds": timed["batch_seconds"],
        "cpu_s": timed["cpu_s"],
        "session_s": round(session_s, 2),
        "warmup_s": round(warmup["seconds"], 2) if warmup else None,
        "warmup_records": warmup["records"] if warmup else 0,
        "parallelism": spec.parallelism,
        "max_offsets_per_trigger": spec.max_offsets_per_trigger,
        "min_partitions": spec.min_partitions,
        "output": str(spec.output),
    }


def _peer_main(conn: multiprocessing.connection.Connection, spec: PeerSpec) -> None:
    """The peer's process: runs ``run_peer`` and answers its figures, or its error as text (any error pickles)."""
    try:
        conn.send(run_peer(spec))
    except BaseException as exc:
        conn.send(RuntimeError(f"{type(exc).__name__}: {exc}"))
        raise


def kill_tree(pid: int) -> None:
    """SIGKILL a process we started and everything under it (the peer's JVM and Python workers)."""
    with contextlib.suppress(procfs.ProcfsUnavailableError):
        for child in reversed(procfs.process_tree(pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def start_peer_process(
    spec: PeerSpec,
) -> tuple[multiprocessing.process.BaseProcess, multiprocessing.connection.Connection]:
    """``run_peer`` started in a spawned process of its own (one Spark context per process; nothing of the
    caller's state shared): the process, which the caller may kill with its tree (``kill_tree``), and the end of
    the pipe its figures arrive on (``finish_peer_process``)."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    proc = context.Process(target=_peer_main, args=(child, spec), name="peer-spark-streaming", daemon=True)
    proc.start()
    child.close()
    return proc, parent


def finish_peer_process(
    proc: multiprocessing.process.BaseProcess, parent: multiprocessing.connection.Connection, timeout_s: float
) -> dict[str, Any]:
    """The figures of a peer's process from ``start_peer_process``, killed with its tree if it has not answered
    within ``timeout_s``."""
    assert proc.pid is not None
    try:
        if not parent.poll(timeout_s):
            raise TimeoutError(f"the peer's process gave no answer within {timeout_s:.0f} s")
        answer = parent.recv()
    except BaseException:
        kill_tree(proc.pid)
        raise
    finally:
        proc.join(60)
        if proc.is_alive():
            kill_tree(proc.pid)
            proc.join(10)
    if isinstance(answer, Exception):
        raise RuntimeError("the peer failed") from answer
    return dict(answer)


def run_peer_in_subprocess(spec: PeerSpec) -> dict[str, Any]:
    """``run_peer`` in a spawned process of its own (``start_peer_process``), killed with its tree if it has not
    answered within its query's timeout plus ``CHILD_GRACE_S``."""
    proc, parent = start_peer_process(spec)
    return finish_peer_process(proc, parent, spec.timeout_s + CHILD_GRACE_S)


def parse_range_directory(name: str) -> tuple[str, int, int]:
    """``(shard, start, end)`` of a sink folder's range key (``range_key``: ``<topic>-<partition>-<start>-<end>``
    for Kafka, whose topic names may hold dashes but never ``:``; ``<shard>-<start>-<end>`` for v3io)."""
    head, start, end = name.rsplit("-", 2)
    topic, sep, partition = head.rpartition("-")
    shard = f"{topic}:{partition}" if sep and partition.isdigit() else head
    return shard, int(start), int(end)


def range_folders(output: str | Path) -> Iterator[tuple[tuple[str, int, int], list[Path]]]:
    """Each range folder of the page-views sink, as ``(shard, start, end)`` with its Parquet files: the layout
    both our example's runs and the peer write (``range=<key>`` folders, Spark's ``_``/``.`` files skipped), in
    order; an absent sink has none. A folder replaced while it is listed is skipped."""
    for folder in sorted(Path(output).glob(f"{RANGE_COLUMN}=*")):
        if not folder.is_dir():
            continue
        try:
            files = [f for f in folder.iterdir() if f.suffix == ".parquet" and not f.name.startswith(("_", "."))]
        except FileNotFoundError:
            continue
        yield parse_range_directory(folder.name.split("=", 1)[1]), files


def sink_ranges(output: str | Path) -> dict[tuple[str, int, int], int]:
    """The views each range's folder of the page-views sink holds, by ``(shard, start, end)`` (``range_folders``),
    read with pyarrow, no Spark."""
    import pyarrow.parquet as pq

    return {
        key: sum(sum(pq.read_table(f, columns=["views"]).column("views").to_pylist()) for f in files)
        for key, files in range_folders(output)
    }


def sink_views_by_shard(output: str | Path) -> dict[str, int]:
    """The views per shard (``topic:partition``) of a page-views sink: the records its ranges held."""
    out: dict[str, int] = {}
    for (shard, _, _), views in sink_ranges(output).items():
        out[shard] = out.get(shard, 0) + views
    return dict(sorted(out.items()))


def overlapping_ranges(ranges: list[tuple[str, int, int]]) -> list[str]:
    """Pairs of a shard's ranges that overlap (records counted twice), as text."""
    found = []
    ordered = sorted(ranges)
    for a, b in itertools.pairwise(ordered):
        if a[0] == b[0] and b[1] < a[2]:
            found.append(f"{a[0]} [{a[1]}, {a[2]}) and [{b[1]}, {b[2]})")
    return found


def probe_sink(output: str | Path, expected: Mapping[str, int]) -> dict[str, Any]:
    """Whether the sink's views per shard equal ``expected`` (records per shard) and no two of its ranges
    overlap; the differences when not."""
    ranges = sink_ranges(output)
    views = sink_views_by_shard(output)
    wanted = {shard: n for shard, n in expected.items() if n}
    mismatched = {
        shard: {"views": views.get(shard, 0), "expected": wanted.get(shard, 0)}
        for shard in sorted({*views, *wanted})
        if views.get(shard, 0) != wanted.get(shard, 0)
    }
    overlaps = overlapping_ranges(list(ranges))
    return {
        "ok": not mismatched and not overlaps,
        "views": sum(views.values()),
        "expected": sum(wanted.values()),
        "ranges": len(ranges),
        "mismatched": mismatched,
        "overlapping": overlaps,
    }


def probe_delta(table: str | Path, expected: Mapping[str, int]) -> dict[str, Any]:
    """Whether a Delta table of click rows holds each record once, ``expected`` records per shard, and how many
    data files it has (``files``: what readers open; ``files_on_disk``: with those a replacement removed from the
    table but a vacuum has not deleted yet)."""
    from deltalake import DeltaTable

    path = str(table)
    if not DeltaTable.is_deltatable(path):
        return {"ok": not any(expected.values()), "rows": 0, "expected": sum(expected.values()), "files": 0}
    dt = DeltaTable(path)
    rows = dt.to_pyarrow_table(columns=["topic", "partition", "offset"]).to_pydict()
    keys = list(zip(rows["topic"], rows["partition"], rows["offset"], strict=True))
    per_shard: dict[str, int] = {}
    for topic, partition, _ in keys:
        shard = f"{topic}:{partition}"
        per_shard[shard] = per_shard.get(shard, 0) + 1
    wanted = {shard: n for shard, n in expected.items() if n}
    mismatched = {
        shard: {"rows": per_shard.get(shard, 0), "expected": wanted.get(shard, 0)}
        for shard in sorted({*per_shard, *wanted})
        if per_shard.get(shard, 0) != wanted.get(shard, 0)
    }
    doubled = len(keys) - len(set(keys))
    return {
        "ok": not mismatched and not doubled,
        "rows": len(keys),
        "expected": sum(wanted.values()),
        "doubled": doubled,
        "files": len(dt.file_uris()),
        "files_on_disk": sum(
            1 for f in Path(path).rglob("*.parquet") if not any(p.startswith("_") for p in f.relative_to(path).parts)
        ),
        "version": dt.version(),
        "mismatched": mismatched,
    }


def backlog_by_shard(starts: Mapping[str, int], highs: Mapping[str, int]) -> dict[str, int]:
    """Records per shard between ``starts`` (absent: 0) and ``highs``: a non-transactional producer's backlog."""
    return {shard: high - starts.get(shard, 0) for shard, high in sorted(highs.items())}


def high_watermarks(bootstrap: str, topic: str) -> dict[str, int]:
    """Each partition's end as our readers see it (the last stable offset), by ``topic:partition``."""
    from dagster_streamgroup.streams.kafka import KafkaBackend
    from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

    backend = KafkaBackend(KafkaStreamConfig(bootstrap_servers=bootstrap, topics=[topic]))
    try:
        return {shard: marks.high for shard, marks in backend.watermarks(backend.shards()).items()}
    finally:
        backend.close()


def produce_clicks(bootstrap: str, topic: str, partitions: int, records: int, seed: int) -> None:
    """``records`` of the example's click events keyed by user, then one record per partition (as the example's
    producer sends them)."""
    from jobs.clickstream_events import produce_burst, producers

    bulk, trailer = producers({"bootstrap.servers": bootstrap})
    produce_burst(bulk, trailer, topic, partitions, records, random.Random(seed))
    del bulk, trailer  # flushed; not left to outlive the broker


@contextlib.contextmanager
def kafka_broker() -> Iterator[tuple[str, int | None]]:
    """The bootstrap address, and the local broker's PID when it runs here (its CPU is measured too)."""
    from dagster_streamgroup.local.kafka_broker import external_bootstrap, running_broker

    external = external_bootstrap()
    if external is not None:
        yield external, None
        return
    with running_broker() as info:
        yield info.bootstrap, info.pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--parallelism", type=int, default=2, help="N of the peer's local[N] session")
    parser.add_argument("--warmup-records", type=int, default=WARMUP_RECORDS, help="drained before the timed query")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument("--min-partitions", type=int, default=None)
    parser.add_argument("--driver-memory", default="2g", help="the peer's driver heap (the Connect server's default)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up the timed query after this long")
    args = parser.parse_args(argv)
    for name in ("records", "partitions", "parallelism", "warmup_records"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("max_offsets_per_trigger", "min_partitions"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dagster_streamgroup.local.kafka_data import create_topics, delete_topics

    with kafka_broker() as (bootstrap, broker_pid), tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        suffix = uuid.uuid4().hex[:8]
        topic, warmup_topic = f"clicks-{suffix}", f"peer-warmup-{suffix}"
        create_topics(bootstrap, {topic: args.partitions, warmup_topic: args.partitions})
        try:
            produce_clicks(bootstrap, warmup_topic, args.partitions, args.warmup_records, seed=1)
            started = time.perf_counter()
            produce_clicks(bootstrap, topic, args.partitions, args.records, seed=args.records)
            expected = backlog_by_shard({}, high_watermarks(bootstrap, topic))
            print(
                f"{sum(expected.values())} records produced over {args.partitions} partitions in "
                f"{time.perf_counter() - started:.1f} s",
                flush=True,
            )
            spec = PeerSpec(
                bootstrap=bootstrap,
                topic=topic,
                work=str(Path(tmp) / "peer"),
                warmup_topic=warmup_topic,
                parallelism=args.parallelism,
                driver_memory=args.driver_memory,
                max_offsets_per_trigger=args.max_offsets_per_trigger,
                min_partitions=args.min_partitions,
                timeout_s=args.timeout,
                broker_pid=broker_pid,
            )
            result = run_peer_in_subprocess(spec)
            probe = probe_sink(spec.output, expected)
        finally:
            delete_topics(bootstrap, [topic, warmup_topic])
    print(f"probe of the peer's sink: {probe}", flush=True)
    result.pop("output")
    print(json.dumps({**result, "partitions": args.partitions, "produced": sum(expected.values()), "probe": probe}))
    return 0 if probe["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
