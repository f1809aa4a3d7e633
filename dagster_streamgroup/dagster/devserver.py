"""A real Dagster deployment (daemon, webserver, code server) for end-to-end tests and benchmarks, over GraphQL.

Two layouts: ``dev``, ``dagster dev`` (its code server behind ``dagster code-server start``'s proxy, which
reloads it); ``services``, the processes a production host runs as services (Dagster's Helm chart and
docs/deploying.md): ``dagster api grpc`` serving the code location, and ``dagster-daemon run`` and
``dagster-webserver`` with a workspace that points at it (``grpc_server:``). Either is started in its own
session, under one root process, so signals reach the whole tree and it is stopped by process group; its
instance lives in a fresh DAGSTER_HOME with the project's dagster.yaml (per-shard run limit), its runs and
events in SQLite files there or, with ``DAGSTER_STORAGE=postgres``, in a temporary PostgreSQL server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml  # type: ignore[import-untyped]  # no types-PyYAML in the lock: yaml is a dependency of dagster

from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.dagster_storage import STORAGE_ENV, InstanceStorage, instance_storage, storage_kind
from dagster_streamgroup.local.kafka_broker import free_port

ROOT = Path(__file__).resolve().parents[2]
"""The project checkout: workspace.yaml, dagster.yaml and .venv/ of the example."""
T = TypeVar("T")
DEV_COMMAND = (str(ROOT / ".venv/bin/dagster"), "dev", "-h", "127.0.0.1")
Layout = Literal["dev", "services"]
SERVICES_SCRIPT = """
bin=$1 code_port=$2 code_file=$3 code_dir=$4 location=$5 workspace=$6 web_port=$7
env --default-signal=INT "$bin/dagster" api grpc -h 127.0.0.1 -p "$code_port" \\
  -f "$code_file" -d "$code_dir" --location-name "$location" &
code=$!
until (exec 3<>"/dev/tcp/127.0.0.1/$code_port") 2>/dev/null; do
  kill -0 "$code" 2>/dev/null || exit 1
  sleep 0.2
