"""One consumer group across two independent Dagster deployments of the example project.

Deployments ``a`` and ``b`` each have their own DAGSTER_HOME, instance storage, daemon, webserver and code
server (two ``dagster dev``); their member sensors (``<group>_member_0`` and ``_1`` in both, the same code)
are four members of one group over one Kafka topic, with the group state in one PostgreSQL. Both consume;
``a`` is then killed whole (SIGKILL of every process of it, its runs too) while it has a run in flight; ``b``
owns every shard after a session timeout and drains the stream; ``a`` comes back under the same member ids
and the shards rebalance over both; a member sensor stopped over GraphQL in ``a`` makes only ``a``'s member
of that name leave. Nothing is lost or committed twice: the materializations of both instances together
tile every shard's offsets, each range in one instance, each counting every record of its range, whose folder
in that deployment's output holds exactly as many views; the committed offsets equal the high watermarks. The
failover and a stopped member's leave are asserted within the bounds docs/deploying.md quotes, plus a margin.

The runs read through one local Spark Connect server (as ``scripts/example.sh`` does), so that a run costs a
process and not a JVM: both deployments on 2 cores stay within a few minutes.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from dagster_streamgroup.dagster.devserver import wait_for
from dagster_streamgroup.local.spark_connect import ConnectServerSettings, running_connect_server
from dagster_streamgroup.protocol import EventKind
from tests.deployments.harness import (
    ExampleDeployment,
    SharedTopic,
    assert_tiled_once,
    committed_ranges,
    describe,
    owners,
)
from tests.e2e.scenario import ASSET, IN_PROGRESS, MARGIN_TICKS, assert_output_counts, timing_limit_s

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.postgres,
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

PARTITIONS = 4
MEMBERS = 2
"""Member sensors per deployment."""
HEARTBEAT_S = 5.0
SESSION_TIMEOUT_S = 20.0
DRAIN_TIMEOUT_S = 5.0
"""How long ``b`` waits for the runs ``a`` had in flight: they died with ``a`` and never report, and no member
of ``b`` can see ``a``'s instance to learn it (docs/deploying.md)."""


@pytest.fixture
def work_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="streamgroup-deployments-") as tmp:
        yield Path(tmp)


