"""Where a deployment's CPU goes, from Linux ``/proc``: by part, and per run process.

Two ways of counting, because run processes come and go between readings:

- **totals** (``cpu_by_part``): the user + system CPU of every live process of a tree *plus* that of the
  children each one has waited for (``cutime``/``cstime``). A run process that exits is reaped by the code
  server, so its whole CPU moves into the code server's children's time: the sum over a tree is exact over
  an interval, but runs and code server can only be told apart as one part.
- **per process** (``TreeSampler``): each process's own user + system time, read every ``interval_s``
  until it disappears, keyed by (PID, start time). A run's figure is the last reading of its process and of
  its non-Spark descendants, so it misses at most the CPU of its last ``interval_s`` (process exit); the
  totals above show how much that was.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK")

CODE_SERVER = "code_server"
RUNS = "runs"
SPARK_IN_RUNS = "spark_in_runs"
CODE_SERVER_AND_RUNS = "code_server_and_runs"

ROLES: tuple[tuple[bytes, str], ...] = (
    (b"dagster._daemon", "daemon"),
    (b"dagster-daemon", "daemon"),
    (b"dagster_webserver", "webserver"),
    (b"dagster-webserver", "webserver"),
    (b"code-server start", CODE_SERVER),
    (b"api grpc", CODE_SERVER),
    (b"org.apache.spark", SPARK_IN_RUNS),
    (b"pyspark.daemon", SPARK_IN_RUNS),
    (b"pyspark.worker", SPARK_IN_RUNS),
    (b"pyspark/daemon", SPARK_IN_RUNS),
    (b"pyspark/worker", SPARK_IN_RUNS),
)
"""Command-line fragments of the processes of ``dagster dev`` by role; the root is ``dagster_dev`` and any
other process is part of a run (the run worker, its log tailers, a local Spark it started)."""


@dataclass(frozen=True)
class Stat:
    """The fields of ``/proc/PID/stat`` that CPU accounting needs (seconds, not clock ticks)."""

    pid: int
    ppid: int
    own_s: float
    children_s: float
    started_s: float
    """Start time in seconds after boot (what ``/proc/uptime`` counts)."""


def parse_stat(pid: int, text: str) -> Stat:
    # The command name (field 2) may hold spaces and parentheses; the fields after its last ')' are fixed:
    # state is field 3 of proc(5), ppid 4, utime 14, stime 15, cutime 16, cstime 17, starttime 22.
    fields = text.rsplit(")", 1)[1].split()
    return Stat(
        pid=pid,
        ppid=int(fields[1]),
        own_s=(int(fields[11]) + int(fields[12])) / TICKS_PER_S,
        children_s=(int(fields[13]) + int(fields[14])) / TICKS_PER_S,
        started_s=int(fields[19]) / TICKS_PER_S,
    )


def role_of(command: bytes, *, root: bool) -> str:
    """The part of ``dagster dev``'s tree a process is, from its command line."""
    if root:
        return "dagster_dev"
    for needle, role in ROLES:
        if needle in command:
            return role
    return RUNS


def part_of_role(role: str) -> str:
    """Roles as the totals can tell them apart (see the module docstring)."""
    return CODE_SERVER_AND_RUNS if role in (CODE_SERVER, RUNS, SPARK_IN_RUNS) else role


def uptime_s() -> float:
    """Seconds since boot, the clock of ``Stat.started_s``."""
    return float((PROC / "uptime").read_text().split()[0])


