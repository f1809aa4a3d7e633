"""The faults of a chaos run: a seeded plan (pure) and the action that injects each kind into the deployment.

Some faults are over when their action returns (a SIGKILL and restart, a launcher outage, a held state write, a
member removed, a burst into the second group); others go on in the background (a paused run, a stopped
sensor, CAS hammering, poison records waiting to be parked and unparked) while the next faults are injected,
and are ended by ``Chaos.finish_background``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos import recorder
from bench.chaos.check import COMMIT_WAIT_S, names_refused
from bench.chaos.deployment import DEFINITIONS, ChaosDeployment
from bench.chaos.hammer import no_op
from bench.chaos.launcher import RefusedLaunch, read_refused
from bench.chaos.producer import ChaosProducer
from dagster_streamgroup.dagster.devserver import ROOT
from dagster_streamgroup.launcher import RunWorker
from dagster_streamgroup.local import procfs
from dagster_streamgroup.member import ContentionError, update_state
from dagster_streamgroup.protocol import GroupState
from dagster_streamgroup.stores.sql_log import LoggedSqlStateStore

KINDS = (
    "run_kill_before_commit",
    "run_kill_after_commit",
    "daemon_restart",
    "code_server_restart",
    "spark_connect_restart",
    "state_store_restart",
    "sensor_stop_start",
    "run_pause",
    "run_pause_zombie",
    "broker_restart",
    "poison",
    "cas_hammer",
    "launcher_outage",
    "store_writer_pause",
    "member_removed",
    "two_groups",
)
"""``run_pause``: a run SIGSTOPped longer than the session timeout, then resumed. ``run_pause_zombie``: a run
held after its read, before its commit, SIGSTOPped with its member sensor stopped until every shard of the run
moved to a new epoch (the member left; the drain ended, once the stopped run no longer reported itself alive or
the drain timeout passed; the range was handed out to be launched again), so the resumed run is a zombie whose
commit must be refused. ``launcher_outage``: every launch raises for 15-30 s. ``store_writer_pause``: one state
write held between its load and its save while the state is written and folded past it. ``member_removed``: a
member sensor stopped for good. ``two_groups``: a burst of records into the second group that shares the code
location, consumed while the main group's faults go on."""

ONCE = frozenset({"member_removed"})
"""Kinds a run injects at most once: a member removed for good cannot be removed again, and removing one per
draw would leave the group without members."""

ZOMBIE_MOVE_LIMIT_S = 300.0
"""How long the zombie fault waits for its run's shards to move to a new epoch before it resumes the run anyway
(and reports an error): 20-25 s in the short setting (the run's liveness timeout), at most the member's leave
plus the drain timeout (about a minute) with the chaos settings."""