def _in_parallel(*steps: Any) -> None:
    """Run the steps in threads (starting servers mostly waits); re-raise the first failure."""
    errors: list[BaseException] = []

    def call(step: Any) -> None:
        try:
            step()
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(step,)) for step in steps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class Producer(threading.Thread):
    """Keeps the stream flowing in the background (a burst every half second) until stopped."""

    def __init__(self, topic: SharedTopic, per_burst: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.per_burst = per_burst
        self.seed = seed
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.topic.produce(self.per_burst, self.seed)
                self.seed += 1
                self.halt.wait(0.5)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(60)
        assert not self.is_alive()
        if self.error is not None:
            raise self.error


def test_one_group_across_two_deployments(kafka_bootstrap: str, postgres_url: str, work_dir: Path) -> None:
    group = f"deployments_{uuid.uuid4().hex[:8]}"
    topic = SharedTopic(
        kafka_bootstrap,
        f"clicks-{uuid.uuid4().hex[:8]}",
        group,
        postgres_url,
        PARTITIONS,
        HEARTBEAT_S,
        SESSION_TIMEOUT_S,
    )
    sensors = [f"{group}_member_{i}" for i in range(MEMBERS)]
    started = time.monotonic()

    def elapsed() -> str:
        return f"[{time.monotonic() - started:5.0f} s]"

    with running_connect_server(settings=ConnectServerSettings(master="local[2]", driver_memory="1g")) as spark:
        env = {
            "CLICKSTREAM_STREAM": "kafka",
            "CLICKSTREAM_BOOTSTRAP": kafka_bootstrap,
            "CLICKSTREAM_TOPIC": topic.topic,
            "CLICKSTREAM_GROUP": group,
            "CLICKSTREAM_MEMBERS": str(MEMBERS),
            "CLICKSTREAM_HEARTBEAT_S": f"{HEARTBEAT_S:g}",
            "CLICKSTREAM_SESSION_TIMEOUT_S": f"{SESSION_TIMEOUT_S:g}",
            "CLICKSTREAM_DRAIN_TIMEOUT_S": f"{DRAIN_TIMEOUT_S:g}",
            "CLICKSTREAM_STORE_URL": postgres_url,
            "CLICKSTREAM_MIN_BACKLOG": "1000",
            "CLICKSTREAM_MAX_WAIT_S": "2",
            "CLICKSTREAM_SPARK_REMOTE": spark.remote,
            "STREAMGROUP_DEPLOYMENT": "",  # the deployment id is derived from each instance, as by default
        }
        a = ExampleDeployment("a", work_dir, env)
        b = ExampleDeployment("b", work_dir, env)
        a_runs_seen: dict[str, str] = {}
        try:
            _in_parallel(a.start, b.start)
            for d in (a, b):
                d.deployment_id = d.read_deployment_id()
            assert a.deployment_id != b.deployment_id
            a_members, b_members = a.member_ids(sensors), b.member_ids(sensors)
            print(f"{elapsed()} deployments up: a={a.deployment_id} b={b.deployment_id}", flush=True)

            # 1. Both deployments are members and both consume.
            def all_members_own_a_shard() -> bool:
                state = topic.state()
                return set(state.members) == a_members | b_members and set(owners(state).values()) == set(state.members)

            wait_for("four members, one shard each", all_members_own_a_shard, 120.0, 1.0)
            # The first backlog once every member holds a shard: written before, it went whole to the runs of the
            # deployment whose members ticked first, and the other one had nothing left to consume.
            topic.produce(4_000, seed=1)
            wait_for("the first backlog to drain", topic.drained, 240.0, 2.0)
            for d in (a, b):
                mine = committed_ranges(d.name, d.dev.materializations(ASSET))
                assert mine, f"deployment {d.name} consumed nothing"
            print(f"{elapsed()} first backlog drained by both deployments", flush=True)

            # 2. Deployment a dies whole while it has a run in flight; b takes every shard and drains.
            producer = Producer(topic, per_burst=150, seed=100)
            producer.start()

            def a_run_started() -> list[str] | None:
                """The shards of a's ranges in flight, once one of them is in a run that a's worker started."""
                runs = a.dev.runs()
                state = topic.state()
                inflight = {
                    s.inflight.run_key: sid
                    for sid, s in state.shards.items()
                    if s.inflight is not None and s.inflight.member_id in a_members
                }
                started_runs = [
                    r for r in runs if r["status"] == "STARTED" and r["tags"].get("dagster/run_key") in inflight
                ]
                a_runs_seen.update({r["runId"]: r["status"] for r in runs})
                return sorted(inflight.values()) if started_runs else None

            a_inflight = wait_for("a run of deployment a in progress", a_run_started, 240.0, 0.5)
            killed_at, killed_epoch_s = time.monotonic(), time.time()
            processes = a.kill()
            print(
                f"{elapsed()} deployment a killed (SIGKILL): {dict(processes)}; its ranges in flight: "
                f"{a_inflight}; its runs then: {sorted(a_runs_seen.values())}",
                flush=True,
            )
            assert processes["run worker"] >= 1 and processes["daemon"] == 1 and processes["code server"] >= 1

            def b_owns_everything() -> float | None:
                state = topic.state()
                if set(state.members) == b_members and set(owners(state).values()) <= b_members:
                    return time.monotonic() - killed_at
                return None

            # The bound docs/deploying.md quotes: the session timeout, a tick for the evicting write, and the drain
            # timeout (one tick here) rounded up to the next tick; asserted with the margin of MARGIN_TICKS ticks.
            # The wait is longer so that a slow failover is measured and printed before it fails.
            failover_s = wait_for("b to own every shard", b_owns_everything, 180.0, 0.5)
            bound_s = SESSION_TIMEOUT_S + 2 * HEARTBEAT_S
            limit_s = timing_limit_s(bound_s, HEARTBEAT_S)
            print(
                f"{elapsed()} FAILOVER: deployment b owns every shard {failover_s:.1f} s after the kill "
                f"(session timeout {SESSION_TIMEOUT_S:g} s + {(failover_s - SESSION_TIMEOUT_S) / HEARTBEAT_S:.1f} "
                f"ticks of {HEARTBEAT_S:g} s; bound {bound_s:g} s, limit {limit_s:g} s with a margin of "
                f"{MARGIN_TICKS} ticks; drain timeout {DRAIN_TIMEOUT_S:g} s)",
                flush=True,
            )
            assert failover_s <= limit_s, f"failover took {failover_s:.1f} s, past {limit_s:g} s"
            state = topic.state()
            evicted = {e.member_id for e in state.events if e.kind is EventKind.EVICTED}
            assert a_members <= evicted
            expired = {e.shard for e in state.events if e.kind is EventKind.DRAIN_EXPIRED}
            assert set(a_inflight) <= expired, (a_inflight, expired)
            time.sleep(2 * HEARTBEAT_S)  # b consumes the flowing stream alone for a while
            producer.stop()
            highs = wait_for("b to drain the stream", topic.drained, 240.0, 2.0)
            print(f"{elapsed()} deployment b drained {topic.written} records", flush=True)

            # 3. Deployment a comes back under the same member ids; the shards rebalance over both.
            a.start()
            restarted_at = time.monotonic()
            died_with_a = {r["runId"] for r in a.dev.runs() if r["creationTime"] <= killed_epoch_s}
            # The runs killed with a are still in progress in its instance: Dagster's default run launcher cannot
            # check a worker, so run monitoring would fail them only after max_runtime_seconds (an hour), and
            # until then each holds its shard's run slot (dagster.yaml's per-shard limit) in this instance. Their
            # ranges were relaunched by b and committed, so they can never commit: mark them canceled, the
            # operator's step after a host is lost whole (docs/deploying.md).
            dead = [r["runId"] for r in a.dev.runs() if r["runId"] in died_with_a and r["status"] in IN_PROGRESS]
            print(f"{elapsed()} a started again; runs killed with it, still in progress: {len(dead)}", flush=True)
            print(f"{elapsed()} marked canceled: {a.mark_canceled(dead)}", flush=True)
            assert a.read_deployment_id() == a.deployment_id

            def rebalanced() -> dict[str, str | None] | None:
                state = topic.state()
                held = owners(state)
                per_member = [list(held.values()).count(m) for m in a_members | b_members]
                ok = set(state.members) == a_members | b_members and per_member == [1] * len(per_member)
                return held if ok else None

            held = wait_for("the shards to rebalance over both deployments", rebalanced, 180.0, 1.0)
            print(
                f"{elapsed()} rebalanced {time.monotonic() - restarted_at:.1f} s after a's daemon was up again: {held}",
                flush=True,
            )

            # 4. A member sensor stopped in a: only a's member of that name leaves, b's stays.
            stopped = sensors[1]
            a.dev.stop_sensor(stopped)
            stopped_at = time.monotonic()
            gone = f"{stopped}@{a.deployment_id}"
            twin = f"{stopped}@{b.deployment_id}"

            def left() -> float | None:
                state = topic.state()
                if gone in state.members or gone in owners(state).values():
                    return None
                return time.monotonic() - stopped_at

            # It leaves at the next tick of a running peer in a (docs/deploying.md): one tick, plus the margin.
            left_after = wait_for(f"{gone} to leave", left, 120.0, 0.5)
            left_limit_s = timing_limit_s(HEARTBEAT_S, HEARTBEAT_S)
            assert left_after <= left_limit_s, f"{gone} left {left_after:.1f} s after the stop, past {left_limit_s:g} s"
            time.sleep(2 * HEARTBEAT_S)  # b's members tick again, and see the sensor running in their instance
            state = topic.state()
            assert set(state.members) == (a_members | b_members) - {gone}, describe(state)
            assert set(owners(state).values()) == set(state.members)
            left_events = [e.member_id for e in state.events if e.kind is EventKind.LEFT]
            assert left_events == [gone], left_events
            assert twin in state.members
            print(f"{elapsed()} {gone} left {left_after:.1f} s after its sensor stopped; {twin} stayed", flush=True)

            # 5. Both consume again; then every offset is committed once, across the two instances.
            topic.produce(2_000, seed=2)
            highs = wait_for("the last records to drain", topic.drained, 240.0, 2.0)

            def ended(d: ExampleDeployment, ignore: set[str]) -> list[dict[str, Any]] | None:
                runs = d.dev.runs()
                return None if any(r["status"] in IN_PROGRESS and r["runId"] not in ignore for r in runs) else runs

            a_runs = wait_for("a's runs to end", lambda: ended(a, died_with_a), 180.0, 2.0)
            b_runs = wait_for("b's runs to end", lambda: ended(b, set()), 180.0, 2.0)
            failed_b = [(r["runId"], r["status"]) for r in b_runs if r["status"] != "SUCCESS"]
            failed_a = [
                (r["runId"], r["status"]) for r in a_runs if r["status"] != "SUCCESS" and r["runId"] not in died_with_a
            ]
            assert not failed_b and not failed_a, (failed_a, failed_b)

            ranges = []
            for d, ids in ((a, a_members), (b, b_members)):
                materialized = d.dev.materializations(ASSET)
                mine = committed_ranges(d.name, materialized)
                assert {r.member for r in mine} <= ids, f"{d.name} materialized ranges of another deployment"
                # The example's output in the instance that committed each range: its records, counted.
                assert_output_counts(d.output, materialized)
                ranges += mine
            assert_tiled_once(ranges, topic.lows(), highs)
            after_restart = {r.run_id for r in ranges if r.deployment == "a"} - died_with_a
            assert after_restart, "deployment a consumed nothing after it came back"
            state = topic.state()
            assert {sid: s.committed for sid, s in state.shards.items()} == highs
            assert topic.mirrored() == highs
            print(
                f"{elapsed()} {topic.written} records, {len(ranges)} committed ranges "
                f"({sum(r.deployment == 'a' for r in ranges)} in a, {sum(r.deployment == 'b' for r in ranges)} in b); "
                f"a's runs killed with it: {[r['status'] for r in a_runs if r['runId'] in died_with_a]}",
                flush=True,
            )
        except BaseException:
            with_state = ""
            try:
                with_state = describe(topic.state())
            finally:
                print(f"{elapsed()} group state at the failure:\n{with_state}", flush=True)
            raise
        finally:
            _in_parallel(a.close, b.close)

    secret = make_url(postgres_url).password
    assert isinstance(secret, str) and secret
    leaked = [
        str(path)
        for place in (a.home, b.home, a.dev.log, b.dev.log)
        for path in ([place] if place.is_file() else sorted(place.rglob("*")))
        if path.is_file() and secret.encode() in path.read_bytes()
    ]
    assert not leaked, f"the state store's password is written in {leaked}"
