"""ForkServerRunLauncher against a real instance (SQLite, temporary DAGSTER_HOME) and a real code location
served by a real code server; runs are launched through the GraphQL mutation the UI uses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.events import DagsterEvent
from dagster._core.launcher import LaunchRunContext
from dagster_shared.record import copy

from dagster_streamgroup.launcher import ForkServerRunLauncher, client, process
from dagster_streamgroup.local import procfs
from tests.launcher.helpers import (
    FINISHED,
    PYTHON,
    SUCCESS,
    Deployment,
    captured_stdout,
    copy_location,
    event_shape,
    fork_servers_of,
    in_other_process,
    instance_yaml,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def location(tmp_path: Path) -> Path:
    return copy_location(tmp_path / "location")


@pytest.fixture
def deployment(tmp_path: Path, location: Path) -> Iterator[Deployment]:
    deployment = Deployment(tmp_path / "home", location, instance_yaml())
    yield deployment
    deployment.close()


def _exited(deployment: Deployment, run_id: str) -> bool:
    return any(m.startswith("Process for run exited") for m in deployment.messages(run_id))


def _engine_messages(deployment: Deployment, run_id: str) -> list[str]:
    return [m for m in deployment.messages(run_id) if "fork server" in m or "spawned" in m]


def test_a_run_succeeds_with_the_events_of_the_default_launcher(
    deployment: Deployment, tmp_path: Path, location: Path
) -> None:
    tags = {"team": "streams", "attempt": "1"}
    forked = deployment.launch("quick_job", tags)
    run = deployment.wait(forked, FINISHED)
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert run.run_id == forked and run.job_name == "quick_job"
    assert {k: run.tags[k] for k in tags} == tags
    assert run.tags["dagster/code_location"] == "launcher_tests"
    worker = deployment.worker(forked)
    facts = deployment.materialization(forked)
    assert worker.via == "fork" and worker.pid == facts["pid"] and worker.server_pid == facts["ppid"]
    assert worker.host == process.hostname() and worker.boot_id == process.boot_id()
    assert captured_stdout(deployment, forked) == f"quick ran in process {worker.pid}\n"
    assert facts["schema_check_scripts"] == "ParsedScripts", "the migration scripts parsed once, in the server"
    assert facts["event_log_engines"] == "dagster_streamgroup.patches.sqlite_engines", "one engine per database"
    assert facts["ipython"] == "settled", "the server looked for PySpark's optional IPython once, for every run"

    default = Deployment(tmp_path / "default-home", location, instance_yaml(launcher=None))
    try:
        spawned = default.launch("quick_job", tags)
        assert default.wait(spawned, FINISHED).status == dg.DagsterRunStatus.SUCCESS
        for place, run_id in ((deployment, forked), (default, spawned)):  # the worker's last event follows SUCCESS
            wait_until("the worker's exit event", lambda p=place, r=run_id: _exited(p, r), 60)
        assert event_shape(deployment, forked) == event_shape(default, spawned)
        spawned_pid = default.materialization(spawned)["pid"]
        assert default.materialization(spawned)["schema_check_scripts"] == "ScriptDirectory"
        assert default.materialization(spawned)["event_log_engines"] == "sqlalchemy.engine.create"
        assert default.materialization(spawned)["ipython"] == "searched"
        assert captured_stdout(default, spawned) == f"quick ran in process {spawned_pid}\n"
        assert default.run(spawned).tags.keys() - {".dagster/grpc_info"} == run.tags.keys() - {"streamgroup/run_worker"}
    finally:
        default.close()


def test_children_are_fork_safe_and_the_server_single_threaded(deployment: Deployment) -> None:
    first, second = deployment.launch("quick_job"), deployment.launch("quick_job")
    deployment.wait(first, SUCCESS)
    deployment.wait(second, SUCCESS)
    a, b = deployment.materialization(first), deployment.materialization(second)
    assert a["ppid"] == b["ppid"], "both runs are children of the same fork server"
    assert a["numpy_random"] != b["numpy_random"] and a["random"] != b["random"]
    server = a["ppid"]
    assert len(os.listdir(f"/proc/{server}/task")) == 1
    server_sockets = process.socket_inodes(server)
    assert server_sockets, "the fork server holds its channel to the launcher"
    assert not set(json.loads(a["sockets"])) & server_sockets
    assert not set(json.loads(b["sockets"])) & server_sockets


def test_terminate_from_another_process_cancels_the_run(deployment: Deployment, tmp_path: Path) -> None:
    release = tmp_path / "release-terminate"
    run_id = deployment.launch("wait_job", {"release": str(release)})
    wait_until("the run's step to start", Path(f"{release}.started").exists, 60)
    worker = deployment.worker(run_id)
    out = in_other_process(deployment.home, "print(instance.run_launcher.terminate(sys.argv[1]))", run_id)
    assert out == "True"
    run = deployment.wait(run_id, FINISHED)
    assert run.status == dg.DagsterRunStatus.CANCELED
    wait_until("the worker to exit", lambda: process.state(worker.pid, worker.start_ticks).name == "EXITED", 30)
    assert in_other_process(deployment.home, "print(instance.run_launcher.terminate(sys.argv[1]))", run_id) == "False"


def test_a_dead_worker_is_reported_by_any_process(deployment: Deployment, tmp_path: Path) -> None:
    release = tmp_path / "release-kill"
    run_id = deployment.launch("wait_job", {"release": str(release)})
    wait_until("the run's step to start", Path(f"{release}.started").exists, 60)
    worker = deployment.worker(run_id)
    check = "print(instance.run_launcher.check_run_worker_health(instance.get_run_by_id(sys.argv[1])))"
    assert in_other_process(deployment.home, check, run_id).startswith("RUNNING")
    os.kill(worker.pid, signal.SIGKILL)
    wait_until("the worker to be gone", lambda: process.state(worker.pid, worker.start_ticks).name == "EXITED", 30)
    elsewhere = in_other_process(deployment.home, check, run_id)
    assert elsewhere.startswith("FAILED") and f"{worker.pid} (forked) is not running" in elsewhere
    here = wait_until(
        "the launcher to learn how its child ended",
        lambda: (
            (r := deployment.instance.run_launcher.check_run_worker_health(deployment.run(run_id))).msg
            and "SIGKILL" in r.msg
            and r
        ),
        10,
    )
    assert here.status == dg._core.launcher.WorkerStatus.FAILED


def test_changed_code_runs_in_a_new_fork_server(deployment: Deployment, location: Path) -> None:
    first = deployment.launch("quick_job")
    deployment.wait(first, SUCCESS)
    assert deployment.materialization(first)["version"] == "first"
    assert _engine_messages(deployment, first) == []
    old_server = deployment.worker(first).server_pid
    assert old_server is not None

    (location / "behaviour.py").write_text('VERSION = "second"\n')
    second = deployment.launch("quick_job")
    deployment.wait(second, SUCCESS)
    assert deployment.materialization(second)["version"] == "second"
    (reason,) = _engine_messages(deployment, second)
    assert "its code changed since its fork server started" in reason and "behaviour.py" in reason
    assert deployment.worker(second).server_pid != old_server
    wait_until("the old fork server to exit", lambda: not procfs.alive([old_server]), 30)


def test_two_runs_at_once(deployment: Deployment, tmp_path: Path) -> None:
    releases = [tmp_path / "release-a", tmp_path / "release-b"]
    run_ids: list[str] = []

    def launch(release: Path) -> None:
        run_ids.append(deployment.launch("wait_job", {"release": str(release)}))

    threads = [threading.Thread(target=launch, args=(r,)) for r in releases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for release in releases:  # both steps run at the same time: each waits for its own file
        wait_until("both runs' steps to start", Path(f"{release}.started").exists, 60)
    pids = {deployment.worker(run_id).pid for run_id in run_ids}
    assert len(pids) == 2
    for release in releases:
        release.touch()
    for run_id in run_ids:
        assert deployment.wait(run_id, FINISHED).status == dg.DagsterRunStatus.SUCCESS


def test_a_dead_fork_server_is_replaced_and_the_reason_logged(deployment: Deployment) -> None:
    first = deployment.launch("quick_job")
    deployment.wait(first, SUCCESS)
    server = deployment.worker(first).server_pid
    assert server is not None
    os.kill(server, signal.SIGKILL)
    wait_until("the fork server to be gone", lambda: not procfs.alive([server]), 30)
    second = deployment.launch("quick_job")
    assert deployment.wait(second, FINISHED).status == dg.DagsterRunStatus.SUCCESS
    (reason,) = _engine_messages(deployment, second)
    assert f"its fork server (pid {server}) had exited with -9" in reason
    assert deployment.worker(second).via == "fork"


def test_a_fork_server_that_answers_too_late_is_closed_and_never_answers_another_run(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server stopped (SIGSTOP) during a fork answers after the launcher stopped waiting: its answer, read as
    the answer to the next request, would tag that run with, and release, the child forked for this one. The
    launcher closes such a server: the run is spawned instead, once, and the next run is forked from a new
    server."""
    first = deployment.launch("quick_job")
    deployment.wait(first, SUCCESS)
    server = deployment.worker(first).server_pid
    assert server is not None
    monkeypatch.setattr(client, "REPLY_TIMEOUT_S", 2.0)
    os.kill(server, signal.SIGSTOP)
    try:
        late = deployment.launch("quick_job")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGCONT)
    assert deployment.wait(late, FINISHED).status == dg.DagsterRunStatus.SUCCESS
    assert deployment.worker(late).via == "spawn"
    (reason,) = _engine_messages(deployment, late)
    assert "did not answer within 2 s" in reason
    wait_until("the late fork server to be gone", lambda: not procfs.alive([server]), 30)
    monkeypatch.undo()
    after = deployment.launch("quick_job")
    assert deployment.wait(after, FINISHED).status == dg.DagsterRunStatus.SUCCESS
    worker = deployment.worker(after)
    assert worker.via == "fork" and worker.server_pid not in (None, server)
    starts = [m for m in deployment.messages(late) if m.startswith("Started process for run")]
    assert len(starts) == 1, f"the run that the late server was asked for ran {len(starts)} times"


