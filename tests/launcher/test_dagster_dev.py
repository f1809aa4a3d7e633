"""ForkServerRunLauncher under a real ``dagster dev`` (daemon with the QueuedRunCoordinator and run monitoring,
webserver, code server): runs submitted over GraphQL, a killed run worker failed by run monitoring, runs that
outlive a SIGKILLed daemon and are monitored by the next one, no process left when ``dagster dev`` stops, and a
code location served apart (``dagster api grpc``) whose fork server outlives the daemon's workspace refreshes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from dagster_streamgroup.dagster.devserver import DagsterDev
from dagster_streamgroup.launcher import RunWorker, process
from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.kafka_broker import free_port
from dagster_streamgroup.local.spark_connect import port_answers
from tests.launcher.helpers import (
    LOCATION,
    PYTHON,
    copy_location,
    fork_servers_of,
    group_members,
    instance_yaml,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LAUNCH = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""


class Dev:
    """``dagster dev`` on the test code location, with this module's instance settings, and the instance
    itself for reading runs and events."""

    def __init__(self, home: Path, location: Path, workspace: str = "workspace.yaml") -> None:
        log = home / "dagster-dev.log"
        self.dagster_dev = DagsterDev(home, {}, log, storage="sqlite", workspace=location / workspace)
        (home / "dagster.yaml").write_text(instance_yaml(queued=True, monitoring_poll_s=1))
        self.instance = dg.DagsterInstance.from_config(str(home))

    def start(self) -> None:
        self.dagster_dev.start()

    def launch(self, job: str, tags: dict[str, str] | None = None) -> str:
        params = {
            "selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "jobName": job},
            "runConfigData": {},
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        }
        result = self.dagster_dev.graphql(LAUNCH, {"p": params})["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        run_id = result["run"]["runId"]
        assert isinstance(run_id, str)
        return run_id

    def run(self, run_id: str) -> dg.DagsterRun:
        run = self.instance.get_run_by_id(run_id)
        assert run is not None
        return run

    def wait_finished(self, run_id: str, timeout_s: float = 180.0) -> dg.DagsterRun:
        return wait_until(f"run {run_id} to finish", lambda: (r := self.run(run_id)).is_finished and r, timeout_s, 0.5)

    def worker(self, run_id: str) -> RunWorker:
        worker = wait_until(f"{run_id}'s worker", lambda: RunWorker.from_tags(self.run(run_id).tags), 120, 0.5)
        return worker

    def messages(self, run_id: str) -> list[str]:
        return [r.dagster_event.message or "" for r in self.instance.all_logs(run_id) if r.dagster_event]

    @property
    def pgid(self) -> int:
        assert self.dagster_dev.proc is not None
        return self.dagster_dev.proc.pid

    def close(self) -> None:
        self.dagster_dev.close()
        self.instance.dispose()


@pytest.fixture
def location(tmp_path: Path) -> Path:
    return copy_location(tmp_path / "location")


@pytest.fixture
def dev(tmp_path: Path, location: Path) -> Iterator[Dev]:
    dev = Dev(tmp_path / "home", location)
    try:
        dev.start()
        yield dev
    finally:
        dev.close()


def _started(release: Path) -> None:
    wait_until(f"{release.name}'s step to start", Path(f"{release}.started").exists, 180, 0.5)


def test_runs_fork_from_the_daemon_and_monitoring_fails_a_killed_worker(dev: Dev, tmp_path: Path) -> None:
    held, quick = tmp_path / "held", dev.launch("quick_job")
    doomed = dev.launch("wait_job", {"release": str(held)})
    assert dev.wait_finished(quick).status == dg.DagsterRunStatus.SUCCESS
    _started(held)
    worker = dev.worker(doomed)
    assert worker.via == "fork" and dev.worker(quick).server_pid == worker.server_pid
    assert procfs.process_tree(dev.dagster_dev.daemon_pid())[1:].count(worker.server_pid) == 1, (
        "the daemon launched the run: the fork server is its child"
    )
    os.kill(worker.pid, signal.SIGKILL)
    assert dev.wait_finished(doomed, 180).status == dg.DagsterRunStatus.FAILURE
    assert any(f"run worker process {worker.pid} (forked) was killed by SIGKILL" in m for m in dev.messages(doomed))


def test_runs_outlive_a_killed_daemon_and_the_next_daemon_monitors_them(tmp_path: Path, location: Path) -> None:
    first = Dev(tmp_path / "home", location)
    second: Dev | None = None
    finishes, dies = tmp_path / "finishes", tmp_path / "dies"
    try:
        first.start()
        survivor, victim = (first.launch("wait_job", {"release": str(p)}) for p in (finishes, dies))
        _started(finishes)
        _started(dies)
        workers = {run_id: first.worker(run_id) for run_id in (survivor, victim)}
        (server,) = fork_servers_of(first.dagster_dev.daemon_pid())

        os.kill(first.dagster_dev.daemon_pid(), signal.SIGKILL)
        assert first.dagster_dev.proc is not None
        first.dagster_dev.proc.wait(120)  # dagster dev notices its daemon died and shuts its services down
        wait_until("the old daemon's fork server to exit", lambda: not procfs.alive([server]), 60, 0.5)
        for worker in workers.values():
            assert process.state(worker.pid, worker.start_ticks) is process.ProcessState.RUNNING

        second = Dev(tmp_path / "home", location)
        second.start()
        os.kill(workers[victim].pid, signal.SIGKILL)
        assert second.wait_finished(victim, 180).status == dg.DagsterRunStatus.FAILURE
        assert any(
            f"run worker process {workers[victim].pid} (forked) is not running" in m for m in second.messages(victim)
        )
        finishes.touch()
        assert second.wait_finished(survivor).status == dg.DagsterRunStatus.SUCCESS
        wait_until("the first dagster dev's process group to empty", lambda: not group_members(first.pgid), 60, 0.5)

        quick = second.launch("quick_job")  # the new daemon starts its own fork server
        assert second.wait_finished(quick).status == dg.DagsterRunStatus.SUCCESS
        assert second.worker(quick).via == "fork"
        os.killpg(second.pgid, signal.SIGINT)  # as Ctrl-C in a terminal, or scripts/example.sh, stops it
        wait_until("every process of dagster dev to exit", lambda: not group_members(second.pgid), 90, 0.5)
    finally:
        first.close()
        if second is not None:
            second.close()


WORKSPACE_REFRESH_S = 60
"""Dagster's daemon refreshes its workspace this often (``RELOAD_WORKSPACE_INTERVAL``); for a location it loads
itself (``python_file``) it starts a new code server then, which the launcher takes for a reload."""


def test_a_location_served_apart_keeps_its_fork_server_across_the_daemons_workspace_refreshes(
    tmp_path: Path, location: Path
) -> None:
    """docs/deploying.md: with this launcher, serve the code location apart and name it in the workspace
    (``grpc_server:``). The daemon's refresh then finds the same code server (the same id), so a run after a
    refresh is forked from the fork server of the run before it. The server is started in the location's
    directory with a relative ``-f definitions.py``, as its code server runs it: the fork server runs there too
    (started from the daemon's directory, it loaded another file of that name, or none)."""
    port = free_port()
    served = location / "served.yaml"
    served.write_text(
        yaml.safe_dump({"load_from": [{"grpc_server": {"host": "127.0.0.1", "port": port, "location_name": LOCATION}}]})
    )
    with (tmp_path / "grpc.log").open("wb") as log:
        server = subprocess.Popen(
            [PYTHON, "-m", "dagster", "api", "grpc", "-h", "127.0.0.1", "-p", str(port), "-f", "definitions.py"],
            cwd=location,
            env={**os.environ, "DAGSTER_HOME": str(tmp_path / "home")},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    dev = Dev(tmp_path / "home", location, workspace=served.name)
    try:
        wait_until("the code server to listen", lambda: port_answers(port), 120, 0.5)
        dev.start()
        before = dev.launch("quick_job")
        assert dev.wait_finished(before).status == dg.DagsterRunStatus.SUCCESS, dev.messages(before)
        first = dev.worker(before)
        assert first.via == "fork"
        time.sleep(WORKSPACE_REFRESH_S + 10)
        after = dev.launch("quick_job")
        assert dev.wait_finished(after).status == dg.DagsterRunStatus.SUCCESS, dev.messages(after)
        second = dev.worker(after)
        assert second.via == "fork" and second.server_pid == first.server_pid, (first, second)
        assert not any("was replaced because" in m for m in dev.messages(after)), dev.messages(after)
    finally:
        dev.close()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
