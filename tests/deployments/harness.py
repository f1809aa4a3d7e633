"""Two independent deployments of the example project, members of one consumer group.

A deployment is what an operator runs on one host: its own ``DAGSTER_HOME`` and instance storage, and a
``dagster dev`` (daemon, webserver, code server) whose run workers are its children. The group's state lives
in one PostgreSQL that both reach through ``CLICKSTREAM_STORE_URL``. The checks read each instance over
GraphQL, the group state from the store, and the offsets the group mirrors into Kafka.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.dagster.devserver import ROOT, DagsterDev
from dagster_streamgroup.local.kafka_data import create_topics
from dagster_streamgroup.protocol import GroupState
from jobs.clickstream_events import produce_burst, producers

PROC = Path("/proc")


class SharedTopic:
    """The Kafka topic both deployments consume, and the group resource the test reads the state through."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        store_url: str,
        partitions: int,
        heartbeat_s: float,
        session_timeout_s: float,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        create_topics(bootstrap, {topic: partitions})
        self.resource = KafkaStreamGroup(
            group=group,
            bootstrap_servers=bootstrap,
            topics=[topic],
            store_url=store_url,
            heartbeat_interval_s=heartbeat_s,
            session_timeout_s=session_timeout_s,
        )
        self.written = 0
        self._producers: tuple[Producer, Producer] | None = None

    def produce(self, count: int, seed: int) -> None:
        """``count`` clickstream events keyed by user, then one record on every partition."""
        if self._producers is None:
            self._producers = producers({"bootstrap.servers": self.bootstrap})
        bulk, trailer = self._producers
        produce_burst(bulk, trailer, self.topic, self.partitions, count, random.Random(seed))
        self.written += count + self.partitions

    def state(self) -> GroupState:
        state = self.resource.member("observer").load()  # load() reads; it never joins the group
        assert state is not None, "the group has no state yet"
        return state

    def highs(self) -> dict[str, int]:
        backend = self.resource.backend()
        return {shard: marks.high for shard, marks in backend.watermarks(backend.shards()).items()}

    def lows(self) -> dict[str, int]:
        backend = self.resource.backend()
        return {shard: marks.low for shard, marks in backend.watermarks(backend.shards()).items()}

    def mirrored(self) -> dict[str, int | None]:
        """The group's offsets in Kafka (what the ecosystem's lag tools read)."""
        backend = self.resource.backend()
        return backend.committed(self.resource.group, backend.shards())

    def drained(self) -> dict[str, int] | None:
        """The high watermarks, once the state and Kafka's group offsets both reached them."""
        highs = self.highs()
        state = self.state()
        committed = {sid: s.committed for sid, s in state.shards.items()}
        return highs if committed == highs and self.mirrored() == highs else None


def owners(state: GroupState) -> dict[str, str | None]:
    return {sid: s.owner for sid, s in sorted(state.shards.items())}


def describe(state: GroupState) -> str:
    """One line per shard and member, for progress prints and failure messages."""
    lines = [f"members: {sorted(state.members)}"]
    for sid, s in sorted(state.shards.items()):
        flight = ""
        if s.inflight is not None:
            orphan = " orphaned" if s.inflight.orphaned_at is not None else ""
            flight = f" in flight [{s.inflight.start}, {s.inflight.end}) by {s.inflight.member_id}{orphan}"
        lines.append(f"  {sid}: owner {s.owner} epoch {s.epoch} committed {s.committed}{flight}")
    return "\n".join(lines)


