"""Where a deployment's CPU goes, from Linux ``/proc``: by part, and per run process.

Two ways of counting, because run processes come and go between readings:

- **totals** (``cpu_by_part``): the user + system CPU of every live process of a tree *plus* that of the
  children each one has waited for (``cutime``/``cstime``). A run process that exits is reaped by the code
  server, so its whole CPU moves into the code server's children's time: the sum over a tree is exact over
  an interval, but runs and code server can only be told apart as one part.
- **per process** (``TreeSampler``): each process's own user + system time, read every ``interval_s``
  until it disappears, keyed by (PID, start time). A run's figure is the last reading of its worker process
  and of its non-Spark descendants, so it misses at most the CPU of its last ``interval_s`` (process exit).
  The worker's parent reaps it, and the parent's children's time then holds the worker's whole CPU: the
  difference between the two is the *tail* the sampling missed, added back per parent (``run_cpu_figures``).

Run workers are found in two ways. ``ForkServerRunLauncher`` names each run's worker in the run's
``streamgroup/run_worker`` tag (PID and start time in clock ticks); the worker is a forked child of a fork
server, itself a child of the daemon. Dagster's default launcher names none; its workers are the topmost
processes started by the code server after the window opened (``run_processes``).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK")

CODE_SERVER = "code_server"
FORK_SERVER = "fork_server"
DAEMON = "daemon"
RUNS = "runs"
SPARK_IN_RUNS = "spark_in_runs"
CODE_SERVER_AND_RUNS = "code_server_and_runs"

ROLES: tuple[tuple[bytes, str], ...] = (
    (b"dagster._daemon", DAEMON),
    (b"dagster-daemon", DAEMON),
    (b"dagster_webserver", "webserver"),
    (b"dagster-webserver", "webserver"),
    (b"code-server start", CODE_SERVER),
    (b"api grpc", CODE_SERVER),
    (b"dagster_streamgroup.launcher.forkserver", FORK_SERVER),
    (b"org.apache.spark", SPARK_IN_RUNS),
    (b"pyspark.daemon", SPARK_IN_RUNS),
    (b"pyspark.worker", SPARK_IN_RUNS),
    (b"pyspark/daemon", SPARK_IN_RUNS),
    (b"pyspark/worker", SPARK_IN_RUNS),
)
"""Command-line fragments of the processes of ``dagster dev`` by role; the root is ``dagster_dev`` and any
other process is part of a run (the run worker, its log tailers, a local Spark it started). A forked run worker
keeps its fork server's command line: it is told apart by its parent (``role_of``)."""


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


def role_of(command: bytes, *, root: bool, parent_role: str | None = None) -> str:
    """The part of ``dagster dev``'s tree a process is, from its command line (and its parent's role: a
    child of a fork server has the server's command line but is a run worker)."""
    if root:
        return "dagster_dev"
    for needle, role in ROLES:
        if needle in command:
            return RUNS if role == FORK_SERVER and parent_role == FORK_SERVER else role
    return RUNS


def part_of_role(role: str) -> str:
    """Roles as the totals can tell them apart (see the module docstring): a fork server reaps its runs, so
    its totals hold theirs."""
    return CODE_SERVER_AND_RUNS if role in (CODE_SERVER, FORK_SERVER, RUNS, SPARK_IN_RUNS) else role


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
    own_at_first_child_s: float | None = None
    """Own CPU when a child of this process was first seen: for a fork server started while sampling, the
    end of its preload (it forks only once loaded)."""


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
                    # ``descendants`` lists a parent before its children: it is in ``seen`` already.
                    parent_entry = self.seen.get(parent) if parent is not None else None
                    if parent_entry is not None and parent_entry.own_at_first_child_s is None:
                        parent_entry.own_at_first_child_s = stats[parent_entry.pid].own_s
                    role = role_of(
                        command_of(pid),
                        root=pid == self.root,
                        parent_role=parent_entry.role if parent_entry is not None else None,
                    )
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


def run_cpu(
    seen: Mapping[tuple[int, float], Seen], run: tuple[int, float], window_start_s: float = 0.0
) -> tuple[float, float]:
    """Own CPU seconds of a run process and of its descendants over their lives, or, for a process that started
    before ``window_start_s`` (a worker that ran earlier runs), over the window: (outside Spark, in a local
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
        spent = entry.last_own_s - (entry.first_own_s if entry.started_s < window_start_s else 0.0)
        if entry.role == SPARK_IN_RUNS:
            spark += spent
        else:
            outside += spent
        pending.extend(children.get(key, ()))
    return outside, spark


def worker_key(pid: int, start_ticks: int) -> tuple[int, float]:
    """The sampler's key of the process a ``streamgroup/run_worker`` tag names (PID, start in clock ticks)."""
    return pid, start_ticks / TICKS_PER_S


