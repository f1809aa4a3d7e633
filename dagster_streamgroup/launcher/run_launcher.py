"""``ForkServerRunLauncher``: Dagster runs forked from a preloaded server instead of a new interpreter each.

Dagster's default launcher asks the code server to start every run with ``multiprocessing`` "spawn": a new
interpreter that imports dagster, the heavy libraries and the definitions again, seconds of CPU before the run
reads anything. This launcher keeps, per code location, a fork server that did those imports once, and forks
a child per run that runs ``dagster api execute_run``, the command Dagster's Docker and Kubernetes launchers
run. Like those launchers it names the worker in a run tag, so any process on the host (a restarted daemon, the
webserver) can check the worker for run monitoring or stop it with SIGTERM. When no fork server can serve (it
died, its preload failed, it is not single-threaded), the run is spawned as ``dagster api execute_run`` and the
reason goes into the run's event log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping
from typing import Any, Self

from dagster import DagsterInstance, Field
from dagster import _check as check
from dagster._config.config_schema import UserConfigSchema
from dagster._core.errors import DagsterInvariantViolationError, DagsterLaunchFailedError
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._core.remote_representation.code_location import GrpcServerCodeLocation
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.storage.tags import GRPC_INFO_TAG
from dagster._core.workspace.context import BaseWorkspaceRequestContext
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClass, serialize_value
from dagster._serdes.config_class import ConfigurableClassData

from dagster_streamgroup.launcher import process
from dagster_streamgroup.launcher.client import ForkServerUnavailableError, StartUnconfirmedError
from dagster_streamgroup.launcher.pool import Lease, ServerPool
from dagster_streamgroup.launcher.protocol import ChannelClosedError, Fork, Forked
from dagster_streamgroup.launcher.settings import LauncherSettings
from dagster_streamgroup.launcher.spawn import SpawnedWorkers
from dagster_streamgroup.launcher.workdir import unreachable_code_file
from dagster_streamgroup.launcher.worker import WORKER_TAG, RunWorker
from dagster_streamgroup.run_tags import TAG_LAUNCH_FAILED


class ForkServerRunLauncher(RunLauncher[DagsterInstance], ConfigurableClass):
    """Starts each run as a fork of a per-code-location server that has dagster, the definitions and the
    runs' heavy libraries imported already (for hosts where the daemon, webserver and code run together)."""

    def __init__(self, inst_data: ConfigurableClassData | None = None, **config: Any) -> None:
        self._inst_data = inst_data
        self.settings = LauncherSettings.from_config(config)
        self._pool = ServerPool(self.settings)
        self._spawned = SpawnedWorkers()
        self._run_ids: set[str] = set()
        super().__init__()  # type: ignore[no-untyped-call]  # Dagster's MayHaveInstanceWeakref

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        types: dict[Any, Any] = {tuple[str, ...]: [str], int: int, float: float}
        return {
            name: Field(types[field.annotation], is_required=False, description=field.description)
            for name, field in LauncherSettings.model_fields.items()
        }

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> Self:
        return cls(inst_data=inst_data, **config_value)

    # Launching

    def launch_run(self, context: LaunchRunContext) -> None:
        try:
            self._launch_run(context)
        except Exception as exc:
            # Marked for the member that planned the run: a run no worker started is not an attempt.
            self._instance.add_run_tags(context.dagster_run.run_id, {TAG_LAUNCH_FAILED: type(exc).__name__})
            raise

    def _launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        if origin is None:
            raise DagsterInvariantViolationError(
                f"ForkServerRunLauncher: run {run.run_id} has no code origin (job_code_origin) to load its job from"
            )
        args = ExecuteRunArgs(job_origin=origin, run_id=run.run_id, instance_ref=self._instance.get_ref())
        location = run.remote_job_origin.location_name if run.remote_job_origin else None
        if not os.path.exists(origin.executable_path):
            self._through_code_server(context, f"its interpreter {origin.executable_path} is not on this host")
            return
        unreachable = unreachable_code_file(origin.repository_origin)
        if unreachable is not None:
            self._through_code_server(context, unreachable)
            return
        stateful = self._load_time_state(run)
        if stateful is not None:
            self._spawn(run, args, stateful)
        else:
            try:
                lease = self._fork(run, args, location, _code_server_id(context.workspace, location))
            except ForkServerUnavailableError as exc:
                self._spawn(run, args, f"the fork server of code location {location!r} cannot serve: {exc}")
            except StartUnconfirmedError as exc:
                self._instance.report_engine_event(
                    f"The fork server of code location {location!r} was asked to start the run in its child "
                    f"(pid {exc.forked.pid}) and did not confirm it ({exc}). The run is not started again "
                    "elsewhere, so that it never runs twice; if the child did not start it, run monitoring fails "
                    "it (start_timeout_seconds), and its member retries its ranges.",
                    run,
                    cls=self.__class__,
                )
            else:
                if lease.replaced_because:
                    self._instance.report_engine_event(
                        f"The fork server of code location {location!r} was replaced because "
                        f"{lease.replaced_because}; the run was forked from the new one (pid {lease.server.pid}).",
                        run,
                        cls=self.__class__,
                    )
        self._run_ids.add(run.run_id)

    def _through_code_server(self, context: LaunchRunContext, reason: str) -> None:
        """A code location served from another host or container: its code server starts the run, as with
        Dagster's default launcher (and this launcher checks and stops it the way that launcher does)."""
        if context.workspace is None:
            raise DagsterLaunchFailedError(  # type: ignore[no-untyped-call]
                f"ForkServerRunLauncher cannot start run {context.dagster_run.run_id}: {reason}, and no workspace "
                "was given to reach its code server"
            )
        self._default_launcher().launch_run(context)
        self._instance.report_engine_event(
            f"Run started by its code server, as Dagster's default launcher does, because {reason}.",
            context.dagster_run,
            cls=self.__class__,
        )

    def _load_time_state(self, run: DagsterRun) -> str | None:
        """Why the run's definitions must be built afresh, if they must: a preloaded server built them once,
        without the state (cacheable asset data, reconstruction metadata, state-backed components' versions)
        that the run's execution plan carries."""
        if not run.has_repository_load_data or run.execution_plan_snapshot_id is None:
            return None
        data = self._instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id).repository_load_data
        if data is None:
            return None
        if (
            data.cacheable_asset_data
            or data.reconstruction_metadata
            or (data.defs_state_info is not None and data.defs_state_info.info_mapping)
        ):
            return (
                "its definitions depend on load-time state (cacheable assets, reconstruction metadata or "
                "state-backed components) that a preloaded server cannot apply"
            )
        return None

    def _fork(self, run: DagsterRun, args: ExecuteRunArgs, location: str | None, generation: str | None) -> Lease:
        origin = check.not_none(run.job_code_origin).repository_origin
        ref = serialize_value(self._instance.get_ref())
        request = Fork(run_id=run.run_id, execute_run_args=serialize_value(args))
        lease = self._pool.lease(origin, location, generation, ref)
        try:
            lease.server.fork(request, lambda forked: self._tag_forked(run, forked, lease.server.pid))
        except ChannelClosedError as first:
            lease = self._pool.lease(
                origin, location, generation, ref, force_restart=f"its fork server ended during a request ({first})"
            )
            try:
                lease.server.fork(request, lambda forked: self._tag_forked(run, forked, lease.server.pid))
            except ChannelClosedError as second:
                raise ForkServerUnavailableError(f"two fork servers ended during a request ({second})") from second
        return lease

    def _tag_forked(self, run: DagsterRun, forked: Forked, server_pid: int) -> None:
        worker = RunWorker(
            host=process.hostname(),
            boot_id=process.boot_id(),
            pid=forked.pid,
            start_ticks=forked.start_ticks,
            via="fork",
            server_pid=server_pid,
            runs_before=forked.runs_before or None,
        )
        self._instance.add_run_tags(run.run_id, worker.tag())

    def _spawn(self, run: DagsterRun, args: ExecuteRunArgs, reason: str) -> None:
        proc = self._spawned.spawn(args)
        started = process.start_ticks(proc.pid)
        worker = RunWorker(
            host=process.hostname(),
            boot_id=process.boot_id(),
            pid=proc.pid,
            start_ticks=-1 if started is None else started,
            via="spawn",
        )
        self._instance.add_run_tags(run.run_id, worker.tag())
        self._instance.report_engine_event(
            f"Run worker spawned as a new process (pid {proc.pid}) because {reason}",
            run,
            cls=self.__class__,
        )

    # Monitoring and termination, from any process on the host

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        worker = RunWorker.from_tags(run.tags)
        if worker is None:
            if GRPC_INFO_TAG in run.tags:
                return CheckRunHealthResult(
                    WorkerStatus.RUNNING,
                    "started through its code server by Dagster's default launcher, which cannot check its worker",
                )
            return CheckRunHealthResult(WorkerStatus.NOT_FOUND, f"the run has no {WORKER_TAG} tag")
        problem = self._unreachable(worker)
        if problem is not None:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, problem, run_worker_id=str(worker.pid))
        if process.state(worker.pid, worker.start_ticks) is process.ProcessState.RUNNING:
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(worker.pid))
        return CheckRunHealthResult(WorkerStatus.FAILED, self._describe_exit(worker), run_worker_id=str(worker.pid))

    def terminate(self, run_id: str) -> bool:
        check.str_param(run_id, "run_id")
        if not self.has_instance:
            return False
        run = self._instance.get_run_by_id(run_id)
        if not run or run.is_finished:
            return False
        worker = RunWorker.from_tags(run.tags)
        if worker is None and GRPC_INFO_TAG in run.tags:
            return bool(self._default_launcher().terminate(run_id))  # type: ignore[no-untyped-call]
        self._instance.report_run_canceling(run)
        problem = f"the run has no {WORKER_TAG} tag" if worker is None else self._unreachable(worker)
        if problem is None and self._finished(run_id):
            return False  # it ended meanwhile, and its worker may run another run by now
        if worker is not None and problem is None and not _signal(worker, signal.SIGTERM):
            problem = self._describe_exit(worker)
        if problem is not None:
            self._instance.report_engine_event(
                f"Unable to send the termination request to the run worker: {problem}.", run, cls=self.__class__
            )
            return False
        return True

    def _finished(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        return run is None or run.is_finished

    def get_run_worker_debug_info(self, run: DagsterRun, include_container_logs: bool | None = True) -> str | None:
        worker = RunWorker.from_tags(run.tags)
        if worker is None:
            return None
        health = self.check_run_worker_health(run)
        return f"Run worker {worker.model_dump_json()}: {health}"

    def _unreachable(self, worker: RunWorker) -> str | None:
        if worker.host != process.hostname():
            return f"its worker runs on host {worker.host!r}, and this process runs on {process.hostname()!r}"
        if worker.boot_id != process.boot_id():
            return "the host restarted since its worker started"
        return None

    def _describe_exit(self, worker: RunWorker) -> str:
        status = (self._spawned.exits if worker.via == "spawn" else {}).get(worker.pid)
        if status is None and worker.via == "fork" and worker.server_pid is not None:
            status = self._pool.exit_status(worker.pid, worker.server_pid)
        what = f"run worker process {worker.pid} ({'forked' if worker.via == 'fork' else 'spawned'})"
        if status is None:
            return f"{what} is not running"
        if status < 0:
            return f"{what} was killed by {signal.Signals(-status).name}"
        return f"{what} exited with code {status} before the run finished"

    def _default_launcher(self) -> DefaultRunLauncher:
        launcher = DefaultRunLauncher()
        launcher.register_instance(self._instance)
        return launcher

    # Lifecycle

    def join(self, timeout: int = 30) -> None:
        if not self.has_instance:
            return
        deadline = time.monotonic() + timeout
        while True:
            active = [
                run_id
                for run_id in self._run_ids
                if (run := self._instance.get_run_by_id(run_id)) is not None and not run.is_finished
            ]
            if not active:
                return
            if time.monotonic() > deadline:
                raise Exception(f"Timed out waiting for these runs to finish: {active!r}")
            time.sleep(0.1)

    def dispose(self) -> None:
        """Stop the fork servers. Runs already started keep running, as the default launcher's do when the
        daemon stops; run monitoring of a later daemon still checks them through their worker tag."""
        self._pool.close()


def _code_server_id(workspace: BaseWorkspaceRequestContext | None, location: str | None) -> str | None:
    """The code server's id: it changes when the code location is reloaded."""
    if workspace is None or location is None:
        return None
    with contextlib.suppress(Exception):
        code_location = workspace.get_code_location(location)
        if isinstance(code_location, GrpcServerCodeLocation):
            return code_location.server_id
    return None


def _signal(worker: RunWorker, signum: signal.Signals) -> bool:
    """Signal the worker if it is still the process the tag names (a pidfd closes the PID-reuse window)."""
    try:
        pidfd = os.pidfd_open(worker.pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfd on this kernel
        pidfd = None
    try:
        if process.state(worker.pid, worker.start_ticks) is not process.ProcessState.RUNNING:
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(worker.pid, signum)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)