def deployment_pids(home: Path) -> list[int]:
    """Every live process of this user whose environment names ``home`` as its DAGSTER_HOME: ``dagster dev``,
    its daemon, webserver and code server, and the run workers they started, wherever they were reparented."""
    needle = b"DAGSTER_HOME=" + str(home).encode()
    found = []
    for entry in os.scandir(PROC):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (PROC / entry.name / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


class ExampleDeployment:
    """The example project deployed once: its own DAGSTER_HOME, instance storage and ``dagster dev``."""

    def __init__(self, name: str, work: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.home = work / name / "home"
        self.output = work / name / "output"
        """The example's output of this deployment (one folder per range its runs processed)."""
        self.env = {**env, "CLICKSTREAM_OUTPUT": str(self.output)}
        self.dev = DagsterDev(self.home, self.env, work / name / "dagster-dev.log")
        self.deployment_id: str | None = None

    def start(self) -> None:
        self.dev.start(timeout_s=300.0)

    def read_deployment_id(self) -> str:
        """The deployment id the member sensors compute from this instance (``deployment_id``), read the same
        way in a process with the deployment's environment."""
        code = (
            "import dagster as dg\n"
            "from dagster_streamgroup.dagster.sensors import deployment_id\n"
            "with dg.DagsterInstance.get() as instance:\n"
            "    print(deployment_id(instance))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=self.dev.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1]

    def member_ids(self, sensors: Iterable[str]) -> set[str]:
        assert self.deployment_id is not None
        return {f"{name}@{self.deployment_id}" for name in sensors}

    def kill(self) -> Counter[str]:
        """SIGKILL every process of this deployment at once (a host lost whole); how many of each kind."""
        pids = deployment_pids(self.home)
        assert self.dev.proc is not None and self.dev.proc.pid in pids
        kinds = Counter(process_kind(pid) for pid in pids)
        for _ in range(20):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.dev.proc.wait(5)  # reap it: the others were reparented and are reaped by init
            time.sleep(0.2)
            pids = [pid for pid in deployment_pids(self.home) if not _zombie(pid)]
            if not pids:
                break
            kinds.update(process_kind(pid) for pid in pids)  # started while the others were being killed
        assert not pids, f"processes of deployment {self.name} survived SIGKILL: {pids}"
        self.dev.proc = None  # nothing left to stop; a later stop() must not signal a recycled process group
        return kinds

    def mark_canceled(self, run_ids: Iterable[str]) -> dict[str, str]:
        """Mark runs canceled over GraphQL without reaching their workers (the UI's "force termination"): what
        an operator does with runs whose workers died with the host, which Dagster's default run launcher
        cannot check. Returns each run's status afterwards."""
        statuses = {}
        for run_id in run_ids:
            result = self.dev.graphql(
                """mutation($id: String!) { terminateRun(runId: $id, terminatePolicy: MARK_AS_CANCELED_IMMEDIATELY) {
                     __typename ... on TerminateRunSuccess { run { status } }
                     ... on TerminateRunFailure { message } ... on PythonError { message } } }""",
                {"id": run_id},
            )["terminateRun"]
            if result["__typename"] == "TerminateRunSuccess":
                statuses[run_id] = result["run"]["status"]
                continue
            # It may have ended in between (a queued run launched and refused by the fence, say): nothing to do.
            assert "due to having status" in result.get("message", ""), f"marking run {run_id} canceled: {result}"
            statuses[run_id] = result["message"]
        return statuses

    def close(self) -> None:
        self.dev.close()


PROCESS_KINDS = (
    (b"dagster._daemon", "daemon"),
    (b"dagster_webserver", "webserver"),
    (b"api grpc", "code server"),
    (b"spawn_main", "run worker"),
    (b"dagster dev", "dagster dev"),
)
"""What a process of ``dagster dev`` is, by its command line. Dagster's default launcher asks the code server to
start each run, which it does with multiprocessing's spawn (``spawn_main``)."""


FORK_LAUNCHER_NAMES = {"dagster-run": "run worker", "dagster-forksrv": "fork server"}
"""The example's ForkServerRunLauncher names its processes (``/proc/PID/comm``): a run worker is a forked child
of the fork server, with the server's command line."""


def process_kind(pid: int) -> str:
    try:
        name = (PROC / str(pid) / "comm").read_text().strip()
        line = b" ".join(part.rsplit(b"/", 1)[-1] for part in (PROC / str(pid) / "cmdline").read_bytes().split(b"\0"))
    except OSError:
        return "gone"
    if name in FORK_LAUNCHER_NAMES:
        return FORK_LAUNCHER_NAMES[name]
    return next((kind for needle, kind in PROCESS_KINDS if needle in line), "other")


def _zombie(pid: int) -> bool:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@dataclass(frozen=True)
class Committed:
    """A committed range as a materialization of one instance."""

    deployment: str
    shard: str
    start: int
    end: int
    member: str
    run_id: str


def committed_ranges(deployment: str, materializations: Iterable[Mapping[str, Any]]) -> list[Committed]:
    """The member-committed ranges: an instance's materializations of the stream asset (backfills record theirs on
    the backfill asset). Each must
    commit its own end and, unless a member recorded it for a run killed after its commit (``repaired``: no
    count), say its run read every record of the range: ``records == end - start`` (no transactions here, so
    no offset is a control marker)."""
    ranges = []
    for m in materializations:
        assert m["committed"] == m["end"], f"{deployment}: materialization {m} does not commit its own end"
        assert m.get("repaired") or m.get("records") == m["end"] - m["start"], (
            f"{deployment}: materialization {m} counts {m.get('records')} records for its range"
        )
        ranges.append(Committed(deployment, m["shard"], m["start"], m["end"], m["member"], m["runId"]))
    return ranges


def _described(r: Committed) -> str:
    """Where a materialization came from: a repair, recorded by a member's sensor, names no run."""
    return f"[{r.start}, {r.end}) in {r.deployment}, " + (f"run {r.run_id}" if r.run_id else "a repair (no run)")


def assert_tiled_once(ranges: Iterable[Committed], lows: Mapping[str, int], highs: Mapping[str, int]) -> None:
    """The ranges of all instances together tile ``[low, high)`` of every shard: no gap, no overlap, and no
    range recorded twice, in one instance or in two."""
    by_shard: dict[str, list[Committed]] = defaultdict(list)
    for r in ranges:
        by_shard[r.shard].append(r)
    assert sorted(by_shard) == sorted(highs), f"shards materialized {sorted(by_shard)}, stream {sorted(highs)}"
    for shard, spans in by_shard.items():
        spans.sort(key=lambda r: (r.start, r.end))
        position, previous = lows[shard], None
        for r in spans:
            assert r.start == position, f"{shard}: {_described(r)} follows offset {position}" + (
                f" (committed twice: {_described(previous)})" if previous and r.start < position else " (a gap)"
            )
            position, previous = r.end, r
        assert position == highs[shard], f"{shard}: covered up to {position}, high watermark {highs[shard]}"