def plan(count: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[str]:
    """``count`` fault kinds: every kind once (shuffled) while ``count`` allows, then drawn at random among the
    kinds not in ``ONCE``."""
    rng = random.Random(seed)
    first = list(kinds)
    rng.shuffle(first)
    again = [k for k in kinds if k not in ONCE]
    if not again:
        return first[:count]
    return (first + [rng.choice(again) for _ in range(max(0, count - len(kinds)))])[:count]


class NothingToActOn(Exception):  # noqa: N818 (an outcome, not an error)
    """A fault found nothing to act on (no run in flight to kill or pause, no launch to refuse): the stream was
    quiet at that moment. The driver gives it another moment, after more records (``schedule``), instead of
    counting it missed: a missed fault fails the run, and must mean the fault could not land, not bad timing."""


@dataclass
class Injected:
    kind: str
    at: float
    hit: bool
    detail: str


@dataclass
class Chaos:
    """The faults' shared context: the deployment, the producer and everything still going on."""

    deployment: ChaosDeployment
    producer: ChaosProducer
    rng: random.Random
    started: float
    second_producer: ChaosProducer | None = None
    """The second group's producer (``two_groups``)."""
    injected: list[Injected] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    paused: set[int] = field(default_factory=set)
    stopped_sensors: set[str] = field(default_factory=set)
    removed_sensors: set[str] = field(default_factory=set)
    """Member sensors stopped for good (``member_removed``): never started again, not even by the drain."""
    hammers: list[subprocess.Popen[str]] = field(default_factory=list)
    hammer_results: list[dict[str, int]] = field(default_factory=list)
    poison_pending: set[str] = field(default_factory=set)
    poison_watcher: bool = False
    parked_seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    parks: set[tuple[str, int, int]] = field(default_factory=set)
    """Every parked or dead-lettered range the driver saw, resolved or not: each must hold a poison record."""
    park_reasons: dict[tuple[str, int, int], str] = field(default_factory=dict)
    """Why each of ``parks`` was parked, as the group state says (the last error): one that names a launch the
    outage refused was counted as an attempt."""
    refused: list[RefusedLaunch] = field(default_factory=list)
    """Launches refused by ``launcher_outage``."""
    zombies: list[str] = field(default_factory=list)
    """Run ids of the zombies made: each must end with its commit refused."""
    unparked: list[tuple[str, int, int]] = field(default_factory=list)
    backfilled: list[tuple[str, int, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def work(self) -> Path:
        return self.deployment.records_dir

    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {message}", flush=True)

    def note(self, kind: str, hit: bool, detail: str) -> None:
        with self.lock:
            self.injected.append(Injected(kind, time.monotonic() - self.started, hit, detail))
        self.log(f"fault {kind}: {'injected' if hit else 'MISSED'}: {detail}")

    def counts(self, hit: bool = True) -> dict[str, int]:
        return dict(Counter(i.kind for i in self.injected if i.hit == hit))

    def background(self, name: str, target: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                target()
            except Exception as exc:  # a background fault that fails is reported, never silent
                self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                self.log(f"background {name} failed: {exc}")

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def state(self, second: bool = False) -> GroupState | None:
        """The main group's state (with ``second``: the second group's)."""
        return self.deployment.resource(second).member("chaos-observer").load()

    def state_of(self, group: str | None) -> GroupState | None:
        """The state of the group named ``group`` (either group of the deployment; None for another)."""
        if group == self.deployment.group_name:
            return self.state()
        if group == self.deployment.second_group:
            return self.state(second=True)
        return None

    # Holding runs between their read and their commit.

    def hold_one(
        self, timeout_s: float = 120.0, accept: Callable[[recorder.HeldRun], bool] = lambda _: True
    ) -> recorder.HeldRun | None:
        """Hold runs at the end of the function; the first held run whose process is alive and that ``accept``
        takes."""
        (self.work / recorder.HOLD).touch()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for held in recorder.held_runs(self.work):
                if procfs.alive([held.pid]) and accept(held):
                    return held
            time.sleep(0.05)
        return None

    def unhold(self) -> None:
        (self.work / recorder.HOLD).unlink(missing_ok=True)
        for held in recorder.held_runs(self.work):
            recorder.release(self.work, held.run_id)

    # Sensors.

    def stop_sensor(self, name: str) -> bool:
        with self.lock:
            if name in self.stopped_sensors or name in self.removed_sensors:
                return False
            self.stopped_sensors.add(name)
        self.deployment.stop_sensor(name)
        return True

    def start_sensor(self, name: str, timeout_s: float = 240.0) -> None:
        """Start a sensor again, waiting out a webserver that another fault is restarting; never one removed for
        good."""
        with self.lock:
            if name in self.removed_sensors:
                self.stopped_sensors.discard(name)
                return
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.deployment.start_sensor(name)
                break
            except (OSError, RuntimeError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(2.0)
        with self.lock:
            self.stopped_sensors.discard(name)

    def running_sensors(self) -> list[str]:
        with self.lock:
            return [
                s for s in self.deployment.sensors() if s not in self.stopped_sensors and s not in self.removed_sensors
            ]

    # Ending everything that goes on in the background.

    def finish_background(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for pid in list(self.paused):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.paused.clear()
        for name in list(self.stopped_sensors):
            with contextlib.suppress(Exception):
                self.start_sensor(name)
        for proc in self.hammers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                for line in out.splitlines()[-1:]:
                    with contextlib.suppress(ValueError):
                        self.hammer_results.append(json.loads(line))
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.hammers.clear()
        self.unhold()
        # The synchronous faults end their switches themselves; an action that raised midway may not have.
        self.deployment.outage_file.unlink(missing_ok=True)
        self.deployment.pause_file.unlink(missing_ok=True)
        for claim in self.deployment.faults_dir.glob(f"{self.deployment.pause_file.name}.held.*"):
            claim.unlink(missing_ok=True)


# The actions, one per kind. Each returns (hit, detail).


def run_kill_before_commit(chaos: Chaos) -> tuple[bool, str]:
    held = chaos.hold_one()
    try:
        if held is None:
            raise NothingToActOn("no run reached the end of its function in time")
        os.kill(held.pid, signal.SIGKILL)
        return True, f"run {held.run_id} (pid {held.pid}) killed after its read, before its commit: {held.ranges}"
    finally:
        chaos.unhold()


def run_kill_after_commit(chaos: Chaos) -> tuple[bool, str]:
    """Hold a run at the end of its function, pause the broker, let the run commit (the group state is in
    PostgreSQL), and SIGKILL it while it waits on the broker to mirror the offsets, before Dagster recorded
    its materializations."""
    held = chaos.hold_one()
    if held is None:
        chaos.unhold()
        raise NothingToActOn("no run reached the end of its function in time")
    broker = chaos.deployment.broker
    broker.pause()
    try:
        recorder.release(chaos.work, held.run_id)
        shards = {shard for shard, _, _ in held.ranges}
        committed = False
        deadline = time.monotonic() + COMMIT_WAIT_S
        while time.monotonic() < deadline and procfs.alive([held.pid]):
            state = chaos.state()
            if state is not None and all(
                state.shards[s].last_run_key == held.run_key for s in shards if s in state.shards
            ):
                committed = True
                break
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError):
            os.kill(held.pid, signal.SIGKILL)
    finally:
        broker.resume()
        chaos.unhold()
    if not committed:
        return False, f"run {held.run_id} did not commit within {COMMIT_WAIT_S:.0f} s (refused or died); killed anyway"
    return (
        True,
        f"run {held.run_id} (pid {held.pid}) killed after its commit, before its materialization: {held.ranges}",
    )


def daemon_restart(chaos: Chaos) -> tuple[bool, str]:
    started = time.monotonic()
    chaos.deployment.restart_dagster_after_daemon_kill()
    return True, f"daemon SIGKILLed, dagster dev back after {time.monotonic() - started:.0f} s"


def code_server_restart(chaos: Chaos) -> tuple[bool, str]:
    started = time.monotonic()
    pid = chaos.deployment.restart_code_server()
    return True, f"gRPC code server {pid} SIGKILLed, location reloaded after {time.monotonic() - started:.0f} s"


def spark_connect_restart(chaos: Chaos) -> tuple[bool, str]:
    started = time.monotonic()
    chaos.deployment.kill_connect_server()
    time.sleep(chaos.rng.uniform(1.0, 3.0))
    chaos.deployment.restart_connect_server()
    return True, f"Spark Connect server SIGKILLed, back (warmed up) after {time.monotonic() - started:.0f} s"


def state_store_restart(chaos: Chaos) -> tuple[bool, str]:
    down = chaos.rng.uniform(1.0, 6.0)
    chaos.deployment.postgres.kill()
    time.sleep(down)
    started = time.monotonic()
    chaos.deployment.postgres.start()
    return True, f"PostgreSQL SIGKILLed, down {down:.1f} s, crash recovery {time.monotonic() - started:.1f} s"


def broker_restart(chaos: Chaos) -> tuple[bool, str]:
    down = chaos.rng.uniform(1.0, 5.0)
    chaos.deployment.broker.kill()
    time.sleep(down)
    chaos.deployment.broker.start()
    return True, f"broker SIGKILLed, down {down:.1f} s, restarted on its data directory (log recovery)"


def sensor_stop_start(chaos: Chaos) -> tuple[bool, str]:
    candidates = chaos.running_sensors()
    if not candidates:
        return False, "every member sensor is already stopped by another fault"
    name = chaos.rng.choice(candidates)
    if not chaos.stop_sensor(name):
        return False, f"{name} already stopped"
    off = chaos.rng.uniform(5.0, 2 * chaos.deployment.group.session_timeout_s)

    def later() -> None:
        chaos.stopping.wait(off)
        chaos.start_sensor(name)
        chaos.log(f"sensor {name} started again after {off:.0f} s")

    chaos.background(f"start {name}", later)
    return True, f"{name} stopped over GraphQL for {off:.0f} s"


def _running_worker(chaos: Chaos, timeout_s: float = 90.0) -> tuple[dict[str, Any], RunWorker] | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            for run in chaos.deployment.dev.runs():
                if run["status"] != "STARTED":
                    continue
                worker = RunWorker.from_tags(run["tags"])
                if worker is not None and worker.pid not in chaos.paused and procfs.alive([worker.pid]):
                    return run, worker
        time.sleep(1.0)
    return None


def run_pause(chaos: Chaos) -> tuple[bool, str]:
    found = _running_worker(chaos)
    if found is None:
        raise NothingToActOn("no run in progress to pause")
    run, worker = found
    pause = chaos.deployment.group.session_timeout_s + chaos.rng.uniform(2.0, 8.0)
    os.kill(worker.pid, signal.SIGSTOP)
    chaos.paused.add(worker.pid)

    def resume() -> None:
        chaos.stopping.wait(pause)
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGCONT)
        chaos.paused.discard(worker.pid)
        chaos.log(f"run {run['runId']} resumed after {pause:.0f} s")

    chaos.background(f"resume {run['runId']}", resume)
    return True, f"run {run['runId']} (pid {worker.pid}) SIGSTOPped for {pause:.0f} s"


def run_pause_zombie(chaos: Chaos) -> tuple[bool, str]:
    """A run held after its read and its function, before its commit, is SIGSTOPped there and its member sensor
    stopped; it is resumed once every shard of it moved to a new epoch. Pausing it at that point, and not
    wherever a running run happens to be, is what makes it a zombie every time: a run paused after its commit,
    or one that fails on its own once resumed, would never show its commit refused."""

    def sensor_of(held: recorder.HeldRun) -> str:
        return (held.member or "").partition("@")[0]

    held = chaos.hold_one(accept=lambda h: sensor_of(h) in chaos.running_sensors())
    try:
        if held is None:
            raise NothingToActOn("no run of a running member sensor reached the end of its function in time")
        sensor = sensor_of(held)
        state = chaos.state()
        shards = sorted({shard for shard, _, _ in held.ranges})
        epochs = {s: state.shards[s].epoch for s in shards} if state is not None else {}
        if not sensor or not chaos.stop_sensor(sensor):
            return False, f"the member sensor {sensor!r} of run {held.run_id} is stopped already"
        os.kill(held.pid, signal.SIGSTOP)
        chaos.paused.add(held.pid)
    finally:
        chaos.unhold()  # the others go on; the stopped run sees its hold released once it is resumed
    with chaos.lock:
        chaos.zombies.append(held.run_id)
    paused_at = time.monotonic()

    def moved() -> bool:
        state = None
        with contextlib.suppress(Exception):  # the store may be down in another fault: ask again
            state = chaos.state()
        return state is not None and all(state.shards[s].epoch > epochs.get(s, -1) for s in shards)

    def resume() -> None:
        deadline = paused_at + ZOMBIE_MOVE_LIMIT_S
        while not moved():
            if time.monotonic() > deadline or chaos.stopping.is_set():
                chaos.errors.append(
                    f"run_pause_zombie: the shards {shards} of run {held.run_id} did not move to a new epoch "
                    f"within {ZOMBIE_MOVE_LIMIT_S:.0f} s; resumed anyway"
                )
                break
            time.sleep(1.0)
        with contextlib.suppress(ProcessLookupError):
            os.kill(held.pid, signal.SIGCONT)
        chaos.paused.discard(held.pid)
        chaos.log(f"zombie run {held.run_id} resumed after {time.monotonic() - paused_at:.0f} s")
        chaos.start_sensor(sensor)

    chaos.background(f"resume {held.run_id}", resume)
    return True, (
        f"run {held.run_id} (pid {held.pid}) SIGSTOPped after its read, before its commit, and its member sensor "
        f"{sensor} stopped, until its shards {shards} move to a new epoch"
    )


def cas_hammer(chaos: Chaos, processes: int = 2) -> tuple[bool, str]:
    seconds = chaos.rng.uniform(15.0, 30.0)
    resource = chaos.deployment.resource()
    env = {
        **os.environ,
        "CHAOS_STORE_URL": chaos.deployment.postgres.url,
        "CHAOS_STATE_KEY": resource.state_key(),
        "PYTHONPATH": str(ROOT),
    }
    for _ in range(processes):
        chaos.hammers.append(
            subprocess.Popen(
                [sys.executable, "-m", "bench.chaos.hammer", "--seconds", f"{seconds:.1f}"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    return True, f"{processes} processes writing the state under CAS for {seconds:.0f} s"


def poison(chaos: Chaos, per_partition: int = 3) -> tuple[bool, str]:
    """Poison records into one partition with the switch on; the watcher parks, switches off, unparks."""
    partitions = chaos.deployment.group.partitions
    topic = chaos.deployment.topic
    with chaos.lock:
        free = [p for p in range(partitions) if f"{topic}:{p}" not in chaos.poison_pending]
        if not free:
            return False, "every partition holds pending poison already"
        partition = chaos.rng.choice(free)
        shard = f"{topic}:{partition}"
        chaos.poison_pending.add(shard)
        (chaos.work / recorder.POISON_SWITCH).touch()
        start_watcher = not chaos.poison_watcher
        chaos.poison_watcher = True
    chaos.producer.poison([partition], per_partition)
    if start_watcher:
        chaos.background("poison watcher", lambda: watch_poison(chaos))
    return True, f"{per_partition} poison records in {shard}, switch on"


def cli(chaos: Chaos, arguments: list[str], group: str | None = None) -> str:
    """``streamgroup ...`` as an operator runs it, with the deployment's definitions and environment, on the main
    group or ``group``."""
    env = {**os.environ, **chaos.deployment.env()}
    command = [str(ROOT / ".venv/bin/streamgroup"), arguments[0], "--group", group or chaos.deployment.group_name]
    command += ["--definitions", str(DEFINITIONS), *arguments[1:]]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"streamgroup {' '.join(arguments)} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout.strip()


def unpark(chaos: Chaos, shard: str, retry_s: float = 90.0, group: str | None = None) -> str:
    """``streamgroup unpark``, tried again for a while when it fails, as an operator would: the command reads
    the cluster id to find the group's state, so it fails while a broker restart (another fault) is under way."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            return cli(chaos, ["unpark", "--shard", shard], group)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(3.0)


def watch_poison(chaos: Chaos, timeout_s: float = 900.0) -> None:
    """Once every poisoned shard is parked (or its range dead-lettered), switch poison off and resume the
    parked shards with ``streamgroup unpark``; ends when nothing is pending or parked."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            state = None
            with contextlib.suppress(Exception):
                state = chaos.state()
            if state is not None:
                parked = {sid: (s.parked.start, s.parked.end) for sid, s in state.shards.items() if s.parked}
                lettered = {d.shard for d in state.dead_letters}
                note_park_reasons(chaos, state)
                with chaos.lock:
                    chaos.parked_seen.update(parked)
                    chaos.parks.update((sid, start, end) for sid, (start, end) in parked.items())
                    chaos.parks.update((d.shard, d.start, d.end) for d in state.dead_letters)
                    ready = chaos.poison_pending <= set(parked) | lettered
                    if ready:
                        (chaos.work / recorder.POISON_SWITCH).unlink(missing_ok=True)
                        chaos.poison_pending -= set(parked) | lettered
                        if not parked:
                            chaos.poison_watcher = False
                            return
                if ready:
                    resolve_parked(chaos, parked)
                    resolve_dead_letters(chaos, [(d.shard, d.start, d.end) for d in state.dead_letters])
            time.sleep(2.0)
        raise TimeoutError(f"poisoned shards {sorted(chaos.poison_pending)} not parked within {timeout_s:.0f} s")
    finally:
        with chaos.lock:
            chaos.poison_watcher = False


def resolve_dead_letters(chaos: Chaos, letters: list[tuple[str, int, int]]) -> None:
    """What an operator does with a dead-lettered range: backfill it through Dagster (its function call is
    recorded like any other), then mark the dead letter resolved."""
    for shard, start, end in letters:
        if (shard, start, end) in chaos.backfilled:
            continue
        while chaos.deployment.outage_file.exists():  # a backfill's launch would be refused: wait the outage out
            time.sleep(1.0)
        chaos.backfilled.append((shard, start, end))
        backfill = ["backfill", "--shard", shard, "--from", str(start), "--to", str(end)]
        said = cli(chaos, [*backfill, "--dagster-url", chaos.deployment.dev.url])
        chaos.log(f"backfill {shard} [{start}, {end}): {said}")
        chaos.log(f"resolve {shard}: {cli(chaos, ['resolve', '--shard', shard])}")


def resolve_parked(chaos: Chaos, parked: dict[str, tuple[int, int]], group: str | None = None) -> None:
    for shard, (start, end) in sorted(parked.items()):
        with chaos.lock:
            chaos.parks.add((shard, start, end))
        chaos.log(f"unpark {shard} [{start}, {end}): {unpark(chaos, shard, group=group)}")
        chaos.unparked.append((shard, start, end))


def note_park_reasons(chaos: Chaos, state: GroupState) -> None:
    """Keep why each parked or dead-lettered range of ``state`` was given up (the check matches the reasons
    against the launches the outage refused)."""
    with chaos.lock:
        for sid, s in state.shards.items():
            if s.parked is not None:
                chaos.park_reasons[(sid, s.parked.start, s.parked.end)] = s.parked.reason
        for d in state.dead_letters:
            chaos.park_reasons[(d.shard, d.start, d.end)] = d.reason


# The launcher, the store's writers, the group's size, and a second group.

OUTAGE_LIMIT_S = 60.0
"""The longest a launcher outage lasts: past its drawn 15-30 s it goes on only until a launch was refused (a
quiet moment with nothing to launch would otherwise make it miss)."""
RELAUNCH_WATCH_S = 90.0
"""How long, once the outage is over, the fault follows the refused ranges: the member relaunches a range at
its next tick after the refusal (within a heartbeat), under a backoff of at most 60 s."""


def launcher_outage(chaos: Chaos) -> tuple[bool, str]:
    """Every launch raises for 15-30 s (``bench.chaos.launcher``: the launcher of every process reads the switch
    file). A launch that raised is not an attempt: its member relaunches the ranges under a new run key after a
    backoff, with the same attempt (``protocol.launch_failed``). Followed in the group state for each refused
    range until it is seen relaunched (the same bounds, ``relaunches`` >= 1, the attempt it was refused with), moved
    to another epoch, or committed. Hit: a launch refused, a range seen relaunched without an attempt counted,
    none seen retried as a failed attempt, and none parked or dead-lettered naming a refused run."""
    deployment = chaos.deployment
    known = {r.run_id for r in read_refused(deployment.faults_dir)}
    outage = chaos.rng.uniform(15.0, 30.0)
    outcomes: dict[tuple[str, str, int], str] = {}
    deployment.outage_file.touch()
    began = time.monotonic()
    try:
        while True:
            refused = [r for r in read_refused(deployment.faults_dir) if r.run_id not in known]
            _follow_refused(chaos, refused, outcomes)
            elapsed = time.monotonic() - began
            if elapsed >= outage and (refused or elapsed >= OUTAGE_LIMIT_S):
                break
            time.sleep(1.0)
    finally:
        deployment.outage_file.unlink(missing_ok=True)
    lasted = time.monotonic() - began
    refused = [r for r in read_refused(deployment.faults_dir) if r.run_id not in known]
    with chaos.lock:
        chaos.refused.extend(refused)
    if not refused:
        raise NothingToActOn(f"no launch was attempted during {lasted:.0f} s of launcher outage")
    ranges = {(r.run_id, x.shard, x.start) for r in refused for x in r.ranges}
    deadline = time.monotonic() + RELAUNCH_WATCH_S
    while set(outcomes) < ranges and time.monotonic() < deadline:
        _follow_refused(chaos, refused, outcomes)
        time.sleep(1.0)
    seen = Counter(outcomes.values())
    parked = [
        span
        for span, reason in sorted(chaos.park_reasons.items())
        if any(names_refused(reason, r.run_id, r.run_key) for r in refused)
    ]
    what = (
        f"launcher refused {len(refused)} launch(es) ({len(ranges)} ranges) during {lasted:.0f} s; ranges "
        f"{dict(seen)}, {len(ranges) - len(outcomes)} not followed to an end in {RELAUNCH_WATCH_S:.0f} s"
    )
    if parked:
        return False, f"{what}; parked or dead-lettered naming a refused run: {parked[:3]}"
    if seen["counted"] or not seen["relaunched"]:
        return False, f"{what}: no refused range was seen relaunched without counting an attempt"
    return True, what


def _follow_refused(chaos: Chaos, refused: list[RefusedLaunch], outcomes: dict[tuple[str, str, int], str]) -> None:
    """Classify each refused range, once, from its group's state: ``relaunched`` (in flight again with the same
    bounds and attempt under a relaunch), ``counted`` (in flight again with a higher attempt and no relaunch:
    the refusal was taken for a failed attempt), ``moved`` (its shard changed epoch, so the range was released
    for the next owner) or ``committed``."""
    states: dict[str | None, GroupState | None] = {}
    for launch in refused:
        if launch.group not in states:
            states[launch.group] = None
            with contextlib.suppress(Exception):  # another fault may have the store down: ask again
                states[launch.group] = chaos.state_of(launch.group)
            if (loaded := states[launch.group]) is not None:
                note_park_reasons(chaos, loaded)
        state = states[launch.group]
        if state is None:
            continue
        for x in launch.ranges:
            key = (launch.run_id, x.shard, x.start)
            shard = state.shards.get(x.shard)
            if key in outcomes or shard is None:
                continue
            inflight = shard.inflight
            if shard.committed is not None and shard.committed >= x.end:
                outcomes[key] = "committed"
            elif shard.epoch != x.epoch:
                outcomes[key] = "moved"
            elif inflight is not None and inflight.start == x.start and inflight.run_key != launch.run_key:
                if inflight.relaunches >= 1 and inflight.attempt == x.attempt:
                    outcomes[key] = "relaunched"
                elif inflight.attempt > x.attempt and inflight.relaunches == 0:
                    outcomes[key] = "counted"


PAUSE_CLAIM_S = 60.0
"""How long ``store_writer_pause`` waits for a state write to claim its pause (members write every tick)."""
FOLDS_UNDER_PAUSE = 3
"""Folds of the logged store the fault writes, at least, while the claimed write is held."""


def store_writer_pause(chaos: Chaos) -> tuple[bool, str]:
    """One state write of the deployment (a member tick, a run's commit or failure report, a leave: whichever
    process writes first) is held between its load and its ``save_if`` (``stores.pause_hook``) for 6-10 s, short
    of the session timeout, while the members go on writing and the fault writes no-op revisions through the
    members' CAS loop with a store that folds the log into the base row on each write, so the held writer's
    version is several folds behind. Hit: the held ``save_if`` was refused (the hook logs its result), the writer
    retried on fresh state. Accepted, it is a broken compare-and-set, reported as an error of the run."""
    deployment = chaos.deployment
    pause = deployment.pause_file
    log = Path(f"{pause}.log")
    logged = len(log.read_text().splitlines()) if log.exists() else 0
    pause.touch()
    try:
        claim, held = _claimed(deployment.faults_dir, pause.name, PAUSE_CLAIM_S)
        if claim is None or held is None:
            return False, f"no state write claimed the pause within {PAUSE_CLAIM_S:.0f} s"
        key, token = str(held["key"]), held["token"]
        hold_s = chaos.rng.uniform(6.0, 10.0)
        folder = LoggedSqlStateStore(deployment.postgres.url, min_fold_bytes=1, fold_fraction=0.0)
        writes = 0
        try:
            until = time.monotonic() + hold_s
            while (time.monotonic() < until or folder.folds < FOLDS_UNDER_PAUSE) and time.monotonic() < until + 30:
                with contextlib.suppress(ContentionError):
                    wrote, _ = update_state(folder, key, no_op, max_attempts=3, backoff_cap_s=0.05)
                    writes += int(wrote)
                time.sleep(0.3)
            _, now_token = folder.load(key)
            folds = folder.folds
        finally:
            folder.close()
            claim.unlink(missing_ok=True)  # the held write goes on
    finally:  # whatever happened, no write is held past the fault
        pause.unlink(missing_ok=True)
        for path in deployment.faults_dir.glob(f"{pause.name}.held.*"):
            path.unlink(missing_ok=True)
    result = None
    deadline = time.monotonic() + 30.0
    while result is None and time.monotonic() < deadline:
        result = next((r for r in _pause_results(log, logged) if r.get("pid") == held["pid"]), None)
        time.sleep(0.1)
    what = (
        f"a write of pid {held['pid']} to {key!r} held at version {token} for {hold_s:.0f} s while the state moved "
        f"to version {now_token} ({writes} no-op writes, {folds} folds by the fault)"
    )
    if result is None:
        return False, f"{what}: the held write never reported its save_if"
    if result["saved"]:
        chaos.errors.append(f"store_writer_pause: {what}: its stale save_if was ACCEPTED")
        return False, f"{what}: its stale save_if was ACCEPTED"
    if folds < FOLDS_UNDER_PAUSE:
        return False, f"{what}: fewer than {FOLDS_UNDER_PAUSE} folds under the held write"
    return True, f"{what}: its stale save_if was refused"


def _claimed(folder: Path, name: str, timeout_s: float) -> tuple[Path | None, dict[str, Any] | None]:
    """The claim of the pause file ``name`` (renamed ``<name>.held.<pid>`` by the writer that took it) and what
    the writer wrote in it (its pid, key and token)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in folder.glob(f"{name}.held.*"):
            with contextlib.suppress(OSError, ValueError):
                return path, dict(json.loads(path.read_text()))
        time.sleep(0.05)
    return None, None


def _pause_results(log: Path, skip: int) -> list[dict[str, Any]]:
    """The pause hook's result lines after the first ``skip`` (a line being written is skipped)."""
    out = []
    for line in (log.read_text().splitlines() if log.exists() else [])[skip:]:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


REMOVAL_LIMIT_S = 240.0
"""How long ``member_removed`` waits for the removed member's shards to be owned by others: the member leaves
at a peer's next tick, and a shard with a range in flight waits for the run or the drain timeout."""


def member_removed(chaos: Chaos) -> tuple[bool, str]:
    """A member sensor stopped for good (the group goes from N members to N - 1 for the rest of the run): its
    peers make it leave, other members take its shards over, and its committed runs whose records it had not
    confirmed are checked by a stand-in of its deployment (``protocol.checks_unrecorded``); the run's end
    requires ``unrecorded_runs`` empty. Hit: the sensor stopped, the member gone from the group and every shard
    it owned owned by a live member."""
    with chaos.lock:
        if chaos.removed_sensors:
            return False, f"a member was removed already: {sorted(chaos.removed_sensors)}"
    candidates = chaos.running_sensors()
    if len(candidates) < 2:
        return False, f"running member sensors {candidates}: removing one would leave none"
    name = chaos.rng.choice(candidates)
    state = chaos.state()
    member = next((m for m in (state.members if state is not None else {}) if m.partition("@")[0] == name), None)
    owned = sorted(s for s, shard in state.shards.items() if shard.owner == member) if state and member else []
    with chaos.lock:
        chaos.removed_sensors.add(name)
    chaos.deployment.stop_sensor(name)
    stopped = time.monotonic()
    deadline = stopped + REMOVAL_LIMIT_S
    while True:
        state = None
        with contextlib.suppress(Exception):  # another fault may have the store down
            state = chaos.state()
        if state is not None:
            gone = not any(m.partition("@")[0] == name for m in state.members)
            owners = {s: state.shards[s].owner for s in owned if s in state.shards}
            if gone and all(o is not None and o in state.members for o in owners.values()):
                break
        if time.monotonic() > deadline:
            return False, (
                f"{name} stopped for good, but within {REMOVAL_LIMIT_S:.0f} s it did not leave or its shards "
                f"{owned} were not all taken over"
            )
        time.sleep(1.0)
    taken = Counter(o for o in owners.values() if o is not None)
    return True, (
        f"{name} ({member}) stopped for good; after {time.monotonic() - stopped:.0f} s it had left and its "
        f"{len(owned)} shards were owned by {dict(taken)}"
    )


SECOND_GROUP_LIMIT_S = 180.0
"""How long ``two_groups`` waits for the second group to commit its burst."""


def two_groups(chaos: Chaos) -> tuple[bool, str]:
    """A burst of records into the second group's topic (the second group shares the main group's code location,
    daemon and state store, and runs through the whole chaos run). Hit: the second group committed the burst in
    its state, every partition up to what the producer was acknowledged, while the main group's faults go on; the
    check then holds its records to the main group's rules."""
    producer = chaos.second_producer
    if producer is None:
        return False, "the deployment has no second group"
    count = chaos.rng.randint(2_000, 6_000)
    producer.chunk(count)
    ends = producer.shard_ends()
    started = time.monotonic()
    while time.monotonic() - started < SECOND_GROUP_LIMIT_S:
        state = None
        with contextlib.suppress(Exception):  # another fault may have the store down
            state = chaos.state(second=True)
        if (
            state is not None
            and all((state.shards[s].committed or 0) >= end for s, end in ends.items() if s in state.shards)
            and set(ends) <= set(state.shards)
        ):
            return True, (
                f"{count} records into the second group's {len(ends)} partitions, committed by it in "
                f"{time.monotonic() - started:.0f} s"
            )
        time.sleep(1.0)
    return False, f"the second group did not commit a burst of {count} records within {SECOND_GROUP_LIMIT_S:.0f} s"


ACTIONS: dict[str, Callable[[Chaos], tuple[bool, str]]] = {
    "run_kill_before_commit": run_kill_before_commit,
    "run_kill_after_commit": run_kill_after_commit,
    "daemon_restart": daemon_restart,
    "code_server_restart": code_server_restart,
    "spark_connect_restart": spark_connect_restart,
    "state_store_restart": state_store_restart,
    "sensor_stop_start": sensor_stop_start,
    "run_pause": run_pause,
    "run_pause_zombie": run_pause_zombie,
    "broker_restart": broker_restart,
    "poison": poison,
    "cas_hammer": cas_hammer,
    "launcher_outage": launcher_outage,
    "store_writer_pause": store_writer_pause,
    "member_removed": member_removed,
    "two_groups": two_groups,
}


def inject(chaos: Chaos, kind: str, final: bool = True) -> bool:
    """Inject one fault; whether it is over (landed, missed or failed). A fault that found nothing to act on is
    not over unless this is its ``final`` chance: the driver gives it another moment."""
    try:
        hit, detail = ACTIONS[kind](chaos)
    except NothingToActOn as exc:
        if not final:
            chaos.log(f"fault {kind}: found nothing to act on ({exc}): rescheduled")
            return False
        hit, detail = False, f"nothing to act on at any of its moments: {exc}"
    except Exception as exc:
        chaos.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
        hit, detail = False, f"the action failed: {type(exc).__name__}: {exc}"
    chaos.note(kind, hit, detail)
    return True
