"""The peer following a live stream: Spark Structured Streaming's Kafka source with its default trigger.

``bench.peer_spark_streaming`` drains a backlog with ``Trigger.AvailableNow``; a Spark user following a live
topic starts the same query with the default trigger instead (a micro-batch as soon as the one before ends,
forever) and lets it run. ``following_peer`` runs that query (``start_query`` with ``DEFAULT_TRIGGER``, the
example's function through ``foreachBatch`` into the range-keyed sink) in a spawned process of its own, until
the caller leaves the context.

The peer keeps its offsets in its checkpoint, not in Kafka: a batch's end offsets are written to
``offsets/<batch id>`` before the batch runs and ``commits/<batch id>`` once its ``foreachBatch`` returned.
``checkpoint_committed`` reads them as Kafka's group offsets are read for our deployment: the end offsets of
the last committed batch, so both sides' lag is "records produced, not yet in the sink and committed".
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peer_spark_streaming import CHILD_GRACE_S, DEFAULT_TRIGGER, PeerSpec, kill_tree, start_query

STARTED = "started"
STOP = "stop"
STOP_TIMEOUT_S = 120.0
"""How long the peer may take to stop its query and its session before its process tree is killed."""


def committed_batch_ids(checkpoint: str | Path) -> list[int]:
    """The batch ids the peer's checkpoint holds as committed (``commits/<id>``; Spark's temporary files,
    hidden or ``.tmp``, skipped), in order."""
    folder = Path(checkpoint) / "commits"
    if not folder.is_dir():
        return []
    return sorted(int(entry.name) for entry in folder.iterdir() if entry.name.isdigit())


def batch_end_offsets(checkpoint: str | Path, batch_id: int, topic: str) -> dict[int, int]:
    """The end offsets (exclusive) of one batch of the peer, by partition: ``offsets/<id>`` is a version line,
    the batch's metadata as JSON, then one JSON line per source (``{"topic": {"0": 123, ...}}``)."""
    lines = (Path(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise ValueError(f"{checkpoint}/offsets/{batch_id} is not a Structured Streaming offset log entry")
    offsets: Mapping[str, Any] = json.loads(lines[2]).get(topic, {})
    return {int(partition): int(offset) for partition, offset in offsets.items()}


def checkpoint_committed(checkpoint: str | Path, topic: str, shards: list[str]) -> dict[str, int | None]:
    """Each shard's (``topic:partition``) committed offset as the peer's checkpoint holds it: the end offset of
    its last committed batch (None before the first)."""
    ids = committed_batch_ids(checkpoint)
    ends = batch_end_offsets(checkpoint, ids[-1], topic) if ids else {}
    return {shard: ends.get(int(shard.rsplit(":", 1)[1])) for shard in shards}


def batches_committed_between(checkpoint: str | Path, since: float, until: float) -> int:
    """Batches whose commit was written in ``[since, until)`` (epoch seconds: the commit file's mtime)."""
    folder = Path(checkpoint) / "commits"
    count = 0
    for batch_id in committed_batch_ids(checkpoint):
        with contextlib.suppress(FileNotFoundError):  # purged by Spark meanwhile
            if since <= (folder / str(batch_id)).stat().st_mtime < until:
                count += 1
    return count


def _follow_main(conn: multiprocessing.connection.Connection, spec: PeerSpec) -> None:
    """The peer's process: a ``local[N]`` session and the query with the default trigger from
    ``spec.starting_offsets`` (None: earliest); answers ``STARTED``, runs until told ``STOP`` (or the query
    ends), then answers its batches and records, or its error as text."""
    import jobs.clickstream  # noqa: F401  # the example's function, imported before the query starts
    from dagster_streamgroup.spark.session import local_spark_session

    try:
        conf = {"spark.driver.memory": spec.driver_memory, "spark.ui.showConsoleProgress": "false"}
        spark = local_spark_session(
            master=f"local[{spec.parallelism}]", app_name="bench-peer-follow", conf={**conf, **spec.extra_conf}
        )
        try:
            query, batches = start_query(
                spark,
                spec.bootstrap,
                spec.topic,
                spec.output,
                spec.checkpoint,
                trigger=DEFAULT_TRIGGER,
                starting_offsets=spec.starting_offsets,
                max_offsets_per_trigger=spec.max_offsets_per_trigger,
                min_partitions=spec.min_partitions,
            )
            conn.send(STARTED)
            while query.isActive and not conn.poll(1.0):
                pass
            error = query.exception()
            query.stop()
        finally:
            spark.stop()
        if error is not None:
            raise RuntimeError(f"the peer's query failed: {error}")
        conn.send({"batches": len(batches.done), "records": batches.records})
    except BaseException as exc:
        conn.send(RuntimeError(f"{type(exc).__name__}: {exc}"))
        raise


@dataclass
class FollowingPeer:
    """The running peer: its process (its tree's CPU is the peer's) and its checkpoint."""

    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    spec: PeerSpec

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def committed(self, shards: list[str]) -> dict[str, int | None]:
        return checkpoint_committed(self.spec.checkpoint, self.spec.topic, shards)

    def check_alive(self) -> None:
        """Raise when the peer's process ended or its query failed while it should be following."""
        if self.conn.poll():
            answer = self.conn.recv()
            raise RuntimeError(f"the peer stopped following: {answer}")
        if not self.process.is_alive():
            raise RuntimeError(f"the peer's process exited ({self.process.exitcode})")


@contextlib.contextmanager
def following_peer(spec: PeerSpec, start_timeout_s: float = CHILD_GRACE_S) -> Iterator[FollowingPeer]:
    """The peer's query with the default trigger in a spawned process, from ``spec.starting_offsets``; yields
    once the query started, and on leaving asks it to stop (its tree is killed if it has not within
    ``STOP_TIMEOUT_S``). Leaving raises the peer's error if its query failed."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_follow_main, args=(child, spec), name="peer-follow", daemon=True)
    process.start()
    child.close()
    peer = FollowingPeer(process, parent, spec)
    try:
        if not parent.poll(start_timeout_s):
            raise TimeoutError(f"the peer's query did not start within {start_timeout_s:.0f} s")
        answer = parent.recv()
        if answer != STARTED:
            raise RuntimeError(f"the peer did not start: {answer}")
        yield peer
        parent.send(STOP)
        if not parent.poll(STOP_TIMEOUT_S):
            raise TimeoutError(f"the peer did not stop within {STOP_TIMEOUT_S:.0f} s")
        result = parent.recv()
        if isinstance(result, Exception):
            raise RuntimeError("the peer's query failed") from result
    finally:
        if process.is_alive():  # left early (an error): ask the query to stop before its tree is killed
            with contextlib.suppress(OSError, ValueError):
                parent.send(STOP)
        process.join(30)
        if process.is_alive():
            kill_tree(peer.pid)
            process.join(10)


def wait_committed(peer: FollowingPeer, highs: Mapping[str, int], timeout_s: float, interval_s: float = 1.0) -> float:
    """Wait until the peer's checkpoint has committed ``highs``; the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        peer.check_alive()
        committed = peer.committed(list(highs))
        if all((committed.get(shard) or 0) >= high for shard, high in highs.items()):
            return time.monotonic() - started
        time.sleep(interval_s)
    raise TimeoutError(f"the peer did not commit {sum(highs.values())} records within {timeout_s:.0f} s")
