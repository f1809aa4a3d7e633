"""The fork server: one process per code location that imports once what every run imports, then forks.

Started by ``ForkServerRunLauncher`` as ``python -m dagster_streamgroup.launcher.forkserver --fd N`` with the code
location's interpreter, it loads the definitions exactly as a run worker does
(``ReconstructableRepository.get_definition`` on the run's code pointer, whose module and
``Definitions.get_repository_def`` stay cached in every child), imports the heavy libraries the runs use, parses
Dagster's schema migration scripts (``patches.migrations``), makes Dagster's SQLite storages share engines
(``patches.sqlite_engines``) and its resource construction reuse inferred schemas (``patches.resource_schema``;
each only on a Dagster release they were verified on), and then forks one child per run. It creates no thread,
gRPC channel, Spark session, Kafka client or database connection, and checks before each fork that it is
single-threaded (native threads included); it refuses to fork otherwise. It exits when the launcher's end of the
socket pair closes.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import os
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from dagster_streamgroup.launcher import child, fingerprint, process
from dagster_streamgroup.launcher.protocol import (
    Channel,
    ChannelClosedError,
    Fork,
    Forked,
    Preload,
    PreloadFailed,
    Ready,
    Refused,
    Release,
    Released,
)
from dagster_streamgroup.launcher.protocol import (
    Exited as ExitedMessage,
)
from dagster_streamgroup.patches import migrations, resource_schema, sqlite_engines

REAP_INTERVAL_S = 5.0
"""The loop wakes on SIGCHLD and on requests; this is only a backstop."""
CLOCK_SLACK_NS = 100_000_000
"""File times come from the kernel's coarse clock; a file written this long before the preload began still
counts as possibly written during it."""
DEFINITION_MODULES = ("dagster._cli.api", "dagster._core.execution.api", "dagster._grpc.impl")
"""What ``dagster api execute_run`` imports before it loads the user's code."""


ABSENT_OPTIONAL_IMPORTS = ("IPython", "ipykernel")
"""Imported, where installed, at every call of a PySpark DataFrame method: ``pyspark.errors.utils`` names the
caller's line for the server's error messages, and looks for an IPython cell first. Where they are not
installed, each of those imports searched ``sys.path`` again (a hundred searches a run); the fork server
searches once. Installing one changes site-packages, which restarts the fork server."""


