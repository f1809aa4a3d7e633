"""Which process runs a run, told apart from any later process that reuses its PID.

A run worker is named by (host, boot id, PID, start time in clock ticks since boot), read from Linux
``/proc``. Any process on the host (a restarted daemon, the webserver) can then check or signal a run worker
it did not start, and a recycled PID is never mistaken for the worker.
"""

from __future__ import annotations

import contextlib
import enum
import os
import socket
from pathlib import Path

PROC = Path("/proc")


class ProcessState(enum.Enum):
    RUNNING = "running"
    EXITED = "exited"
    """Gone, a zombie not yet waited for, or a different process under the same PID."""


def boot_id() -> str:
    """The kernel's identifier of this boot: a PID from before a reboot names nothing now."""
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def hostname() -> str:
    return socket.gethostname()


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; the fields after its last ')' are fixed.
    return text.rsplit(")", 1)[1].split()


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (field 22 of proc_pid_stat(5)); None if it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return int(fields[19])


def state(pid: int, started: int) -> ProcessState:
    """Whether the process that had ``pid`` and started at ``started`` is still running."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X") or int(fields[19]) != started:
        return ProcessState.EXITED
    return ProcessState.RUNNING


def thread_names() -> list[str]:
    """The OS threads of this process (native ones too, which ``threading`` does not see)."""
    names = []
    for task in sorted(os.listdir(PROC / "self" / "task")):
        try:
            names.append((PROC / "self" / "task" / task / "comm").read_text().strip())
        except OSError:
            continue
    return names


def socket_fds() -> list[int]:
    """This process's open file descriptors that are sockets."""
    fds = []
    for entry in os.listdir(PROC / "self" / "fd"):
        try:
            target = os.readlink(PROC / "self" / "fd" / entry)
        except OSError:
            continue
        if target.startswith("socket:"):
            fds.append(int(entry))
    return fds


def socket_inodes(pid: int) -> set[str]:
    """The socket inodes ``pid`` holds open (``socket:[N]``), empty if unreadable."""
    inodes = set()
    try:
        entries = os.listdir(PROC / str(pid) / "fd")
    except OSError:
        return set()
    for entry in entries:
        try:
            target = os.readlink(PROC / str(pid) / "fd" / entry)
        except OSError:
            continue
        if target.startswith("socket:"):
            inodes.add(target)
    return inodes


def set_name(name: str) -> None:
    """Name this process for ``ps``/``top`` (15 characters at most); best effort."""
    with contextlib.suppress(OSError):
        (PROC / "self" / "comm").write_text(name[:15])
