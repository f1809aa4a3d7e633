"""A forked child of the fork server: made fork-safe, then it runs ``dagster api execute_run``.

The child starts as a copy of the server, so it first drops what must not be shared: the server's sockets and
pipes (the launcher's channel above all), its signal dispositions, its seeds (``random`` reseeds itself at
fork; NumPy's global generator does not), and the environment the server set for itself only. It then waits
for the launcher's go-ahead, given once the run carries the worker tag, and runs the run through the very
command Dagster's Docker and Kubernetes launchers run in a new process: same events, same status transitions,
same handling of SIGTERM and SIGINT (both interrupt the run, which ends CANCELED when it was being canceled).

With ``runs_per_worker`` above 1 a child whose run succeeded stays for the next run of its code location
instead of exiting: every page of the server's memory a run writes to (reference counts of the modules,
functions and objects it touches, about 40 MB of a stream run) is copied into a new child at its first write,
a tenth of a second of system CPU a run on a 2-core host, while a child that ran a run already owns those
pages. It takes the next run only after a run that ended in SUCCESS with no thread of its own left running,
as a new process would start it: the same command, the same go-ahead after the run is tagged with this
worker, and none of the store and stream clients its earlier runs opened (each run connects anew, so it
sees a password or key rotated since, and an idle worker holds no connection).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import random
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Iterable
from typing import Any, BinaryIO, NoReturn

from dagster_streamgroup.launcher import process

RESTORE_ENV = "STREAMGROUP_FORKSERVER_RESTORE_ENV"
"""JSON {name: value or null} of variables the launcher set for the fork server alone; children undo them."""
GO = b"1"
"""From the server: the launcher tagged the run; start it."""
IDLE = b"I"
"""To the server: the run succeeded and this worker may take another."""
EXIT_INTERNAL_ERROR = 70
"""EX_SOFTWARE: the child failed before the run could start (the traceback is on stderr)."""


def run(channel_fd: int, execute_run_args: str, inherited_fds: Iterable[int], runs_per_worker: int = 1) -> NoReturn:
    """Run the run once the launcher gives the go-ahead (``GO`` on the socket ``channel_fd``); then, while the
    worker may run more runs and its run succeeded, say ``IDLE`` and run the next run the server hands it."""
    code = EXIT_INTERNAL_ERROR
    try:
        make_fork_safe(inherited_fds, keep=channel_fd)
        process.set_name("dagster-run")
        channel = socket.socket(fileno=channel_fd)
        # One buffer for every read: the next run's arguments and its go-ahead may arrive in one segment.
        reader = channel.makefile("rb")
        for ran in itertools.count(1):
            # Anything but the go-ahead: the launcher could not tag the run (or is gone); leave the run untouched.
            if reader.read(1) != GO:
                code = 0
                break
            code = execute_run(execute_run_args)
            if ran >= runs_per_worker or code != 0 or not may_run_another(execute_run_args):
                break
            release_run_clients()
            next_args = next_run(channel, reader)
            if next_args is None:  # the server let it go (idle too long, or the server exited)
                break
            execute_run_args = next_args
    except BaseException:
        traceback.print_exc()
    finally:
        exit_like_interpreter(code)


def may_run_another(execute_run_args: str) -> bool:
    """Whether the worker is fit for another run: its run ended in success (a failed, canceled or interrupted
    run may have left its process in any state), and no thread the run started is still running (a daemon
    thread of a library, such as gRPC's, may stay)."""
    from dagster import DagsterRunStatus
    from dagster._grpc.types import ExecuteRunArgs
    from dagster._serdes import deserialize_value

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return False
    try:
        args = deserialize_value(execute_run_args, ExecuteRunArgs)
        run = _instance(args).get_run_by_id(args.run_id)
    except Exception:  # the run's storage cannot say: the worker exits, as after any run
        return False
    return run is not None and run.status == DagsterRunStatus.SUCCESS


def release_run_clients() -> None:
    """Close the store and stream clients the group resources cache per process: a code server's cache lets
    its ticks share connections, but a run in a worker must connect as a run in a new process does, with the
    credentials of its own start (a store password rotated since a worker's first run must refuse the next)."""
    from dagster_streamgroup.client_cache import release_cached_clients

    release_cached_clients()


_instance_kept: list[tuple[bytes, Any]] = []
"""The instance the worker's runs name (their reference, serialized, with it), opened once per worker to read
its runs' statuses; replaced if a run names another."""


def _instance(args: Any) -> Any:
    from dagster import DagsterInstance
    from dagster._serdes import serialize_value

    ref = serialize_value(args.instance_ref).encode()
    if not _instance_kept or _instance_kept[0][0] != ref:
        _instance_kept[:] = [(ref, DagsterInstance.from_ref(args.instance_ref))]
    return _instance_kept[0][1]


def next_run(channel: socket.socket, reader: BinaryIO) -> str | None:
    """Say ``IDLE`` and wait for the next run's ``execute_run`` arguments (one line); None when the server
    closes its end instead, or when an interrupt comes while it waits: Ctrl-C to ``dg dev`` / ``dagster dev``
    reaches their whole process group, and an idle worker has no run to interrupt, so it exits quietly (its last
    run succeeded) instead of printing a traceback of its wait."""
    try:
        channel.sendall(IDLE)
        line = reader.readline()
    except (OSError, KeyboardInterrupt):
        return None
    if not line.endswith(b"\n"):
        return None
    return line[:-1].decode()


def make_fork_safe(inherited_fds: Iterable[int], keep: int = -1) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    for fd in inherited_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    for fd in process.socket_fds():  # any socket a preloaded library opened: never share one with a sibling
        if fd == keep:
            continue
        with contextlib.suppress(OSError):
            os.close(fd)
    for name, value in json.loads(os.environ.pop(RESTORE_ENV, "{}")).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def execute_run(execute_run_args: str) -> int:
    """``dagster api execute_run ARGS``: Dagster's own command, called in this process."""
    from dagster._cli.api import execute_run_command

    sys.argv = ["dagster", "api", "execute_run", execute_run_args]
    try:
        execute_run_command.main(args=[execute_run_args], prog_name="dagster api execute_run", standalone_mode=True)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def exit_like_interpreter(code: int) -> NoReturn:
    """What the interpreter does at exit (join non-daemon threads, run atexit hooks, flush), then leave
    without unwinding into the fork server's stack."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)