class PreloadError(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dagster_streamgroup.launcher.forkserver")
    parser.add_argument("--fd", type=int, required=True, help="this end of the launcher's socket pair")
    args = parser.parse_args(argv)
    process.set_name("dagster-forksrv")
    # Ctrl-C in a terminal reaches the whole process group; the server leaves when its launcher does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = Channel(socket.socket(fileno=args.fd))
    try:
        request = channel.recv(timeout_s=None)
        if not isinstance(request, Preload):
            return 2
        server = ForkServer(channel)
        if not server.preload(request):
            return 0
        server.serve()
    except ChannelClosedError:
        pass
    return 0


def _script_dir(entry_point: Sequence[str] | None) -> str:
    """``sys.path[0]`` of the process Dagster would start: the folder of the ``dagster`` script (installed
    next to the interpreter), or the working directory for ``python -m dagster``."""
    if entry_point and len(entry_point) >= 3 and entry_point[1] == "-m":
        return os.getcwd()
    return os.path.dirname(sys.executable)


class ForkServer:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.runs_per_worker = 1
        self.worker_idle_s = 60.0
        self.unreleased: dict[int, socket.socket] = {}
        """Children waiting for their go-ahead, by PID: the server's end of each one's socket pair."""
        self.running: dict[int, socket.socket] = {}
        """Released children that may take another run: each says so on its socket when its run succeeded."""
        self.idle: dict[int, tuple[socket.socket, float]] = {}
        """Children waiting for another run, by PID, in the order they became idle (with when, monotonic)."""
        self.runs_before: dict[int, int] = {}
        """Runs each live child was released for."""
        self.own_fds: list[int] = []
        """The server's own pipes, which its children close."""

    def preload(self, request: Preload) -> bool:
        self.runs_per_worker = request.runs_per_worker
        self.worker_idle_s = request.worker_idle_s
        started, cpu_started = time.perf_counter(), time.process_time()
        since = time.time_ns() - CLOCK_SLACK_NS
        missing: list[str] = []
        extra_files: list[str] = []
        try:
            missing, extra_files = _load(request)
            gc.collect()
            gc.freeze()  # the preloaded objects go to the permanent generation: children's collections skip them
            _run_fork_handlers()
            threads = process.thread_names()
            if len(threads) != 1:
                raise PreloadError(
                    f"the fork server is not single-threaded after its preload ({len(threads)} threads: "
                    f"{', '.join(threads)}); forking it would copy locks held by the other threads"
                )
        except BaseException as exc:
            error = "".join(traceback.format_exception(exc)) if not isinstance(exc, PreloadError) else str(exc)
            self.channel.send(
                PreloadFailed(error=error, fingerprint=fingerprint.take(list(sys.modules.values()), extra_files))
            )
            return False
        self.channel.send(
            Ready(
                pid=os.getpid(),
                fingerprint=fingerprint.take(list(sys.modules.values()), extra_files).distrusting(since),
                preload_s=round(time.perf_counter() - started, 3),
                preload_cpu_s=round(time.process_time() - cpu_started, 3),
                modules_loaded=len(sys.modules),
                missing_modules=tuple(missing),
            )
        )
        return True

    def serve(self) -> None:
        # SIGCHLD wakes the loop, so a child is waited for (and its exit reported) as soon as it ends.
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        self.own_fds = [wake_r, wake_w]
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        try:
            while True:
                self._reap()
                self._let_idle_go(time.monotonic() - self.worker_idle_s)
                if not self.channel.pending():
                    sock = self.channel.sock.fileno()
                    workers = {s.fileno(): pid for pid, s in self.running.items()}
                    readable, _, _ = select.select([sock, wake_r, *workers], [], [], self._wait_s())
                    if wake_r in readable:
                        with contextlib.suppress(BlockingIOError):
                            while os.read(wake_r, 512):
                                pass
                    for fd in readable:
                        if fd in workers:
                            self._hear(workers[fd])
                    if sock not in readable:
                        continue
                message = self.channel.recv(timeout_s=0)
                if isinstance(message, Fork):
                    self._fork(message)
                elif isinstance(message, Release):
                    self._release(message)
                elif message is not None:
                    self.channel.send(Refused(reason=f"unexpected message {message.type}"))
        finally:
            for pid, go in self.unreleased.items():  # never released: they have not touched their run
                go.close()
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            for worker in [*self.running.values(), *(worker for worker, _ in self.idle.values())]:
                worker.close()  # a child waiting for another run exits; one in a run exits after it

    def _wait_s(self) -> float:
        if not self.idle:
            return REAP_INTERVAL_S
        oldest = min(since for _, since in self.idle.values())
        return max(0.0, min(REAP_INTERVAL_S, oldest + self.worker_idle_s - time.monotonic()))

    def _fork(self, request: Fork) -> None:
        if self._hand_to_idle(request):
            return
        threads = process.thread_names()
        if len(threads) != 1:
            self.channel.send(Refused(reason=f"{len(threads)} threads are running ({', '.join(threads)})"))
            return
        ours, theirs = socket.socketpair()
        inherited = [self.channel.sock.fileno(), ours.fileno(), *self.own_fds, *self._children_fds()]
        try:
            pid = os.fork()
        except OSError as exc:  # out of memory or processes: the launcher spawns instead, and says why
            ours.close()
            theirs.close()
            self.channel.send(Refused(reason=f"fork() failed: {exc}"))
            return
        if pid == 0:
            child.run(theirs.detach(), request.execute_run_args, inherited, self.runs_per_worker)
        theirs.close()
        self.unreleased[pid] = ours
        self.runs_before[pid] = 0
        started = process.start_ticks(pid)
        if started is None:  # it died at once; the reaper reports how
            self.channel.send(Refused(reason=f"the forked child {pid} exited immediately"))
            return
        self.channel.send(Forked(pid=pid, start_ticks=started))

    def _hand_to_idle(self, request: Fork) -> bool:
        """Give the run to the child that became idle last (the others reach their idle limit first)."""
        while self.idle:
            pid = next(reversed(self.idle))
            worker, _ = self.idle.pop(pid)
            started = process.start_ticks(pid)
            try:
                if started is None:
                    raise OSError("it exited")
                worker.sendall(request.execute_run_args.encode() + b"\n")
            except OSError:
                worker.close()  # it is exiting; the reaper reports it
                continue
            self.unreleased[pid] = worker
            self.channel.send(Forked(pid=pid, start_ticks=started, runs_before=self.runs_before.get(pid, 0)))
            return True
        return False

    def _children_fds(self) -> list[int]:
        sockets = [*self.unreleased.values(), *self.running.values(), *(w for w, _ in self.idle.values())]
        return [worker.fileno() for worker in sockets]

    def _release(self, request: Release) -> None:
        go = self.unreleased.pop(request.pid, None)
        if go is None:
            self.channel.send(Refused(reason=f"no forked child {request.pid} waits for a release"))
            return
        started = False
        with contextlib.suppress(OSError):
            if request.start:
                go.sendall(child.GO)
                started = True
        runs = self.runs_before.get(request.pid, 0) + (1 if started else 0)
        self.runs_before[request.pid] = runs
        if started and runs < self.runs_per_worker:
            self.running[request.pid] = go
        else:
            go.close()  # without the go-ahead, the child exits without touching the run
        self.channel.send(Released(pid=request.pid))

    def _hear(self, pid: int) -> None:
        """A running child's word: it may take another run (its run succeeded), or it closed its end."""
        worker = self.running.pop(pid)
        try:
            word = worker.recv(1)
        except OSError:
            word = b""
        if word == child.IDLE:
            self.idle[pid] = (worker, time.monotonic())
        else:
            worker.close()

    def _let_idle_go(self, idle_since: float) -> None:
        """Children idle since before ``idle_since`` read the end of their socket and exit."""
        for pid, (worker, since) in list(self.idle.items()):
            if since <= idle_since:
                del self.idle[pid]
                worker.close()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for worker in (self.unreleased.pop(pid, None), self.running.pop(pid, None)):
                if worker is not None:
                    worker.close()
            idle = self.idle.pop(pid, None)
            if idle is not None:
                idle[0].close()
            self.runs_before.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                print(
                    f"dagster-streamgroup fork server {os.getpid()}: run worker {pid} exited with {code}",
                    file=sys.stderr,
                    flush=True,
                )
            self.channel.send(ExitedMessage(pid=pid, status=code))


def _load(request: Preload) -> tuple[list[str], list[str]]:
    """Import what a run imports; return the modules that are not installed and files to watch."""
    from dagster._core.code_pointer import FileCodePointer
    from dagster._core.instance.ref import InstanceRef
    from dagster._core.origin import RepositoryPythonOrigin
    from dagster._serdes import deserialize_value
    from dagster._utils.hosted_user_process import recon_repository_from_origin

    from dagster_streamgroup.launcher.workdir import code_directory

    origin = deserialize_value(request.repository_origin, RepositoryPythonOrigin)
    directory = code_directory(origin)
    if directory is not None:  # where the code server would run the run (a relative code file resolves there)
        os.chdir(directory)
    sys.path[0] = _script_dir(origin.entry_point)
    pointer = origin.code_pointer
    extra_files = [os.path.abspath(pointer.python_file)] if isinstance(pointer, FileCodePointer) else []
    if request.instance_ref is not None:
        loader = deserialize_value(request.instance_ref, InstanceRef).secrets_loader
        if loader is not None:  # as the code server (--inject-env-vars-from-instance) and execute_run do
            os.environ.update(loader.get_secrets_for_environment(request.location_name))
    for name in DEFINITION_MODULES:
        importlib.import_module(name)
    missing = []
    for name in request.modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
            missing.append(name)
    for name in ABSENT_OPTIONAL_IMPORTS:
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = None  # type: ignore[assignment]  # import fails at once, as after a search
    repository: Any = recon_repository_from_origin(origin).get_definition()
    repository.get_all_jobs()
    migrations.parse_once()
    sqlite_engines.install()
    resource_schema.install()
    return missing, extra_files


def _run_fork_handlers() -> None:
    """Fork once and let the child exit: libraries' ``pthread_atfork`` handlers stop the worker threads they
    started at import (OpenBLAS does), and the server, which never calls them again, stays without threads."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    sys.exit(main())