def test_a_start_the_server_did_not_confirm_is_never_started_a_second_time(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the child has been told to start, a server that does not confirm it (stopped here right after the
    run was tagged, before it reads the go-ahead; the launcher cannot be made to lose an answer otherwise, so
    the stop is injected at the tag) leaves the run to that child: spawning another worker could run it twice.
    The child, whose server is closed before it passed the go-ahead on, exits without running it."""
    first = deployment.launch("quick_job")
    deployment.wait(first, SUCCESS)
    server = deployment.worker(first).server_pid
    assert server is not None
    monkeypatch.setattr(client, "REPLY_TIMEOUT_S", 2.0)
    tag = ForkServerRunLauncher._tag_forked

    def tag_then_stop(launcher: ForkServerRunLauncher, run: dg.DagsterRun, forked: Any, server_pid: int) -> None:
        tag(launcher, run, forked, server_pid)
        os.kill(server_pid, signal.SIGSTOP)

    monkeypatch.setattr(ForkServerRunLauncher, "_tag_forked", tag_then_stop)
    try:
        unconfirmed = deployment.launch("quick_job")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGCONT)
    monkeypatch.undo()
    worker = deployment.worker(unconfirmed)
    assert worker.via == "fork" and worker.server_pid == server
    (reason,) = _engine_messages(deployment, unconfirmed)
    assert "did not confirm it" in reason and "not started again" in reason
    wait_until("the unconfirmed child to exit", lambda: not procfs.alive([worker.pid, server]), 30)
    messages = deployment.messages(unconfirmed)
    assert not any(m.startswith("Started process for run") for m in messages), messages
    assert deployment.run(unconfirmed).status == dg.DagsterRunStatus.STARTING  # run monitoring fails it
    after = deployment.launch("quick_job")
    assert deployment.wait(after, FINISHED).status == dg.DagsterRunStatus.SUCCESS
    assert deployment.worker(after).server_pid not in (None, server)


def test_a_server_that_cannot_fork_safely_falls_back_to_spawning(tmp_path: Path, location: Path) -> None:
    config = {"preload_modules": ["tests.launcher.threaded_import"]}
    deployment = Deployment(tmp_path / "home", location, instance_yaml(launcher_config=config))
    try:
        for attempt in range(2):
            run_id = deployment.launch("quick_job")
            assert deployment.wait(run_id, FINISHED).status == dg.DagsterRunStatus.SUCCESS
            worker = deployment.worker(run_id)
            assert worker.via == "spawn" and worker.server_pid is None
            (reason,) = _engine_messages(deployment, run_id)
            assert f"Run worker spawned as a new process (pid {worker.pid})" in reason
            assert "not single-threaded after its preload (2 threads" in reason, attempt
            assert fork_servers_of(os.getpid()) == []
    finally:
        deployment.close()


def test_a_reloaded_code_location_gets_a_new_fork_server(deployment: Deployment) -> None:
    first = deployment.launch("quick_job")
    deployment.wait(first, SUCCESS)
    deployment.workspace.reload_code_location("launcher_tests")
    second = deployment.launch("quick_job")
    deployment.wait(second, SUCCESS)
    (reason,) = _engine_messages(deployment, second)
    assert "the code location was reloaded since its fork server started" in reason
    assert deployment.worker(second).server_pid != deployment.worker(first).server_pid


def test_a_run_launched_by_a_process_that_exits_at_once(deployment: Deployment) -> None:
    """``dagster job launch`` with Dagster's DefaultRunCoordinator launches in the CLI process, which exits
    right after: its fork server goes with it, and the run it forked carries on."""
    command = [str(Path(PYTHON).parent / "dagster"), "job", "launch", "-w", str(deployment.location / "workspace.yaml")]
    done = subprocess.run(
        [*command, "-j", "quick_job", "--tags", json.dumps({"launched_by": "cli"})],
        env={**os.environ, "DAGSTER_HOME": str(deployment.home)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (run,) = deployment.instance.get_runs(dg.RunsFilter(tags={"launched_by": "cli"}))
    assert deployment.wait(run.run_id, FINISHED).status == dg.DagsterRunStatus.SUCCESS
    worker = deployment.worker(run.run_id)
    assert worker.via == "fork" and worker.server_pid is not None
    wait_until("the CLI's fork server to exit", lambda: not procfs.alive([worker.server_pid or 0]), 30)


def test_a_code_location_whose_interpreter_is_elsewhere_runs_through_its_code_server(
    tmp_path: Path, location: Path
) -> None:
    """A code server in another container or host: its interpreter's path means nothing here. No second host
    is at hand, so the run's origin is rewritten to such a path before it is launched; the launcher hands the
    run to the code server, as Dagster's default launcher does."""
    deployment = Deployment(tmp_path / "home", location, instance_yaml(queued=True))  # no daemon: it stays queued
    try:
        run_id = deployment.launch("quick_job")
        assert deployment.run(run_id).status == dg.DagsterRunStatus.QUEUED
        starting = DagsterEvent(event_type_value=dg.DagsterEventType.PIPELINE_STARTING.value, job_name="quick_job")
        deployment.instance.report_dagster_event(starting, run_id=run_id)  # as DagsterInstance.launch_run does
        run = deployment.run(run_id)
        origin = run.job_code_origin
        assert origin is not None
        elsewhere = origin._replace(
            repository_origin=origin.repository_origin._replace(executable_path="/opt/elsewhere/bin/python")
        )
        context = LaunchRunContext(
            dagster_run=copy(run, job_code_origin=elsewhere), workspace=deployment.workspace.create_request_context()
        )
        deployment.instance.run_launcher.launch_run(context)
        assert deployment.wait(run_id, FINISHED).status == dg.DagsterRunStatus.SUCCESS
        tags = deployment.run(run_id).tags
        assert ".dagster/grpc_info" in tags and "streamgroup/run_worker" not in tags
        assert any(
            "Run started by its code server, as Dagster's default launcher does, because its interpreter "
            "/opt/elsewhere/bin/python is not on this host" in m
            for m in deployment.messages(run_id)
        )
    finally:
        deployment.close()
