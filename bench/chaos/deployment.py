"""The chaos deployment: every server it runs on, started once and restartable one by one.

Apache Kafka (one KRaft node on a data directory) -> PostgreSQL (the group state) -> Spark Connect server ->
``dagster dev`` (daemon, webserver, code server) with ``bench/chaos/definitions.py``, the project's instance
settings (``dagster.yaml``: queued runs, at most one run per shard) and the project's ``ForkServerRunLauncher``
(run monitoring fails a run whose worker was SIGKILLed within seconds; Dagster's default launcher cannot tell,
and a killed run would hold its ranges until ``max_runtime_seconds``), as ``bench.chaos.launcher``'s subclass
whose launches raise while the ``launcher_outage`` fault's file exists.

Two groups share the code location: the main one (``group_name`` on ``topic``) and a small second one
(``second_group`` on ``second_topic``), each with its own member sensors and asset. Every process of ``dagster
dev`` gets ``STREAMGROUP_CHAOS_PAUSE_FILE`` (``dagster_streamgroup.stores.pause_hook``), so the
``store_writer_pause`` fault can hold one of their state writes between its load and its save.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # a dependency of dagster, without types in the lock

from bench.chaos.services import RestartablePostgres, kill_group
from bench.chaos.settings import ASSET, SECOND_ASSET, STORE_URL_ENV
from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.dagster.devserver import ROOT, DagsterDev, wait_for
from dagster_streamgroup.dagster.sensors import member_sensor_names
from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.kafka_broker import LocalKafka
from dagster_streamgroup.local.kafka_data import create_topics
from dagster_streamgroup.local.spark_connect import ConnectServer, ConnectServerSettings, free_port
from dagster_streamgroup.stores.pause_hook import PAUSE_FILE_ENV

HERE = Path(__file__).resolve().parent
WORKSPACE = HERE / "workspace.yaml"
DEFINITIONS = HERE / "definitions.py"
LOCATION = "chaos"


@dataclass(frozen=True)
class GroupSettings:
    """The group's timing and retry policy, as the chaos deployment's resource gets it."""

    partitions: int = 16
    members: int = 3
    heartbeat_s: float = 5.0
    session_timeout_s: float = 20.0
    drain_timeout_s: float = 40.0
    max_records_per_run: int = 200_000
    min_backlog: int = 5_000
    max_wait_s: float = 5.0
    max_attempts: int = 2
    after_max_attempts: str = "park"
    carry_on_s: float = 0.0
    second_partitions: int = 3
    """The second group's topic (``two_groups``): a few partitions, fewer members than the main group."""
    second_members: int = 2
    sinks: bool = False
    """The main group's runs also write into a Delta table and an output topic (``bench.chaos.sinks``)."""


SENSOR_WORKERS = 8
"""The sensor daemon's threads: more than the code location's member sensors (both groups'), so members may
wait in their tick for a run to end (``tick_wait_s``) as they do with one group and the project's 4."""


def instance_yaml(outage_file: Path) -> str:
    """The project's instance settings with the fork-server run launcher (as the chaos subclass that refuses
    launches while ``outage_file`` exists, with the project's launcher settings), a faster monitoring poll and a
    sensor thread for every member."""
    settings: dict[str, Any] = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    launcher_config = (settings.get("run_launcher") or {}).get("config") or {}
    settings["run_launcher"] = {
        "module": "bench.chaos.launcher",
        "class": "OutageRunLauncher",
        "config": {**launcher_config, "outage_file": str(outage_file)},
    }
    settings["sensors"] = {**(settings.get("sensors") or {}), "use_threads": True, "num_workers": SENSOR_WORKERS}
    settings["run_monitoring"] = {
        "enabled": True,
        "poll_interval_seconds": 2,
        "start_timeout_seconds": 180,
        "max_runtime_seconds": 1800,
    }
    return str(yaml.safe_dump(settings))


