"""The example deployment as the run-economy benchmarks start it, and what they read back from it.

The example project (``definitions.py``, ``jobs/clickstream.py``, ``sensors/``) runs in a Dagster deployment
(``DagsterDev``: ``dagster dev``, or a production host's services) with the instance settings of the project's
``dagster.yaml``, on the local broker, its runs' Spark on the local Spark Connect server (or a classic
``local[2]``). The benchmarks treat it as a black box:
they set the example's environment variables, produce records, and read the broker's watermarks, Kafka's
group offsets (the group mirrors its commits there) and the runs Dagster recorded, never the runs' tags, so
they measure whatever run model and launcher the example uses. They read the group's state only to check the
conditions of a measurement, never for a figure: at start, that every member holds shards; around a pause of
the member sensors (``bench.e2e``), that the group kept its members.

They may stop and start the member sensors over GraphQL, as a user does in the UI. A member sensor makes a
peer that is stopped in Dagster leave the group at its next tick, so the benchmarks stop (and start) all of
them in one request, whose mutations run one after another within milliseconds, between two of the daemon's
passes over the sensors.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.dagster.devserver import DagsterDev, Layout, wait_for
from dagster_streamgroup.dagster.resources import DAEMON_LOOP_S, TICK_WAIT_MARGIN_S
from dagster_streamgroup.dagster.sensors import DEPLOYMENT_ENV
from dagster_streamgroup.protocol.state import EventKind
from dagster_streamgroup.streams.base import StreamBackend

ASSET = "page_views_per_minute"
"""The stream asset with the example's Parquet sink (``CLICKSTREAM_SINK=parquet``)."""
DELTA_ASSET = "clicks"
"""The stream asset with its Delta sink (``CLICKSTREAM_SINK=delta``)."""
LOCATION = "clickstream"
"""The example's code location (``workspace.yaml``)."""
REPOSITORY = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__"}
SENSORS = """query($r: RepositorySelector!) { repositoryOrError(repositorySelector: $r) { __typename
  ... on Repository { sensors { name jobOriginId
    sensorState { selectorId status ticks(limit: 1) { status timestamp } } } } } }"""
STOP_FIELD = """s{i}: stopSensor(jobOriginId: $o{i}, jobSelectorId: $s{i}) { __typename
  ... on StopSensorMutationResult { instigationState { status } } ... on PythonError { message } }"""
START_FIELD = """s{i}: startSensor(sensorSelector: $s{i}) { __typename
  ... on Sensor { sensorState { status } } ... on PythonError { message } }"""


@dataclass(frozen=True)
class SensorView:
    """A sensor as GraphQL shows it: what stopping it needs, its status, and its latest tick."""

    origin_id: str
    selector_id: str
    status: str
    tick_status: str | None
    tick_at: float | None


HEARTBEAT_S = 3.0
SESSION_TIMEOUT_S = 2 * max(HEARTBEAT_S, DAEMON_LOOP_S) + TICK_WAIT_MARGIN_S
"""The shortest session the member sensors accept with the tick's wait (11.5 s): two daemon passes and the
room for a tick that overran its pass. The benchmarks used 10 s before the sensors checked this."""


def views_sensor_name(group: str) -> str:
    """The automation sensor of the example's page views (``jobs/clickstream.py``, with the Delta sink)."""
    return f"{group}_page_views"