def read_stats() -> dict[int, Stat]:
    """Every readable process's ``Stat`` (processes exiting meanwhile are skipped)."""
    out: dict[int, Stat] = {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            out[pid] = parse_stat(pid, (PROC / entry.name / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(stats: Mapping[int, Stat], root: int) -> list[int]:
    """``root`` and its live descendants, from one reading of every process."""
    if root not in stats:
        return []
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, ()))
    return tree


def command_of(pid: int) -> bytes:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").strip()
    except OSError:
        return b""


def cpu_by_part(roots: Mapping[str, int]) -> dict[str, float]:
    """Total CPU seconds so far (own + waited-for children) of each part: ``{name: root PID}`` trees, where
    the tree named ``dagster_dev`` is split by role. Differences of two readings are exact over the interval
    for processes whose parent reaps them."""
    stats = read_stats()
    out: dict[str, float] = {}
    for name, root in roots.items():
        for pid in descendants(stats, root):
            stat = stats[pid]
            part = part_of_role(role_of(command_of(pid), root=pid == root)) if name == "dagster_dev" else name
            out[part] = out.get(part, 0.0) + stat.own_s + stat.children_s
    return out


def difference(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {part: round(cpu - before.get(part, 0.0), 2) for part, cpu in sorted(after.items())}


@dataclass
class Seen:
    """One process as the sampler saw it over its life (or over the sampling)."""

    pid: int
    started_s: float
    parent: tuple[int, float] | None
    role: str
    first_own_s: float
    last_own_s: float
    first_children_s: float
    last_children_s: float
    alive: bool = True


@dataclass
class TreeSampler:
    """Reads the own CPU of every process of ``root``'s tree every ``interval_s`` in a thread of its own."""

    root: int
    interval_s: float = 0.5
    seen: dict[tuple[int, float], Seen] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> TreeSampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        stats = read_stats()
        tree = descendants(stats, self.root)
        keys = {pid: (pid, stats[pid].started_s) for pid in tree}
        with self._lock:
            for entry in self.seen.values():
                entry.alive = False
            for pid in tree:
                stat, key = stats[pid], keys[pid]
                entry_or_none = self.seen.get(key)
                if entry_or_none is None:
                    parent = keys.get(stat.ppid)
                    role = role_of(command_of(pid), root=pid == self.root)
                    entry_or_none = Seen(
                        pid, stat.started_s, parent, role, stat.own_s, stat.own_s, stat.children_s, stat.children_s
                    )
                    self.seen[key] = entry_or_none
                entry_or_none.last_own_s = stat.own_s
                entry_or_none.last_children_s = stat.children_s
                entry_or_none.alive = True

    def snapshot(self) -> dict[tuple[int, float], Seen]:
        with self._lock:
            return {key: Seen(**vars(entry)) for key, entry in self.seen.items()}


def run_processes(seen: Mapping[tuple[int, float], Seen], born_after_s: float) -> list[tuple[int, float]]:
    """Run processes started after ``born_after_s`` (seconds since boot): processes of the ``runs`` role
    started then whose parent is not such a process itself (the code server, or a launcher process that was
    already running, started them)."""
    out = []
    for key, entry in seen.items():
        if entry.role != RUNS or entry.started_s < born_after_s:
            continue
        parent = seen.get(entry.parent) if entry.parent is not None else None
        if parent is None or parent.role not in (RUNS, SPARK_IN_RUNS) or parent.started_s < born_after_s:
            out.append(key)
    return out


def run_cpu(seen: Mapping[tuple[int, float], Seen], run: tuple[int, float]) -> tuple[float, float]:
    """Own CPU seconds of a run process and of its descendants over their lives: (outside Spark, in a local
    Spark the run started)."""
    children: dict[tuple[int, float], list[tuple[int, float]]] = {}
    for key, entry in seen.items():
        if entry.parent is not None:
            children.setdefault(entry.parent, []).append(key)
    outside = spark = 0.0
    pending = [run]
    while pending:
        key = pending.pop()
        entry = seen[key]
        if entry.role == SPARK_IN_RUNS:
            spark += entry.last_own_s
        else:
            outside += entry.last_own_s
        pending.extend(children.get(key, ()))
    return outside, spark


@dataclass(frozen=True)
class RunCpu:
    """CPU seconds of the code server and the run processes over a window (see ``run_cpu_figures``)."""

    per_run_outside_spark_s: list[float]
    """Each run process's own CPU (and its non-Spark descendants') plus an equal share of ``shared_s``."""
    run_processes: int
    shared_s: float
    """Own CPU of the code server and of launcher processes started before the window (sensor ticks, run
    launches), split equally over the runs."""
    local_spark_s: float
    """CPU of Spark processes the runs started themselves (classic ``local[N]`` sessions), outside the figure."""
    sampled_runs_s: float
    reaped_children_s: float
    """The same runs as their parents' accounting saw them (children reaped by the code server): a check
    of ``sampled_runs_s`` (which misses each process's last ``interval_s``)."""


def run_cpu_figures(seen: Mapping[tuple[int, float], Seen], window_start_s: float, runs: int) -> RunCpu:
    """CPU of the runs started after ``window_start_s``, per run, from a sampler started at that moment."""
    roots = run_processes(seen, window_start_s)
    figures = [run_cpu(seen, root) for root in roots]
    long_lived = [e for e in seen.values() if e.role in (CODE_SERVER, RUNS) and e.started_s < window_start_s]
    shared = sum(e.last_own_s - e.first_own_s for e in long_lived)
    reaped = sum(e.last_children_s - e.first_children_s for e in long_lived)
    share = shared / runs if runs else 0.0
    per_run = [outside + share for outside, _ in figures] if figures else ([share] * runs)
    return RunCpu(
        per_run_outside_spark_s=per_run,
        run_processes=len(roots),
        shared_s=shared,
        local_spark_s=sum(spark for _, spark in figures),
        sampled_runs_s=sum(outside + spark for outside, spark in figures),
        reaped_children_s=reaped,
    )


def wait_until_exited(sampler: TreeSampler, runs: Iterable[tuple[int, float]], timeout_s: float) -> bool:
    """Wait (sampling on) until the run processes have exited, at most ``timeout_s``."""
    wanted = list(runs)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = sampler.snapshot()
        if not any(seen[key].alive for key in wanted if key in seen):
            return True
        time.sleep(sampler.interval_s)
    return False
