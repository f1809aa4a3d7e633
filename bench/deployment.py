"""The example deployment as the run-economy benchmarks start it, and what they read back from it.

The example project (``definitions.py``, ``jobs/clickstream.py``, ``sensors/``) runs under ``dagster dev``
(``DagsterDev``) with the instance settings of the project's ``dagster.yaml``, on the local broker, its runs'
Spark on the local Spark Connect server (or a classic ``local[2]``). The benchmarks treat it as a black box:
they set the example's environment variables, produce records, and read the broker's watermarks, Kafka's
group offsets (the group mirrors its commits there) and the runs Dagster recorded, never the group's state
or the runs' tags, so they measure whatever run model and launcher the example uses.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.dagster.devserver import DagsterDev, wait_for
from dagster_streamgroup.streams.base import StreamBackend

ASSET = "page_views_per_minute"


@dataclass(frozen=True)
class ExampleSettings:
    """How the benchmarks start the example: the members and sensor timing of ``bench.e2e`` until now;
    ``max_records_per_run`` None keeps the example's own default."""

    members: int = 3
    heartbeat_s: float = 3.0
    session_timeout_s: float = 10.0
    max_records_per_run: int | None = None
    spark_master: str = "local[2]"
    spark_remote: str | None = None


def example_env(bootstrap: str, topic: str, group: str, output: Path, settings: ExampleSettings) -> dict[str, str]:
    """The example's environment (``jobs/settings.py``) for a Kafka topic on ``bootstrap``."""
    env = {
        "CLICKSTREAM_STREAM": "kafka",
        "CLICKSTREAM_BOOTSTRAP": bootstrap,
        "CLICKSTREAM_TOPIC": topic,
        "CLICKSTREAM_GROUP": group,
        "CLICKSTREAM_MEMBERS": str(settings.members),
        "CLICKSTREAM_HEARTBEAT_S": f"{settings.heartbeat_s:g}",
        "CLICKSTREAM_SESSION_TIMEOUT_S": f"{settings.session_timeout_s:g}",
        "CLICKSTREAM_OUTPUT": str(output),
        "CLICKSTREAM_SPARK_MASTER": settings.spark_master,
    }
    if settings.max_records_per_run is not None:
        env["CLICKSTREAM_MAX_RECORDS_PER_RUN"] = str(settings.max_records_per_run)
    if settings.spark_remote is not None:
        env["CLICKSTREAM_SPARK_REMOTE"] = settings.spark_remote
    return env


@dataclass
class Deployment:
    """A running example: its ``dagster dev``, the topic's shards, and the broker-side view of the group."""

    dev: DagsterDev
    env: dict[str, str]
    group: str
    backend: StreamBackend
    shards: list[str]
    ready_s: float
    startup_s: float

    @property
    def pid(self) -> int:
        assert self.dev.proc is not None
        return self.dev.proc.pid

    def highs(self) -> dict[str, int]:
        return {shard: marks.high for shard, marks in self.backend.watermarks(self.shards).items()}

    def committed(self) -> dict[str, int | None]:
        return self.backend.committed(self.group, self.shards)

    def wait_committed(self, what: str, highs: Mapping[str, int], timeout_s: float) -> float:
        """Wait until Kafka's group offsets reach ``highs``; the seconds it took."""
        started = time.perf_counter()
        wait_for(what, lambda: self.committed() == dict(highs), timeout_s, 1.0)
        return time.perf_counter() - started

    def runs_created(self, since: float, until: float | None = None) -> list[dict[str, Any]]:
        """Runs Dagster created in ``[since, until)`` (epoch seconds), with their run-record times
        (``creationTime`` is the record's create_timestamp, ``startTime`` its start_time)."""
        return [
            run
            for run in self.dev.runs()
            if run["creationTime"] >= since and (until is None or run["creationTime"] < until)
        ]


@contextlib.contextmanager
def running_example(
    bootstrap: str, topic: str, work: Path, settings: ExampleSettings, timeout_s: float
) -> Iterator[Deployment]:
    """``dagster dev`` with the example on ``topic``, a fresh instance and group; yields once every member
    heartbeats and every shard has an owner (read from the group's state store, for this readiness check
    only: the broker cannot tell)."""
    group = f"bench_{uuid.uuid4().hex[:8]}"
    home = work / "home"
    env = example_env(bootstrap, topic, group, work / "output", settings)
    resource = KafkaStreamGroup(
        group=group,
        bootstrap_servers=bootstrap,
        topics=[topic],
        store_url=f"sqlite:///{home / 'streamgroup-state.db'}",
        heartbeat_interval_s=settings.heartbeat_s,
        session_timeout_s=settings.session_timeout_s,
    )
    backend = resource.backend()
    shards = backend.shards()

    def shared() -> bool:
        state = resource.member("bench").load()
        return (
            state is not None
            and len(state.members) == settings.members
            and len(state.shards) == len(shards)
            and all(shard.owner is not None for shard in state.shards.values())
        )

    dev = DagsterDev(home, env, work / "dagster-dev.log")
    started = time.perf_counter()
    try:
        dev.start()
        ready_s = time.perf_counter() - started
        wait_for("the members to share the shards", shared, timeout_s, 1.0)
        startup_s = time.perf_counter() - started
        print(f"dagster dev ready after {ready_s:.1f} s, shards shared after {startup_s:.1f} s", flush=True)
        yield Deployment(dev, env, group, backend, shards, ready_s, startup_s)
    finally:
        dev.close()


def launch_seconds(runs: list[dict[str, Any]]) -> list[float]:
    """Run created to run started (the run process reported itself started), for the runs that started."""
    return [run["startTime"] - run["creationTime"] for run in runs if run.get("startTime")]


def run_timings(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Where a run's time goes, as Dagster recorded it: queued (created until its process started) and
    running (process start until it ended), medians over the finished runs."""
    finished = [r for r in runs if r.get("startTime") and r.get("endTime")]
    if not finished:
        return {}
    return {
        "queued": round(statistics.median(r["startTime"] - r["creationTime"] for r in finished), 2),
        "running": round(statistics.median(r["endTime"] - r["startTime"] for r in finished), 2),
    }


def statuses(runs: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for run in runs:
        out[run["status"]] = out.get(run["status"], 0) + 1
    return out
