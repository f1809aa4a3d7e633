"""What a server we started costs and who talks to it, read from Linux ``/proc``.

The Spark Connect server is a process tree (a Python driver, its JVM, Python worker daemons and their forked
workers), so its memory is the sum over the tree, and "between runs" means no client connection is open to
its port. Both are read here without extra dependencies; on systems without ``/proc`` they raise
``ProcfsUnavailableError`` instead of guessing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
_TCP_ESTABLISHED = "01"


class ProcfsUnavailableError(RuntimeError):
    """This system has no Linux ``/proc`` to read process trees and sockets from."""


def _require_proc() -> None:
    if not (PROC / "self" / "stat").exists():
        raise ProcfsUnavailableError("process-tree memory and connection counts need Linux /proc")


def _fields_after_name(stat_text: str) -> list[str]:
    # The command name in field 2 may contain spaces and parentheses; the fields after its last ')' are fixed.
    return stat_text.rsplit(")", 1)[1].split()


def _parent_of(stat_text: str) -> int:
    return int(_fields_after_name(stat_text)[1])


def process_tree(root: int) -> list[int]:
    """``root`` and all its live descendants (a snapshot; processes may exit while it is taken)."""
    _require_proc()
    children: dict[int, list[int]] = {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            parent = _parent_of((PROC / entry.name / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    if not (PROC / str(root)).exists():
        return []
    tree: list[int] = []
    pending = [root]
    while pending and len(tree) < 100_000:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, ()))
    return tree


def thread_states(pid: int) -> dict[int, str]:
    """Each thread's state letter (``R``, ``S``, ``T`` for stopped...), empty if the process is gone."""
    _require_proc()
    try:
        tasks = os.listdir(PROC / str(pid) / "task")
    except OSError:
        return {}
    states: dict[int, str] = {}
    for task in tasks:
        try:
            states[int(task)] = _fields_after_name((PROC / str(pid) / "task" / task / "stat").read_text())[0]
        except (OSError, IndexError, ValueError):
            continue
    return states


def wait_until_stopped(pid: int, timeout_s: float = 10.0) -> None:
    """Wait until every thread of ``pid`` shows the stopped state after a SIGSTOP. The signal reaches each thread
    as it next leaves the kernel: a thread busy in a system call can still finish what it was doing (answer a
    request) after ``kill`` returned, so a fault that must answer nothing starts only once this returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = thread_states(pid)
        if states and all(state in "Tt" for state in states.values()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} not stopped {timeout_s:g} s after SIGSTOP: thread states {states}")
        time.sleep(0.01)


def cmdline(pid: int) -> list[bytes]:
    """The argument vector of one process, empty if it is gone (or a zombie)."""
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return []


def rss_bytes(pid: int) -> int:
    """Resident set size of one process, 0 if it is gone (or a zombie)."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def tree_rss_bytes(root: int) -> int:
    """Sum of RSS over ``root``'s process tree. Pages shared after ``fork`` count once per process, so this
    overstates physical memory; it is the conservative figure a memory limit should use."""
    return sum(rss_bytes(pid) for pid in process_tree(root))


def pss_bytes(pid: int) -> int:
    """Proportional set size of one process (shared pages split between their users), 0 if unreadable."""
    try:
        for line in (PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def tree_pss_bytes(root: int) -> int:
    """Sum of PSS over ``root``'s process tree: close to the physical memory the tree really holds."""
    return sum(pss_bytes(pid) for pid in process_tree(root))


def alive(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` that still exist and are not zombies."""
    result = []
    for pid in pids:
        try:
            state = _state_of((PROC / str(pid) / "stat").read_text())
        except (OSError, IndexError):
            continue
        if state != "Z":
            result.append(pid)
    return result


def _state_of(stat_text: str) -> str:
    return stat_text.rsplit(")", 1)[1].split(maxsplit=1)[0]


def established_connections(port: int) -> int:
    """Open TCP connections whose local end is ``port`` (IPv4 and IPv6): the clients a server on it has now."""
    _require_proc()
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == _TCP_ESTABLISHED:
                count += 1
    return count


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process and of the children it has waited for, 0 if it is gone. Forked workers
    that exit between two readings are counted in their parent's waited-for children."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    # After the command name: state is field 3 of stat(5), utime 14, stime 15, cutime 16, cstime 17.
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> dict[int, float]:
    """``cpu_seconds`` of every process in ``root``'s tree, by PID (for differences over an interval)."""
    return {pid: cpu_seconds(pid) for pid in process_tree(root)}
