"""The faults of a chaos run: a seeded plan (pure) and the action that injects each kind into the deployment.

Some faults are over when their action returns (a SIGKILL and restart); others go on in the background
(a paused run, a stopped sensor, CAS hammering, poison records waiting to be parked and unparked) while the
next faults are injected, and are ended by ``Chaos.finish_background``.
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
from bench.chaos.check import COMMIT_WAIT_S
from bench.chaos.deployment import DEFINITIONS, ChaosDeployment
from bench.chaos.producer import ChaosProducer
from dagster_streamgroup.dagster.devserver import ROOT
from dagster_streamgroup.launcher import RunWorker
from dagster_streamgroup.local import procfs
from dagster_streamgroup.protocol import GroupState

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
)
"""``run_pause``: a run SIGSTOPped longer than the session timeout, then resumed. ``run_pause_zombie``: a run
held after its read, before its commit, SIGSTOPped with its member sensor stopped until every shard of the run
moved to a new epoch (the member left; the drain ended, once the stopped run no longer reported itself alive or
the drain timeout passed; the range was handed out to be launched again), so the resumed run is a zombie whose
commit must be refused."""

ZOMBIE_MOVE_LIMIT_S = 300.0
"""How long the zombie fault waits for its run's shards to move to a new epoch before it resumes the run anyway
(and reports an error): 20-25 s in the short setting (the run's liveness timeout), at most the member's leave
plus the drain timeout (about a minute) with the chaos settings."""


def plan(count: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[str]:
    """``count`` fault kinds: every kind once (shuffled) while ``count`` allows, then drawn at random."""
    rng = random.Random(seed)
    first = list(kinds)
    rng.shuffle(first)
    return (first + [rng.choice(kinds) for _ in range(max(0, count - len(kinds)))])[:count]


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
    injected: list[Injected] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    paused: set[int] = field(default_factory=set)
    stopped_sensors: set[str] = field(default_factory=set)
    hammers: list[subprocess.Popen[str]] = field(default_factory=list)
    hammer_results: list[dict[str, int]] = field(default_factory=list)
    poison_pending: set[str] = field(default_factory=set)
    poison_watcher: bool = False
    parked_seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    parks: set[tuple[str, int, int]] = field(default_factory=set)
    """Every parked or dead-lettered range the driver saw, resolved or not: each must hold a poison record."""
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

    def state(self) -> GroupState | None:
        return self.deployment.resource().member("chaos-observer").load()

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
            if name in self.stopped_sensors:
                return False
            self.stopped_sensors.add(name)
        self.deployment.stop_sensor(name)
        return True

    def start_sensor(self, name: str, timeout_s: float = 240.0) -> None:
        """Start a sensor again, waiting out a webserver that another fault is restarting."""
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
            return [s for s in self.deployment.sensors() if s not in self.stopped_sensors]

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


# The actions, one per kind. Each returns (hit, detail).


def run_kill_before_commit(chaos: Chaos) -> tuple[bool, str]:
    held = chaos.hold_one()
    try:
        if held is None:
            return False, "no run reached the end of its function in time"
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
        return False, "no run reached the end of its function in time"
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
        return False, "no run in progress to pause"
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
            return False, "no run of a running member sensor reached the end of its function in time"
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


def cli(chaos: Chaos, arguments: list[str]) -> str:
    """``streamgroup ...`` as an operator runs it, with the deployment's definitions and environment."""
    env = {**os.environ, **chaos.deployment.env()}
    command = [str(ROOT / ".venv/bin/streamgroup"), arguments[0], "--group", chaos.deployment.group_name]
    command += ["--definitions", str(DEFINITIONS), *arguments[1:]]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"streamgroup {' '.join(arguments)} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout.strip()


def unpark(chaos: Chaos, shard: str, retry_s: float = 90.0) -> str:
    """``streamgroup unpark``, tried again for a while when it fails, as an operator would: the command reads
    the cluster id to find the group's state, so it fails while a broker restart (another fault) is under way."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            return cli(chaos, ["unpark", "--shard", shard])
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
        chaos.backfilled.append((shard, start, end))
        backfill = ["backfill", "--shard", shard, "--from", str(start), "--to", str(end)]
        said = cli(chaos, [*backfill, "--dagster-url", chaos.deployment.dev.url])
        chaos.log(f"backfill {shard} [{start}, {end}): {said}")
        chaos.log(f"resolve {shard}: {cli(chaos, ['resolve', '--shard', shard])}")


def resolve_parked(chaos: Chaos, parked: dict[str, tuple[int, int]]) -> None:
    for shard, (start, end) in sorted(parked.items()):
        with chaos.lock:
            chaos.parks.add((shard, start, end))
        chaos.log(f"unpark {shard} [{start}, {end}): {unpark(chaos, shard)}")
        chaos.unparked.append((shard, start, end))


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
}


def inject(chaos: Chaos, kind: str) -> None:
    try:
        hit, detail = ACTIONS[kind](chaos)
    except Exception as exc:
        chaos.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
        hit, detail = False, f"the action failed: {type(exc).__name__}: {exc}"
    chaos.note(kind, hit, detail)