@dataclass(frozen=True)
class ExampleSettings:
    """How the benchmarks start the example: the members and sensor timing of ``bench.e2e`` until now;
    ``max_records_per_run`` None keeps the example's own default."""

    members: int = 3
    heartbeat_s: float = HEARTBEAT_S
    session_timeout_s: float = SESSION_TIMEOUT_S
    max_records_per_run: int | None = None
    spark_master: str = "local[2]"
    spark_remote: str | None = None
    deployment: str | None = None
    """``STREAMGROUP_DEPLOYMENT``: the members' ids then do not depend on the instance's storage id."""
    layout: Layout = "dev"
    """How Dagster runs (``DagsterDev``): ``dev``, ``dagster dev``; ``services``, a production host's
    ``dagster api grpc``, ``dagster-daemon run`` and ``dagster-webserver``."""
    sink: str = "parquet"
    """``CLICKSTREAM_SINK``: ``parquet`` (per-range partials, one folder per range) or ``delta`` (each click's row in
    a Delta table; the downstream page views' automation sensor is stopped: the benchmarks time the stream)."""

    @property
    def asset(self) -> str:
        """The stream asset, whose materializations are the committed ranges."""
        return DELTA_ASSET if self.sink == "delta" else ASSET


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
        "CLICKSTREAM_SINK": settings.sink,
    }
    if settings.max_records_per_run is not None:
        env["CLICKSTREAM_MAX_RECORDS_PER_RUN"] = str(settings.max_records_per_run)
    if settings.spark_remote is not None:
        env["CLICKSTREAM_SPARK_REMOTE"] = settings.spark_remote
    if settings.deployment is not None:
        env[DEPLOYMENT_ENV] = settings.deployment
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
    resource: KafkaStreamGroup
    members: int

    @property
    def pid(self) -> int:
        assert self.dev.proc is not None
        return self.dev.proc.pid

    def highs(self) -> dict[str, int]:
        return {shard: marks.high for shard, marks in self.backend.watermarks(self.shards).items()}

    def committed(self) -> dict[str, int | None]:
        return self.backend.committed(self.group, self.shards)

    def wait_committed(self, what: str, highs: Mapping[str, int], timeout_s: float, interval_s: float = 1.0) -> float:
        """Wait until Kafka's group offsets reach ``highs``; the seconds it took (to within ``interval_s``)."""
        started = time.perf_counter()
        wait_for(what, lambda: self.committed() == dict(highs), timeout_s, interval_s)
        return time.perf_counter() - started

    def shared(self) -> bool:
        """Every member heartbeats and every shard has an owner (the group's state: a condition, not a figure)."""
        state = self.resource.member("bench").load()
        return (
            state is not None
            and len(state.members) == self.members
            and len(state.shards) == len(self.shards)
            and all(shard.owner is not None for shard in state.shards.values())
        )

    def membership_changes(self, since: float) -> list[str]:
        """Members that left or were evicted since ``since`` (epoch seconds), from the group's events."""
        state = self.resource.member("bench").load()
        kinds = (EventKind.LEFT, EventKind.EVICTED)
        return (
            []
            if state is None
            else [f"{e.kind} {e.member_id}" for e in state.events if e.kind in kinds and e.at >= since]
        )

    def sensors(self) -> dict[str, SensorView]:
        """The example's member sensors over GraphQL, as a user sees them (with the Delta sink the example also
        has the page views' automation sensor, which ``running_example`` stops: it is left out here)."""
        return {name: view for name, view in self.all_sensors().items() if name != views_sensor_name(self.group)}

    def all_sensors(self) -> dict[str, SensorView]:
        data = self.dev.graphql(SENSORS, {"r": REPOSITORY})["repositoryOrError"]
        if data["__typename"] != "Repository":
            raise RuntimeError(f"the example's repository: {data}")
        out = {}
        for sensor in data["sensors"]:
            state = sensor["sensorState"]
            tick = state["ticks"][0] if state["ticks"] else {}
            out[sensor["name"]] = SensorView(
                sensor["jobOriginId"], state["selectorId"], state["status"], tick.get("status"), tick.get("timestamp")
            )
        return out

    def after_a_pass(self, names: Sequence[str], timeout_s: float) -> None:
        """Return just after the daemon's next pass over the running sensors ``names`` has ended: each has a
        newer tick than now, and none is in progress. The next pass is then most of a loop (5 s) away."""
        before = self.all_sensors()

        def passed() -> bool:
            now = self.all_sensors()
            for name in names:
                at, was = now[name].tick_at, before[name].tick_at
                if at is None or (was is not None and at <= was) or now[name].tick_status == "STARTED":
                    return False
            return True

        wait_for("a pass of the daemon over the sensors", passed, timeout_s, 0.2)

    def stop_sensors(self, names: Sequence[str], timeout_s: float, *, after_a_pass: bool = True) -> None:
        """Stop the sensors in one request, just after a pass of the daemon (unless ``after_a_pass`` is false),
        then wait until none has a tick in progress (a tick begun before the stop goes on and may still request
        runs)."""
        if after_a_pass:
            self.after_a_pass(names, timeout_s)
        views = self.all_sensors()
        fields, variables, types = [], {}, []
        for i, name in enumerate(names):
            fields.append(STOP_FIELD.replace("{i}", str(i)))
            variables[f"o{i}"], variables[f"s{i}"] = views[name].origin_id, views[name].selector_id
            types.append(f"$o{i}: String!, $s{i}: String!")
        result = self.dev.graphql(f"mutation({', '.join(types)}) {{ {' '.join(fields)} }}", variables)
        for i, name in enumerate(names):
            answer = result[f"s{i}"]
            if answer["__typename"] != "StopSensorMutationResult" or answer["instigationState"]["status"] != "STOPPED":
                raise RuntimeError(f"stopping sensor {name}: {answer}")

        def quiet() -> bool:
            now = self.all_sensors()
            return all(now[n].status == "STOPPED" and now[n].tick_status != "STARTED" for n in names)

        wait_for("the stopped sensors' last ticks to end", quiet, timeout_s, 0.5)

    def start_sensors(self, names: Sequence[str]) -> None:
        """Start the sensors in one request (the daemon evaluates them at its next pass over the sensors)."""
        fields = [START_FIELD.replace("{i}", str(i)) for i in range(len(names))]
        types = [f"$s{i}: SensorSelector!" for i in range(len(names))]
        variables = {f"s{i}": {**REPOSITORY, "sensorName": name} for i, name in enumerate(names)}
        result = self.dev.graphql(f"mutation({', '.join(types)}) {{ {' '.join(fields)} }}", variables)
        for i, name in enumerate(names):
            answer = result[f"s{i}"]
            if answer.get("__typename") != "Sensor" or answer["sensorState"]["status"] != "RUNNING":
                raise RuntimeError(f"starting sensor {name}: {answer}")

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
    bootstrap: str,
    topic: str,
    work: Path,
    settings: ExampleSettings,
    timeout_s: float,
    before_start: Callable[[KafkaStreamGroup], object] | None = None,
) -> Iterator[Deployment]:
    """``dagster dev`` with the example on ``topic``, a fresh instance and group; yields once every member
    heartbeats and every shard has an owner (read from the group's state store, for this readiness check
    only: the broker cannot tell). ``before_start``: what to do with the group before Dagster starts (give it a
    history, ``bench.backfill``)."""
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
    if before_start is not None:
        before_start(resource)
    dev = DagsterDev(home, env, work / "dagster-dev.log", layout=settings.layout)
    example = Deployment(dev, env, group, backend, shards, 0.0, 0.0, resource, settings.members)
    started = time.perf_counter()
    try:
        dev.start()
        example.ready_s = time.perf_counter() - started
        wait_for("the members to share the shards", example.shared, timeout_s, 1.0)
        if settings.sink == "delta":  # the benchmarks time the stream: no page views refresh among its runs
            example.stop_sensors([views_sensor_name(group)], timeout_s, after_a_pass=False)
        example.startup_s = time.perf_counter() - started
        print(
            f"the deployment ({settings.layout}) ready after {example.ready_s:.1f} s,"
            f" shards shared after {example.startup_s:.1f} s",
            flush=True,
        )
        yield example
    finally:
        dev.close()


def launch_seconds(runs: list[dict[str, Any]]) -> list[float]:
    """Run created to run started (the run process reported itself started), for the runs that started."""
    return [queued_s(run) for run in runs if run.get("startTime")]


def finished_runs(runs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The runs Dagster recorded both a start and an end for."""
    return [r for r in runs if r.get("startTime") and r.get("endTime")]


def queued_s(run: Mapping[str, Any]) -> float:
    """Created until its process started."""
    return float(run["startTime"] - run["creationTime"])


def running_s(run: Mapping[str, Any]) -> float:
    """Its process started until it ended."""
    return float(run["endTime"] - run["startTime"])


def run_timings(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Where a run's time goes, as Dagster recorded it: queued (created until its process started) and
    running (process start until it ended), medians over the finished runs."""
    finished = finished_runs(runs)
    if not finished:
        return {}
    return {
        "queued": round(statistics.median(queued_s(r) for r in finished), 2),
        "running": round(statistics.median(running_s(r) for r in finished), 2),
    }


def statuses(runs: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for run in runs:
        out[run["status"]] = out.get(run["status"], 0) + 1
    return out
