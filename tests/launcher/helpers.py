"""A real Dagster deployment for the launcher tests: an instance on SQLite in a temporary DAGSTER_HOME and the
test code location served by a real code server (gRPC), runs launched through the same GraphQL mutation the
UI uses."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import dagster as dg
import yaml
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql, infer_job_selector

from dagster_streamgroup.launcher import RunWorker
from dagster_streamgroup.local import procfs

LOCATION_SOURCE = Path(__file__).parent / "location"
LOCATION = "launcher_tests"
FORK_LAUNCHER = {"module": "dagster_streamgroup.launcher", "class": "ForkServerRunLauncher"}
PYTHON = sys.executable
SUCCESS = {dg.DagsterRunStatus.SUCCESS}
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def copy_location(target: Path) -> Path:
    """A copy of the test code location that a test may edit."""
    shutil.copytree(LOCATION_SOURCE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def instance_yaml(
    *,
    launcher: Mapping[str, Any] | None = FORK_LAUNCHER,
    launcher_config: Mapping[str, Any] | None = None,
    queued: bool = False,
    monitoring_poll_s: float | None = None,
    coordinator: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    settings: dict[str, Any] = {"telemetry": {"enabled": False}, **(extra or {})}
    if coordinator is not None:
        settings["run_coordinator"] = dict(coordinator)
    elif queued:
        settings["run_coordinator"] = {
            "module": "dagster._core.run_coordinator",
            "class": "QueuedRunCoordinator",
            "config": {"dequeue_interval_seconds": 1},
        }
    else:
        settings["run_coordinator"] = {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}
    if launcher is not None:
        settings["run_launcher"] = {**launcher, **({"config": dict(launcher_config)} if launcher_config else {})}
    if monitoring_poll_s is not None:
        settings["run_monitoring"] = {"enabled": True, "poll_interval_seconds": monitoring_poll_s}
    return yaml.safe_dump(settings)


class Deployment:
    """The instance and a workspace of the code location in this process (launches happen here, as in a
    webserver with Dagster's DefaultRunCoordinator)."""

    def __init__(self, home: Path, location: Path, yaml_text: str) -> None:
        home.mkdir(parents=True, exist_ok=True)
        (home / "dagster.yaml").write_text(yaml_text)
        self.home = home
        self.location = location
        self._stack = ExitStack()
        self.instance = self._stack.enter_context(dg.DagsterInstance.from_config(str(home)))
        self.workspace = self._stack.enter_context(
            WorkspaceProcessContext(self.instance, WorkspaceFileTarget(paths=[str(location / "workspace.yaml")]))
        )

    def close(self) -> None:
        self.instance.run_launcher.dispose()
        self._stack.close()

    def launch(self, job: str, tags: Mapping[str, str] | None = None) -> str:
        context = self.workspace.create_request_context()
        params = {
            "selector": infer_job_selector(context, job, location_name=LOCATION),
            "runConfigData": {},
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        }
        result = execute_dagster_graphql(context, LAUNCH_PIPELINE_EXECUTION_MUTATION, {"executionParams": params})
        launched = result.data["launchPipelineExecution"]
        if launched["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launching {job}: {launched}")
        run_id = launched["run"]["runId"]
        assert isinstance(run_id, str)
        return run_id

    def run(self, run_id: str) -> dg.DagsterRun:
        run = self.instance.get_run_by_id(run_id)
        assert run is not None
        return run

    def wait(self, run_id: str, statuses: set[dg.DagsterRunStatus], timeout_s: float = 300.0) -> dg.DagsterRun:
        return wait_until(f"run {run_id} in {statuses}", lambda: _in(self.run(run_id), statuses), timeout_s)

    def worker(self, run_id: str) -> RunWorker:
        worker = wait_until(f"the worker tag of {run_id}", lambda: RunWorker.from_tags(self.run(run_id).tags), 60)
        return worker

    def messages(self, run_id: str) -> list[str]:
        return [
            (r.dagster_event.message or "") if r.dagster_event else r.user_message
            for r in self.instance.all_logs(run_id)
        ]

    def materialization(self, run_id: str) -> dict[str, Any]:
        for record in self.instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
            assert record.dagster_event is not None
            materialization = record.dagster_event.step_materialization_data.materialization
            return {key: value.value for key, value in materialization.metadata.items()}
        raise AssertionError(f"run {run_id} materialized nothing")


def captured_stdout(deployment: Deployment, run_id: str) -> str:
    """What the run's step printed, as the compute log manager captured it (what the UI shows)."""
    files = sorted((deployment.home / "storage" / run_id / "compute_logs").glob("*.out"))
    return "".join(f.read_text() for f in files)


def _in(run: dg.DagsterRun, statuses: set[dg.DagsterRunStatus]) -> dg.DagsterRun | None:
    return run if run.status in statuses else None


def wait_until(what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value is not None and value is not False:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s:g} s")


def event_shape(deployment: Deployment, run_id: str) -> list[tuple[str, str]]:
    """The run's events as (type, message with numbers masked): what must not depend on the launcher."""
    shape = []
    for record in deployment.instance.all_logs(run_id):
        event = record.dagster_event
        if event is None:
            continue
        shape.append((event.event_type_value, re.sub(r"\d+", "N", event.message or "")))
    return shape


def fork_servers_of(root_pid: int) -> list[int]:
    """Fork server processes in ``root_pid``'s tree."""
    return [pid for pid in procfs.process_tree(root_pid) if _comm(pid) == "dagster-forksrv"]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def in_other_process(home: Path, code: str, *args: str) -> str:
    """Run ``code`` in a new interpreter with ``instance`` (from ``home``) and ``args`` defined; its stdout."""
    program = f"import sys\nimport dagster as dg\ninstance = dg.DagsterInstance.from_config({str(home)!r})\n{code}"
    done = subprocess.run([PYTHON, "-c", program, *args], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the other process failed: {done.stderr}")
    return done.stdout.strip()


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (orphans included, which a process tree misses)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members
