"""What any local user sees of the processes the project starts: their command lines (``ps``, ``/proc/PID/cmdline``,
readable by everyone) sampled while they run, and the environment of the ones that should hold no secret
(``/proc/PID/environ``, readable by their owner and root)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from tests.secrets.leaks import Evidence

PROC = Path("/proc")


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # gone, or not ours to read
        return None


def command_line(pid: int) -> bytes | None:
    return _read(PROC / str(pid) / "cmdline")


def environment(pid: int) -> dict[str, str] | None:
    """``pid``'s environment as it started (``/proc/PID/environ``); None if it is gone or not readable."""
    data = _read(PROC / str(pid) / "environ")
    if data is None:
        return None
    pairs = (item.decode("utf-8", "surrogateescape").partition("=") for item in data.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def descendants(root: int) -> list[int]:
    """The live processes under ``root`` (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            stat = _read(PROC / entry.name / "stat")
            if stat is not None:
                try:
                    parent = int(stat.rsplit(b")", 1)[1].split()[1])
                except (IndexError, ValueError):
                    continue
                children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    pending = list(children.get(root, ()))
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


class CommandLineSampler:
    """Reads the command line of every process on the machine every ``interval_s`` in a thread, keeping each
    distinct one: a secret on a command line is seen by ``ps`` for as long as the process runs, and a short
    one (a format step) lives a second or two. Used as a context manager; ``samples`` counts the passes."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.samples = 0
        self.lines: dict[bytes, int] = {}
        """Each distinct command line, with a PID that had it."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cmdline-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        for entry in os.scandir(PROC):
            if entry.name.isdigit():
                line = command_line(int(entry.name))
                if line:
                    self.lines.setdefault(line, int(entry.name))
        self.samples += 1

    def __enter__(self) -> CommandLineSampler:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(30)
        self.sample()

    def add_to(self, evidence: Evidence) -> None:
        for line, pid in list(self.lines.items()):  # a copy: the sampling thread may still add
            name = line.split(b"\0", 1)[0].decode(errors="replace")
            evidence.add(f"/proc/{pid}/cmdline ({name})", line)


def add_environments(evidence: Evidence, what: str, pids: Iterable[int]) -> int:
    """The environment of each of ``pids`` (processes that should hold no secret) as evidence; how many were read."""
    read = 0
    for pid in pids:
        env = environment(pid)
        line = command_line(pid) or b""
        if env is not None:
            read += 1
            name = line.split(b"\0", 1)[0].decode(errors="replace")
            evidence.add(f"/proc/{pid}/environ of {what} ({name})", "\n".join(f"{k}={v}" for k, v in env.items()))
    return read