@dataclass(frozen=True)
class Worker:
    """A run's worker as its ``streamgroup/run_worker`` tag names it."""

    pid: int
    start_ticks: int
    via: str
    """``fork`` (a child of the fork server ``server_pid``) or ``spawn`` (a child of the launcher's process)."""
    server_pid: int | None = None


@dataclass(frozen=True)
class RunCpu:
    """CPU seconds of the runs' workers, the code server, the daemon and the fork servers over a window (see
    ``run_cpu_figures``)."""

    per_run_outside_spark_s: list[float]
    """Each run's worker (and its non-Spark descendants) sampled, plus its share of its reaper's tail, plus an
    equal share of ``shared_s``."""
    runs: int
    via: dict[str, int]
    """How the runs' workers were started: ``fork``/``spawn`` (tagged), ``untagged`` (Dagster's launchers)."""
    workers_sampled: int
    """Runs whose worker the sampler saw alive at least once."""
    sampled_s: float
    """Own CPU of the runs' workers and descendants as last sampled (Spark included)."""
    reaped_s: float
    """The children's time their reapers (fork servers, code server) gained over the window."""
    tail_s: float
    """``reaped_s`` minus the sampled CPU of those reapers' runs (when positive): what the sampling missed."""
    code_server_s: float
    """Own CPU of the code server over the window (sensor ticks, run launches of Dagster's default launcher)."""
    daemon_s: float
    """Own CPU of the daemon over the window: it creates the runs its sensors request and, with the project's
    coordinator and launcher, launches them (the fork request); its loops of other daemons come with it."""
    fork_server_s: float
    """Own CPU of the fork servers over the window, after their preload (forks, reaping)."""
    fork_server_preload_s: float
    """Own CPU of fork servers started during the window until they first forked (a code change or a reloaded
    location replaced a server): a one-time cost, outside the per-run figure."""
    fork_servers_started: int
    local_spark_s: float
    """CPU of Spark processes the runs started themselves (classic ``local[N]`` sessions), outside the figure."""

    @property
    def shared_s(self) -> float:
        return self.code_server_s + self.daemon_s + self.fork_server_s


def _fork_server_cpu(entry: Seen, window_start_s: float) -> tuple[float, float]:
    """(serving, preload) own CPU of a fork server over the window, from the sampler's readings."""
    if entry.started_s < window_start_s:
        return entry.last_own_s - entry.first_own_s, 0.0
    loaded = entry.last_own_s if entry.own_at_first_child_s is None else entry.own_at_first_child_s
    return entry.last_own_s - loaded, loaded - entry.first_own_s


