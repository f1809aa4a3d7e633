"""A forked child of the fork server: made fork-safe, then it runs ``dagster api execute_run``.

The child starts as a copy of the server, so it first drops what must not be shared: the server's sockets and
pipes (the launcher's channel above all), its signal dispositions, its seeds (``random`` reseeds itself at
fork; NumPy's global generator does not), and the environment the server set for itself only. It then waits
for the launcher's go-ahead, given once the run carries the worker tag, and runs the run through the very
command Dagster's Docker and Kubernetes launchers run in a new process: same events, same status transitions,
same handling of SIGTERM and SIGINT (both interrupt the run, which ends CANCELED when it was being canceled).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import signal
import sys
import threading
import traceback
from collections.abc import Iterable
from typing import NoReturn

from dagster_streamgroup.launcher import process

RESTORE_ENV = "STREAMGROUP_FORKSERVER_RESTORE_ENV"
"""JSON {name: value or null} of variables the launcher set for the fork server alone; children undo them."""
EXIT_INTERNAL_ERROR = 70
"""EX_SOFTWARE: the child failed before the run could start (the traceback is on stderr)."""


def run(go_fd: int, execute_run_args: str, inherited_fds: Iterable[int]) -> NoReturn:
    code = EXIT_INTERNAL_ERROR
    try:
        make_fork_safe(inherited_fds)
        process.set_name("dagster-run")
        go = os.read(go_fd, 1)
        os.close(go_fd)
        # Anything but the go-ahead: the launcher could not tag the run (or is gone); leave the run untouched.
        code = execute_run(execute_run_args) if go == b"1" else 0
    except BaseException:
        traceback.print_exc()
    finally:
        exit_like_interpreter(code)


def make_fork_safe(inherited_fds: Iterable[int]) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    for fd in inherited_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    for fd in process.socket_fds():  # any socket a preloaded library opened: never share one with a sibling
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