@dataclass
class ChaosDeployment:
    work: Path
    group: GroupSettings
    topic: str = field(default_factory=lambda: f"chaos-{uuid.uuid4().hex[:8]}")
    group_name: str = field(default_factory=lambda: f"chaos_{uuid.uuid4().hex[:8]}")
    second_topic: str = field(default_factory=lambda: f"chaos-second-{uuid.uuid4().hex[:8]}")
    second_group: str = field(default_factory=lambda: f"chaos_second_{uuid.uuid4().hex[:8]}")
    sink_topic: str = field(default_factory=lambda: f"chaos-out-{uuid.uuid4().hex[:8]}")
    broker: LocalKafka = field(init=False)
    postgres: RestartablePostgres = field(init=False)
    connect: ConnectServer = field(init=False)
    dev: DagsterDev = field(init=False)
    old_process_groups: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.records_dir = self.work / "function"
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.faults_dir = self.work / "faults"
        """Where the faults' switches live: the launcher's outage file, the store writers' pause file."""
        self.faults_dir.mkdir(exist_ok=True)
        self.broker = LocalKafka(self.work / "kafka", fast_housekeeping=False)
        self.postgres = RestartablePostgres()
        connect_scratch = self.work / "spark-connect"
        connect_scratch.mkdir(exist_ok=True)
        self.connect = ConnectServer(
            free_port(),
            ConnectServerSettings(master="local[2]", driver_memory="1g", rss_limit_mb=None),
            connect_scratch,
        )

    # The servers, in dependency order.

    def start(self) -> None:
        self.broker.start()
        topics = {self.topic: self.group.partitions, self.second_topic: self.group.second_partitions}
        if self.group.sinks:
            topics[self.sink_topic] = self.group.partitions
        create_topics(self.broker.bootstrap, topics)
        self.postgres.init()
        self.connect.start()
        self.dev = DagsterDev(self.work / "home", self.env(), self.work / "dagster-dev.log", workspace=WORKSPACE)
        (self.work / "home" / "dagster.yaml").write_text(instance_yaml(self.outage_file))
        self.dev.start()

    @property
    def outage_file(self) -> Path:
        """While it exists, every launch raises (``bench.chaos.launcher``)."""
        return self.faults_dir / "launcher-outage"

    @property
    def pause_file(self) -> Path:
        """While it exists, the first state write to claim it is held (``stores.pause_hook``)."""
        return self.faults_dir / "store-pause"

    def env(self) -> dict[str, str]:
        g = self.group
        return {
            "CHAOS_BOOTSTRAP": self.broker.bootstrap,
            "CHAOS_TOPIC": self.topic,
            "CHAOS_GROUP": self.group_name,
            "CHAOS_SPARK_REMOTE": self.connect.remote,
            "CHAOS_WORK_DIR": str(self.records_dir),
            "CHAOS_MEMBERS": str(g.members),
            "CHAOS_HEARTBEAT_S": f"{g.heartbeat_s:g}",
            "CHAOS_SESSION_TIMEOUT_S": f"{g.session_timeout_s:g}",
            "CHAOS_DRAIN_TIMEOUT_S": f"{g.drain_timeout_s:g}",
            "CHAOS_MAX_RECORDS_PER_RUN": str(g.max_records_per_run),
            "CHAOS_MIN_BACKLOG": str(g.min_backlog),
            "CHAOS_MAX_WAIT_S": f"{g.max_wait_s:g}",
            "CHAOS_MAX_ATTEMPTS": str(g.max_attempts),
            "CHAOS_CARRY_ON_S": f"{g.carry_on_s:g}",
            "CHAOS_AFTER_MAX_ATTEMPTS": g.after_max_attempts,
            "CHAOS_SECOND_TOPIC": self.second_topic,
            "CHAOS_SECOND_GROUP": self.second_group,
            "CHAOS_SECOND_MEMBERS": str(g.second_members),
            **({"CHAOS_SINK_TOPIC": self.sink_topic} if g.sinks else {}),
            PAUSE_FILE_ENV: str(self.pause_file),
            STORE_URL_ENV: self.postgres.url,
            "PYTHONPATH": str(ROOT),
        }

    def resource(self, second: bool = False) -> KafkaStreamGroup:
        """A group's resource as the deployment has it (the main group's, or with ``second`` the second group's),
        for the checks made from outside (state, offsets)."""
        g = self.group
        return KafkaStreamGroup(
            group=self.second_group if second else self.group_name,
            bootstrap_servers=self.broker.bootstrap,
            topics=[self.second_topic if second else self.topic],
            store_url=self.postgres.url,
            heartbeat_interval_s=g.heartbeat_s,
            session_timeout_s=g.session_timeout_s,
            drain_timeout_s=g.drain_timeout_s,
            max_attempts=g.max_attempts,
            after_max_attempts=g.after_max_attempts,
        )

    def sensors(self) -> list[str]:
        """The main group's member sensors (the faults on sensors act on these)."""
        return member_sensor_names(self.group_name, self.group.members)

    def shards(self, second: bool = False) -> list[str]:
        if second:
            return [f"{self.second_topic}:{p}" for p in range(self.group.second_partitions)]
        return [f"{self.topic}:{p}" for p in range(self.group.partitions)]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.dev.close()
        for pgid in self.old_process_groups:  # run workers of a dagster dev that was restarted
            kill_group(pgid)
        with contextlib.suppress(Exception):
            self.connect.stop()
        self.postgres.remove()
        self.broker.stop()

    # Faults on the servers.

    def restart_dagster_after_daemon_kill(self, timeout_s: float = 180.0) -> None:
        """SIGKILL the daemon: ``dagster dev`` shuts its other services down; runs already started go on
        (their workers are separate processes). Then ``dagster dev`` starts again on the same instance."""
        assert self.dev.proc is not None
        old = self.dev.proc
        os.kill(self.dev.daemon_pid(), signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            old.wait(timeout_s)
        self.old_process_groups.append(old.pid)
        if old.poll() is None:  # it did not notice: stop what is left of its services, not the runs
            old.send_signal(signal.SIGKILL)
            old.wait(30)
        self.dev.proc = None
        self.dev.start()

    def grpc_server_pids(self) -> list[int]:
        """The code location's gRPC server(s) (``dagster api grpc``, run by the ``code-server`` proxy)."""
        assert self.dev.proc is not None
        return [pid for pid in procfs.process_tree(self.dev.proc.pid) if is_grpc_server(procfs.cmdline(pid))]

    def restart_code_server(self, timeout_s: float = 180.0) -> int:
        """SIGKILL the code location's gRPC server, then reload the location over GraphQL (the UI's Reload),
        which makes ``dagster dev``'s proxy start a new one (it does not by itself). Returns the killed PID."""
        pids = self.grpc_server_pids()
        if not pids:
            raise RuntimeError("no gRPC code server under dagster dev")
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(RuntimeError, OSError):
                self.reload_location()
            try:
                self.wait_location_loaded(min(30.0, max(1.0, deadline - time.monotonic())))
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
        return pids[0]

    def kill_connect_server(self) -> None:
        kill_group(self.connect.pid)

    def restart_connect_server(self) -> None:
        self.connect.restart()

    def graphql_sensor(self, name: str) -> dict[str, Any]:
        data = self.dev.graphql(
            """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) { __typename
                 ... on Sensor { jobOriginId sensorState { selectorId status } } } }""",
            {"s": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "sensorName": name}},
        )
        sensor: dict[str, Any] = data["sensorOrError"]
        if sensor.get("__typename") != "Sensor":
            raise RuntimeError(f"sensor {name}: {sensor}")
        return sensor

    def stop_sensor(self, name: str) -> None:
        self.dev.stop_sensor(name, location=LOCATION)

    def start_sensor(self, name: str) -> None:
        result = self.dev.graphql(
            """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename
                 ... on Sensor { sensorState { status } } ... on PythonError { message } } }""",
            {"s": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "sensorName": name}},
        )["startSensor"]
        if result.get("__typename") != "Sensor" or result["sensorState"]["status"] != "RUNNING":
            raise RuntimeError(f"starting {name}: {result}")

    def reload_location(self) -> dict[str, Any]:
        result: dict[str, Any] = self.dev.graphql(
            """mutation($l: String!) { reloadRepositoryLocation(repositoryLocationName: $l) { __typename
                 ... on WorkspaceLocationEntry { locationOrLoadError { __typename } } } }""",
            {"l": LOCATION},
        )["reloadRepositoryLocation"]
        return result

    def wait_location_loaded(self, timeout_s: float = 180.0) -> None:
        def loaded() -> bool:
            data = self.dev.graphql(
                "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
                "locationOrLoadError { __typename } } } } }"
            )
            entries = data["workspaceOrError"]["locationEntries"]
            return any(
                e["name"] == LOCATION
                and e["loadStatus"] == "LOADED"
                and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
                for e in entries
            )

        wait_for("the code location to load", loaded, timeout_s, 1.0)

    def failure_messages(self, run_id: str) -> list[str]:
        """Why a run failed, as Dagster recorded it: its step failures' errors and run failure events."""
        data = self.dev.graphql(
            """query($id: ID!) { runOrError(runId: $id) { ... on Run { eventConnection(limit: 1000) { events {
                 __typename ... on MessageEvent { message }
                 ... on ExecutionStepFailureEvent { error { message cause { message cause { message } } } } }
                 } } } }""",
            {"id": run_id},
        )
        events = data["runOrError"].get("eventConnection", {}).get("events", [])
        out = []
        for event in events:
            error = event.get("error") if event["__typename"] == "ExecutionStepFailureEvent" else None
            while error:  # Dagster wraps the user's exception: its cause holds the message
                out.append(error["message"])
                error = error.get("cause")
            if event["__typename"] in {"RunFailureEvent", "EngineEvent"} and "killed" in event.get("message", ""):
                out.append(event["message"])
        return out

    def materializations(self, second: bool = False) -> list[dict[str, Any]]:
        return self.dev.materializations(SECOND_ASSET if second else ASSET)

    def wait_members(self, timeout_s: float = 180.0) -> None:
        """Until each group's members share its shards."""
        groups = [
            (self.resource(), self.group.members, self.group.partitions),
            (self.resource(second=True), self.group.second_members, self.group.second_partitions),
        ]

        def shared() -> bool:
            for resource, members, partitions in groups:
                state = resource.member("chaos-observer").load()
                if (
                    state is None
                    or len(state.members) != members
                    or len(state.shards) != partitions
                    or any(s.owner is None for s in state.shards.values())
                ):
                    return False
            return True

        wait_for("the members of both groups to share their shards", shared, timeout_s, 1.0)


def is_grpc_server(args: list[bytes]) -> bool:
    """``python -m dagster api grpc ...``"""
    return any(args[i : i + 4] == [b"-m", b"dagster", b"api", b"grpc"] for i in range(len(args)))


def elapsed(since: float) -> float:
    return round(time.monotonic() - since, 1)