def run_cpu_figures(
    seen: Mapping[tuple[int, float], Seen], window_start_s: float, workers: Sequence[Worker | None]
) -> RunCpu:
    """Per-run CPU of the runs created in a window, from a sampler started when the window opened (its first
    readings are the window's start: what a process spent before, a fork server's preload above all, is not
    counted). ``workers`` holds one entry per run: its tagged worker, or None for a run of a launcher that
    tags none, whose worker is then one of ``run_processes``.

    What the runs cost outside their own processes is shared equally among them: the code server's own CPU
    (sensor ticks), the fork servers' (forks, reaping) and the daemon's. The daemon creates the runs the
    ticks request and, with ``MemberRunCoordinator`` and ``ForkServerRunLauncher``, launches them; leaving
    it out undercounts a run by what its creation and launch cost (it has other loops too, which a run-free
    window would show: those are counted, not subtracted)."""
    tagged = {worker_key(w.pid, w.start_ticks) for w in workers if w is not None}
    untagged_roots = sorted(
        (key for key in run_processes(seen, window_start_s) if key not in tagged), key=lambda k: seen[k].started_s
    )
    code_servers = [key for key, e in seen.items() if e.role == CODE_SERVER]

    # Each run: its worker's key if sampled, and the process that reaps it (whose children's time holds it).
    own: list[tuple[float, float]] = []
    reaper_of: list[tuple[int, float] | None] = []
    alive_at_end: list[bool] = []
    # A worker that runs several runs one after another (``runs_per_worker``) is named by each of their tags:
    # its CPU over the window is split among the runs it ran in the window.
    runs_of = Counter(worker_key(w.pid, w.start_ticks) for w in workers if w is not None)
    via: dict[str, int] = {}
    spare_roots = iter(untagged_roots)
    for worker in workers:
        how = worker.via if worker is not None else "untagged"
        via[how] = via.get(how, 0) + 1
        key: tuple[int, float] | None
        if worker is not None:
            key = worker_key(worker.pid, worker.start_ticks)
            if key not in seen:
                key = None
                servers = [k for k, e in seen.items() if e.role == FORK_SERVER and e.pid == worker.server_pid]
                reaper_of.append(max(servers, key=lambda k: k[1]) if worker.via == "fork" and servers else None)
        else:
            key = next(spare_roots, None)
            if key is None:
                reaper_of.append(code_servers[0] if len(code_servers) == 1 else None)
        if key is not None:
            outside, spark = run_cpu(seen, key, window_start_s)
            shared_by = runs_of.get(key, 1)
            own.append((outside / shared_by, spark / shared_by))
            alive_at_end.append(seen[key].alive)
            parent = seen[key].parent
            usable = parent is not None and parent in seen and seen[parent].role in (CODE_SERVER, FORK_SERVER)
            reaper_of.append(parent if usable else None)
        else:
            own.append((0.0, 0.0))
            alive_at_end.append(False)
    extra_roots = list(spare_roots)  # more topmost processes than untagged runs: counted, as runs of their own
    for key in extra_roots:
        own.append(run_cpu(seen, key))
        reaper_of.append(None)
        alive_at_end.append(seen[key].alive)

    tail_share = [0.0] * len(own)
    reaped_total = tail_total = 0.0
    for reaper in {r for r in reaper_of if r is not None}:
        mine = [i for i, r in enumerate(reaper_of) if r == reaper]
        reaped = seen[reaper].last_children_s - seen[reaper].first_children_s
        # Only exited children's time reaches their reaper: a worker still alive (idle for its next run) is not in it.
        tail = max(0.0, reaped - sum(sum(own[i]) for i in mine if not alive_at_end[i]))
        reaped_total += reaped
        tail_total += tail
        for i in mine:
            tail_share[i] = tail / len(mine)

    code_server_s = sum(seen[key].last_own_s - seen[key].first_own_s for key in code_servers)
    # The daemon's own time only: its children's time would hold a fork server that exited (its preload).
    daemon_s = sum(e.last_own_s - e.first_own_s for e in seen.values() if e.role == DAEMON)
    fork = [_fork_server_cpu(e, window_start_s) for e in seen.values() if e.role == FORK_SERVER]
    fork_server_s = sum(serving for serving, _ in fork)
    share = (code_server_s + daemon_s + fork_server_s) / len(own) if own else 0.0
    return RunCpu(
        per_run_outside_spark_s=[outside + tail + share for (outside, _), tail in zip(own, tail_share, strict=True)],
        runs=len(own),
        via=via,
        workers_sampled=sum(1 for w in workers if w is not None and worker_key(w.pid, w.start_ticks) in seen)
        + len(untagged_roots),
        sampled_s=sum(outside + spark for outside, spark in own),
        reaped_s=reaped_total,
        tail_s=tail_total,
        code_server_s=code_server_s,
        daemon_s=daemon_s,
        fork_server_s=fork_server_s,
        fork_server_preload_s=sum(preload for _, preload in fork),
        fork_servers_started=sum(1 for e in seen.values() if e.role == FORK_SERVER and e.started_s >= window_start_s),
        local_spark_s=sum(spark for _, spark in own),
    )


def wait_until_exited(
    sampler: TreeSampler, runs: Iterable[tuple[int, float]], timeout_s: float, idle_s: float = 1.0
) -> bool:
    """Wait (sampling on) until the run processes have exited or gone idle, at most ``timeout_s``. Called once
    the runs ended: a worker that stays for its next run (``runs_per_worker``) counts as done once its own CPU
    has not moved for ``idle_s`` (CPU it spends after that, before its next run, is not counted)."""
    wanted = list(runs)
    deadline = time.monotonic() + timeout_s
    last_moved: dict[tuple[int, float], tuple[float, float]] = {}
    while time.monotonic() < deadline:
        seen, now = sampler.snapshot(), time.monotonic()
        busy = False
        for key in wanted:
            entry = seen.get(key)
            if entry is None or not entry.alive:
                continue
            cpu, since = last_moved.get(key, (-1.0, now))
            if cpu != entry.last_own_s:
                last_moved[key] = (entry.last_own_s, now)
                busy = True
            elif now - since < idle_s:
                busy = True
        if not busy:
            return True
        time.sleep(sampler.interval_s)
    return False