done
env --default-signal=INT "$bin/dagster-daemon" run -w "$workspace" &
daemon=$!
env --default-signal=INT "$bin/dagster-webserver" -h 127.0.0.1 -p "$web_port" -w "$workspace" &
web=$!
trap 'kill -INT "$code" "$daemon" "$web" 2>/dev/null' INT TERM
wait -n "$code" "$daemon" "$web"
status=$?
kill -INT "$code" "$daemon" "$web" 2>/dev/null
wait "$code" "$daemon" "$web"
exit "$status"
"""
"""The ``services`` layout's root: the code server first (the daemon and the webserver load the workspace once
at start), then the two services. When one of them exits, it stops the other two and exits, as ``dagster dev``
does, and on an interrupt it waits for the three to stop; run workers, not its children, finish their runs. A
shell's background commands start with SIGINT ignored, and Dagster's services then ignore SIGTERM too (they give
it SIGINT's handler): ``env --default-signal=INT`` gives each service SIGINT back, so an interrupt stops it as it
stops ``dagster dev``."""


@dataclass(frozen=True)
class CodeLocation:
    """The one ``python_file`` code location of a workspace file, as ``dagster api grpc`` serves it."""

    name: str
    python_file: str
    working_directory: Path

    @classmethod
    def of_workspace(cls, workspace: Path) -> CodeLocation:
        entries = yaml.safe_load(workspace.read_text())["load_from"]
        files = [e["python_file"] for e in entries if "python_file" in e]
        if len(entries) != 1 or len(files) != 1:
            raise ValueError(f"{workspace}: the services layout serves one python_file code location")
        entry = files[0] if isinstance(files[0], dict) else {"relative_path": files[0]}
        directory = workspace.parent / entry.get("working_directory", ".")
        return cls(entry.get("location_name", Path(entry["relative_path"]).stem), entry["relative_path"], directory)


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float, interval_s: float = 2.0) -> T:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception as exc:  # a poll that fails (server restarting) is retried until the deadline
            last = exc
            value = None
        if value is not None and value is not False:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s (last error: {last})")


def process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


class WebserverClient:
    """The GraphQL calls the tests and benchmarks make to a Dagster webserver at ``url``."""

    @property
    def url(self) -> str:
        raise NotImplementedError

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = json.loads(response.read())
        if payload.get("errors"):
            raise RuntimeError(payload["errors"])
        data = payload["data"]
        assert isinstance(data, dict)
        return data

    def runs(self) -> list[dict[str, Any]]:
        data = self.graphql(
            "{ runsOrError(limit: 100000) { ... on Runs { results { runId status creationTime startTime endTime"
            " tags { key value } } } } }"
        )
        runs = data["runsOrError"]["results"]
        for run in runs:
            run["tags"] = {t["key"]: t["value"] for t in run["tags"]}
        assert isinstance(runs, list)
        return runs

    def materializations(self, asset: str) -> list[dict[str, Any]]:
        data = self.graphql(
            """query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { ... on Asset {
                 assetMaterializations(limit: 10000) { partition runId timestamp metadataEntries { label
                   ... on IntMetadataEntry { intValue } ... on TextMetadataEntry { text }
                   ... on BoolMetadataEntry { boolValue } ... on FloatMetadataEntry { floatValue } } } } } }""",
            {"k": {"path": [asset]}},
        )
        out = []
        for m in data["assetOrError"]["assetMaterializations"]:
            meta = {}
            for e in m["metadataEntries"]:
                meta[e["label"]] = e.get("intValue", e.get("text", e.get("boolValue", e.get("floatValue"))))
            out.append({"partition": m["partition"], "runId": m["runId"], "at": float(m["timestamp"]) / 1000, **meta})
        return out


class DagsterDev(WebserverClient):
    def __init__(
        self,
        home: Path,
        env: Mapping[str, str],
        log: Path,
        *,
        storage: str | None = None,
        workspace: Path = ROOT / "workspace.yaml",
        layout: Layout = "dev",
    ) -> None:
        """``storage``: ``sqlite`` or ``postgres``; by default ``DAGSTER_STORAGE`` from ``env``, else from this
        process, else ``sqlite``. A PostgreSQL server lives until ``close()`` (or this object is collected, or
        the interpreter exits), not ``stop()``: ``dagster dev`` stopped and started again keeps its history."""
        self.home = home
        self.log = log
        self.port = free_port()
        self.workspace = workspace
        self.layout = layout
        self.proc: subprocess.Popen[bytes] | None = None
        kind = storage_kind(storage if storage is not None else env.get(STORAGE_ENV, os.environ.get(STORAGE_ENV)))
        resources = contextlib.ExitStack()
        self.storage: InstanceStorage = resources.enter_context(instance_storage(kind, home, ROOT / "dagster.yaml"))
        self._release = weakref.finalize(self, resources.close)
        self.env = {**os.environ, **env, **self.storage.env, "DAGSTER_HOME": str(home)}

    def __enter__(self) -> DagsterDev:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The root process's command line."""
        if self.layout == "dev":
            return [*DEV_COMMAND, "-w", str(self.workspace), "-p", str(self.port)]
        location = CodeLocation.of_workspace(self.workspace)
        code_port = free_port()
        workspace = self.home / "workspace-services.yaml"
        self.home.mkdir(parents=True, exist_ok=True)
        served = {"grpc_server": {"host": "127.0.0.1", "port": code_port, "location_name": location.name}}
        workspace.write_text(yaml.safe_dump({"load_from": [served]}))
        arguments = [
            str(ROOT / ".venv/bin"),
            str(code_port),
            location.python_file,
            str(location.working_directory.resolve()),
            location.name,
            str(workspace),
            str(self.port),
        ]
        return ["bash", "-c", SERVICES_SCRIPT, "dagster-services", *arguments]

    def start(self, timeout_s: float = 180.0) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        wait_for("the webserver and the sensor daemon", self._ready, timeout_s)

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the deployment ({self.layout}) exited with {self.proc.returncode}; see {self.log}")
        data = self.graphql("{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }")
        statuses = data["instance"]["daemonHealth"]["allDaemonStatuses"]
        return any(s["daemonType"] == "SENSOR" and s["healthy"] for s in statuses)

    def sensor(self, name: str, fields: str, location: str = "clickstream") -> dict[str, Any]:
        """``fields`` of the sensor ``name`` (a GraphQL selection on ``Sensor``)."""
        data = self.graphql(
            f"""query($s: SensorSelector!) {{ sensorOrError(sensorSelector: $s) {{ __typename
                 ... on Sensor {{ {fields} }} }} }}""",
            {"s": {"repositoryLocationName": location, "repositoryName": "__repository__", "sensorName": name}},
        )
        sensor = data["sensorOrError"]
        assert isinstance(sensor, dict)
        return sensor

    def stop_sensor(self, name: str, location: str = "clickstream") -> None:
        sensor = self.sensor(name, "jobOriginId sensorState { selectorId status }", location)
        result = self.graphql(
            """mutation($o: String!, $s: String!) { stopSensor(jobOriginId: $o, jobSelectorId: $s) { __typename
                 ... on StopSensorMutationResult { instigationState { status } } ... on PythonError { message } } }""",
            {"o": sensor["jobOriginId"], "s": sensor["sensorState"]["selectorId"]},
        )["stopSensor"]
        if result["__typename"] != "StopSensorMutationResult" or result["instigationState"]["status"] != "STOPPED":
            raise RuntimeError(f"stopping {name}: {result}")

    def start_sensor(self, name: str, location: str = "clickstream") -> None:
        selector = {"repositoryLocationName": location, "repositoryName": "__repository__", "sensorName": name}
        result = self.graphql(
            """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename
                 ... on Sensor { sensorState { status } } ... on PythonError { message } } }""",
            {"s": selector},
        )["startSensor"]
        if result["__typename"] != "Sensor" or result["sensorState"]["status"] != "RUNNING":
            raise RuntimeError(f"starting {name}: {result}")

    def daemon_pid(self) -> int:
        """The daemon: ``dagster dev``'s ``dagster._daemon run`` child, or the ``dagster-daemon run`` service."""
        assert self.proc is not None
        for pid in procfs.process_tree(self.proc.pid)[1:]:
            arguments = procfs.cmdline(pid)
            if b"dagster._daemon" in arguments or any(a.endswith(b"/dagster-daemon") for a in arguments):
                return pid
        raise RuntimeError(f"the daemon process of the deployment ({self.layout}) was not found")

    def kill_daemon_and_wait(self, timeout_s: float = 900.0) -> None:
        """SIGKILL the daemon. ``dagster dev`` notices and shuts its other services down; run workers already
        started are separate processes that finish their runs (as they would when a production daemon dies).
        Whatever is still alive after ``timeout_s`` is killed."""
        assert self.proc is not None
        pgid = self.proc.pid
        os.kill(self.daemon_pid(), signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(max(1.0, deadline - time.monotonic()))
        while time.monotonic() < deadline and process_group_alive(pgid):
            time.sleep(1.0)
        self.stop()

    def stop(self) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        """Stop ``dagster dev`` and the instance's PostgreSQL server, if any."""
        self.stop()
        self._release()
