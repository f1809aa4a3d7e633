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
        self.unreleased: dict[int, int] = {}
        """Forked children waiting for their go-ahead, by PID: the write end of each one's pipe."""
        self.own_fds: list[int] = []
        """The server's own pipes, which its children close."""

    def preload(self, request: Preload) -> bool:
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
                if not self.channel.pending():
                    sock = self.channel.sock.fileno()
                    readable, _, _ = select.select([sock, wake_r], [], [], REAP_INTERVAL_S)
                    if wake_r in readable:
                        with contextlib.suppress(BlockingIOError):
                            while os.read(wake_r, 512):
                                pass
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
            for pid, go_w in self.unreleased.items():  # never released: they have not touched their run
                with contextlib.suppress(OSError):
                    os.close(go_w)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def _fork(self, request: Fork) -> None:
        threads = process.thread_names()
        if len(threads) != 1:
            self.channel.send(Refused(reason=f"{len(threads)} threads are running ({', '.join(threads)})"))
            return
        go_r, go_w = os.pipe()
        inherited = [self.channel.sock.fileno(), go_w, *self.own_fds, *self.unreleased.values()]
        try:
            pid = os.fork()
        except OSError as exc:  # out of memory or processes: the launcher spawns instead, and says why
            os.close(go_r)
            os.close(go_w)
            self.channel.send(Refused(reason=f"fork() failed: {exc}"))
            return
        if pid == 0:
            child.run(go_r, request.execute_run_args, inherited)
        os.close(go_r)
        self.unreleased[pid] = go_w
        started = process.start_ticks(pid)
        if started is None:  # it died at once; the reaper reports how
            self.channel.send(Refused(reason=f"the forked child {pid} exited immediately"))
            return
        self.channel.send(Forked(pid=pid, start_ticks=started))

    def _release(self, request: Release) -> None:
        go_w = self.unreleased.pop(request.pid, None)
        if go_w is None:
            self.channel.send(Refused(reason=f"no forked child {request.pid} waits for a release"))
            return
        with contextlib.suppress(OSError):
            if request.start:
                os.write(go_w, b"1")
        os.close(go_w)
        self.channel.send(Released(pid=request.pid))

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            go_w = self.unreleased.pop(pid, None)
            if go_w is not None:
                os.close(go_w)
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

    origin = deserialize_value(request.repository_origin, RepositoryPythonOrigin)
    sys.path[0] = _script_dir(origin.entry_point)
    extra_files = [origin.code_pointer.python_file] if isinstance(origin.code_pointer, FileCodePointer) else []
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
