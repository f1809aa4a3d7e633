"""``python -m bench.chaos``: faults injected into a real deployment while it consumes a stream, then a check.

``python -m bench.chaos [--messages 1000000] [--partitions 16] [--faults 30] [--seed 1] [--timeout 1800]
[--members 3] [--gap-min 2] [--gap-max 8] [--after-max-attempts park|dead_letter] [--kinds K1,K2]
[--max-records-per-run 200000] [--keep]``

1. The deployment (``bench.chaos.deployment``): the local broker on durable ``s3://`` storage, the group
   state in PostgreSQL, a Spark Connect server, ``dagster dev`` with ``bench/chaos/definitions.py``, whose
   stream function records what it saw (``bench.chaos.recorder``). The code location holds two groups: the
   main one and a small second one on a topic of its own (``SECOND_RECORDS`` records at the start and at the
   end, and a burst at each ``two_groups`` fault).
2. ``--messages`` records arrive in ``--faults`` + 1 chunks; after each chunk but the last, one fault drawn
   from ``faults.KINDS`` (seeded: every kind once, then at random) is injected. A fault that finds nothing to act
   on (no run in flight, no launch) is tried again after the next chunk, then after a chunk of its own
   (``bench.chaos.schedule``), and counts as missed only when none of its moments had anything for it. A
   sampler reads the committed offsets of both groups from the group state and from Kafka's group offsets every
   second.
3. Once producing ended and every background fault is over (paused runs resumed, sensors started, poisoned
   shards parked, switched off and unparked), ``drain_s`` runs until the group states and Kafka's group offsets
   reach every partition's end, of both groups; then until every committed run's record is confirmed
   (``unrecorded_runs`` empty).
4. The check (``bench.chaos.check``) over the function's own records (offsets and payload hashes), what the
   producer was acknowledged, Dagster's materializations and runs, the parks seen and the samples, for each
   group. The last line is one JSON object; ``passed`` is false, and the exit code 1, for every reason
   ``check.failures`` gives: anything lost, overlapped, duplicated, gone backwards, committed unread or parked
   without poison (or parked for a launch the outage refused), in either group; committed runs left
   unconfirmed in ``unrecorded_runs``; a fault that never landed or an error of the driver; a zombie whose
   commit was not refused; Kafka's group offsets behind the state's past their bound; or a backlog that did not
   drain in time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.chaos import faults, recorder
from bench.chaos.check import (
    MIRROR_LAG_MARGIN_S,
    Committed,
    Sample,
    Verdict,
    failures,
    mirror_lag_bound_s,
    mirror_lag_s,
    refused_launch_parks,
    verdict,
)
from bench.chaos.deployment import ChaosDeployment, GroupSettings
from bench.chaos.faults import KINDS, Chaos
from bench.chaos.producer import ChaosProducer
from bench.chaos.schedule import inject_planned
from bench.chaos.sinks import sink_verdict
from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.devserver import wait_for
from dagster_streamgroup.protocol import GroupState

IN_PROGRESS = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}
SECOND_RECORDS = 3_000
"""Records into the second group's topic at the start and again at the end of producing: it consumes from the
first fault to the drain, whatever ``two_groups`` bursts the plan holds."""


@dataclass(frozen=True)
class ChaosOptions:
    messages: int = 1_000_000
    partitions: int = 16
    faults: int = 30
    seed: int = 1
    timeout_s: float = 1800.0
    members: int = 3
    gap_min_s: float = 2.0
    gap_max_s: float = 8.0
    after_max_attempts: str = "park"
    max_records_per_run: int = 200_000
    carry_on_s: float = 0.0
    """The groups' ``carry_on_s``: with it, runs carry on across waves while the faults land."""
    kinds: tuple[str, ...] = KINDS
    keep: bool = False
    sinks: bool = False
    """The main group's runs also commit into a Delta table and a Kafka topic, each counted (``bench.chaos.sinks``)."""


class Sampler:
    """Committed offsets of both groups from their state and from Kafka's group offsets, every ``interval_s``
    (the shards of the two groups are on different topics, so their samples never mix)."""

    def __init__(self, deployment: ChaosDeployment, started: float, interval_s: float = 1.0) -> None:
        self.deployment = deployment
        self.started = started
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.latest: dict[tuple[str, str], int] = {}
        self.failures: Counter[str] = Counter()
        self.parks: set[tuple[str, int, int]] = set()
        """Parked and dead-lettered ranges seen in the state: the drain resumes parked shards by itself, so each
        park is counted here, to be matched with an injected poison range."""
        self.park_reasons: dict[tuple[str, int, int], str] = {}
        """Why each of ``parks`` was given up (matched against the launches the outage refused)."""
        self.lock = threading.Lock()
        """Held around every broker call of the driver: they share one cached client."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="offset sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _loop(self) -> None:
        groups = [(self.deployment.resource(), False), (self.deployment.resource(second=True), True)]
        while not self._stop.wait(self.interval_s):
            for resource, second in groups:
                self._sample(resource, second)

    def _sample(self, resource: KafkaStreamGroup, second: bool) -> None:
        now = time.monotonic() - self.started
        try:
            state = resource.member("chaos-observer").load()
        except Exception:  # the store is down during its own fault: no sample
            self.failures["state"] += 1
            state = None
        if state is not None:
            for shard, record in state.shards.items():
                if record.committed is not None:
                    self._add(Sample(now, "state", shard, record.committed))
                if record.parked is not None:
                    span = (shard, record.parked.start, record.parked.end)
                    self.parks.add(span)
                    self.park_reasons[span] = record.parked.reason
            for d in state.dead_letters:
                self.parks.add((d.shard, d.start, d.end))
                self.park_reasons[(d.shard, d.start, d.end)] = d.reason
        try:
            with self.lock:
                offsets = resource.backend().committed(resource.group, self.deployment.shards(second))
        except Exception:  # the broker is down or paused during its own fault
            self.failures["kafka"] += 1
            return
        for shard, offset in offsets.items():
            if offset is not None:
                self._add(Sample(now, "kafka", shard, offset))

    def _add(self, sample: Sample) -> None:
        self.samples.append(sample)
        self.latest[(sample.source, sample.shard)] = sample.offset

    def at(self, source: str, targets: dict[str, int]) -> bool:
        return all(self.latest.get((source, shard)) == end for shard, end in targets.items())


FAILURE_CAUSES = (
    ("commit_refused", "commit refused"),
    ("state_contention", "changed under every one of"),
    ("poison", "poison records"),
    ("worker_killed", "killed"),
    ("worker_gone", "is not running"),
    ("spark_connect", "sparkconnect"),
    ("spark_connect", "spark connect"),
    ("state_store", "state store"),
)


def failure_cause(messages: list[str]) -> str:
    """The first known cause named in a failed run's messages (``other`` when none is)."""
    text = " ".join(messages).lower()
    return next((cause for cause, needle in FAILURE_CAUSES if needle in text), "other")


def failure_causes(deployment: ChaosDeployment, runs: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """The cause of each failed run, by run id, and the messages of those no known cause explains. A run whose
    launch raised (the launcher outage) is told by its tag: it never ran, so it has no step failure to read."""
    causes: dict[str, str] = {}
    others: list[str] = []
    for run in runs:
        if run["status"] != "FAILURE":
            continue
        if sgt.TAG_LAUNCH_FAILED in run.get("tags", {}):
            causes[run["runId"]] = "launch_refused"
            continue
        try:
            messages = deployment.failure_messages(run["runId"])
        except Exception as exc:  # a run whose events cannot be read is counted, not dropped
            messages = [f"events unreadable: {exc}"]
        cause = failure_cause(messages)
        causes[run["runId"]] = cause
        if cause == "other":
            others.append(f"{run['runId']}: {' | '.join(m[:200] for m in messages)[:400]}")
    return causes, others


def zombie_outcomes(zombies: list[str], runs: list[dict[str, Any]], causes: dict[str, str]) -> list[dict[str, Any]]:
    """How each zombie run ended: its status and the cause of its failure (``commit_refused`` is the one
    expected)."""
    status = {r["runId"]: r["status"] for r in runs}
    return [{"run": z, "status": status.get(z), "cause": causes.get(z)} for z in zombies]


def chunk_sizes(messages: int, chunks: int) -> list[int]:
    base, extra = divmod(messages, chunks)
    return [base + (1 if i < extra else 0) for i in range(chunks)]


def run_chaos(options: ChaosOptions) -> dict[str, Any]:
    started = time.monotonic()
    deadline = started + options.timeout_s
    work = Path(tempfile.mkdtemp(prefix="streamgroup-chaos-"))
    group = GroupSettings(
        partitions=options.partitions,
        members=options.members,
        after_max_attempts=options.after_max_attempts,
        max_records_per_run=options.max_records_per_run,
        max_attempts=3,
        carry_on_s=options.carry_on_s,
        sinks=options.sinks,
    )
    deployment = ChaosDeployment(work, group)
    result: dict[str, Any] = {"messages": 0, "partitions": options.partitions, "seed": options.seed}
    failed = True
    try:
        deployment.start()
        deployment.wait_members()
        print(f"deployment up after {time.monotonic() - started:.0f} s (work {work})", flush=True)
        producer = ChaosProducer(deployment.broker.bootstrap, deployment.topic, options.partitions, options.seed)
        second = ChaosProducer(
            deployment.broker.bootstrap, deployment.second_topic, group.second_partitions, options.seed + 1
        )
        chaos = Chaos(deployment, producer, random.Random(options.seed), started, second_producer=second)
        sampler = Sampler(deployment, started)
        sampler.start()
        second.chunk(SECOND_RECORDS)
        kinds = faults.plan(options.faults, options.seed, options.kinds)
        sizes = chunk_sizes(options.messages, len(kinds) + 1)
        fault_budget = started + 0.55 * options.timeout_s
        skipped = inject_planned(
            kinds,
            sizes,
            produce=producer.chunk,
            inject=lambda kind, final: faults.inject(chaos, kind, final),
            wait=lambda: time.sleep(chaos.rng.uniform(options.gap_min_s, options.gap_max_s)),
            in_time=lambda: time.monotonic() <= fault_budget,
        )
        second.chunk(SECOND_RECORDS)
        produced_at = time.monotonic()
        print(f"produced {producer.acknowledged} records, {second.acknowledged} to the second group", flush=True)
        chaos.finish_background(max(30.0, min(400.0, deadline - time.monotonic())))
        with sampler.lock:
            highs = {
                s: m.high
                for g in (False, True)
                for s, m in deployment.resource(g).backend().watermarks(deployment.shards(g)).items()
            }
        drained = _drain(chaos, sampler, highs, deadline)
        drain_s = round(time.monotonic() - produced_at, 1) if drained else None
        runs = _ended_runs(deployment, min(240.0, max(10.0, deadline - time.monotonic())))
        _confirmed(chaos, min(120.0, max(20.0, deadline - time.monotonic())))
        causes, unexplained = failure_causes(deployment, runs)
        sampler.stop()
        records = recorder.read_records(deployment.records_dir)
        reasons = {**sampler.park_reasons, **chaos.park_reasons}
        main = _group_verdict(chaos, sampler, producer, records, second=False)
        other = _group_verdict(chaos, sampler, second, records, second=True)
        check, committed, letters = main.verdict, main.committed, main.letters
        for evidence in (main, other):
            if evidence.state is not None:
                for sid, s in evidence.state.shards.items():
                    if s.parked is not None:
                        reasons.setdefault((sid, s.parked.start, s.parked.end), s.parked.reason)
                for d in evidence.state.dead_letters:
                    reasons.setdefault((d.shard, d.start, d.end), d.reason)
        refused_parks = refused_launch_parks(reasons, [(r.run_id, r.run_key) for r in chaos.refused])
        check.details.extend(f"{s} [{a}, {b}) parked, blaming a launch the outage refused" for s, a, b in refused_parks)
        acknowledged = producer.shard_ends()
        lag_limit_s = mirror_lag_bound_s(group.heartbeat_s) + MIRROR_LAG_MARGIN_S
        resolved = [
            (shard, start, end)
            for shard, start, end in chaos.unparked
            if any(c.shard == shard and c.start <= start < c.end for c in committed)
        ]
        result.update(
            {
                "messages": producer.acknowledged,
                "faults": chaos.counts(True),
                **check.summary(),
                "parked_resolved": len(resolved),
                "drain_s": drain_s,
                "faults_missed": chaos.counts(False),
                "faults_skipped_out_of_time": dict(Counter(skipped)),
                "poison_records": len(producer.poisoned),
                "processed_records": check.processed_records,
                "repaired_materializations": check.repaired_materializations,
                "materializations": len(committed),
                "runs": dict(Counter(r["status"] for r in runs)),
                "failed_runs_by_cause": dict(Counter(causes.values())),
                "failed_runs_unexplained": unexplained[:5],
                "zombies": zombie_outcomes(chaos.zombies, runs, causes),
                "dead_letters": len(letters),
                "parks": check.parks,
                "uncommitted": check.uncommitted,
                "committed_unseen": check.committed_unseen,
                "payload_mismatches": check.payload_mismatches,
                "broker_lost_acknowledged": sum(max(0, end - highs.get(s, 0)) for s, end in acknowledged.items()),
                "unrecorded_runs_left": main.unrecorded_left,
                "refused_launch_parks": len(refused_parks),
                "launches_refused": len(chaos.refused),
                "members_removed": sorted(chaos.removed_sensors),
                "second_group": {
                    "messages": second.acknowledged,
                    **other.verdict.summary(),
                    "broker_lost_acknowledged": sum(
                        max(0, end - highs.get(s, 0)) for s, end in second.shard_ends().items()
                    ),
                    "unrecorded_runs_left": other.unrecorded_left,
                    "processed_records": other.verdict.processed_records,
                    "materializations": len(other.committed),
                    "parks": other.verdict.parks,
                    "details": other.verdict.details[:10],
                },
                "producer_errors": producer.errors[:5],
                "samples": len(sampler.samples),
                "sample_failures": dict(sampler.failures),
                "cas_hammer": _sum_dicts(chaos.hammer_results),
                "kafka_offsets_at_end": sampler.at("kafka", highs),
                "kafka_behind_state_max_s": round(max(mirror_lag_s(sampler.samples).values(), default=0.0), 1),
                "kafka_behind_state_limit_s": lag_limit_s,
                "errors": list(chaos.errors),
                "details": check.details[:20],
                "elapsed_s": round(time.monotonic() - started, 1),
            }
        )
        if options.sinks:
            main_highs = {s: h for s, h in highs.items() if s in set(deployment.shards())}
            result["sinks"] = sink_verdict(
                deployment.records_dir,
                deployment.broker.bootstrap,
                deployment.sink_topic,
                options.partitions,
                main_highs,
                letters,
            )
        result["failures"] = failures(result)
        result["passed"] = not result["failures"]
        failed = not result["passed"]
        return result
    except Exception as exc:  # the run itself broke: say so in the JSON line, not only in a traceback
        result.update({"passed": False, "error": f"{type(exc).__name__}: {exc}"})
        result["failures"] = failures(result)
        import traceback

        traceback.print_exc()
        return result
    finally:
        deployment.close()
        if failed or options.keep:
            print(f"work directory kept: {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


@dataclass
class GroupEvidence:
    """One group's verdict and what it was drawn from."""

    state: GroupState | None
    verdict: Verdict
    committed: list[Committed]
    letters: list[tuple[str, int, int]]
    unrecorded_left: int
    """Committed runs whose records their member never confirmed (``GroupState.unrecorded_runs``) at the end."""


def _group_verdict(
    chaos: Chaos, sampler: Sampler, producer: ChaosProducer, records: list[recorder.RangeRecord], *, second: bool
) -> GroupEvidence:
    """The check of one group, by the same rules for both: its materializations against its function's records
    (those of its shards), its producer's acknowledgements, its samples and its parks."""
    deployment = chaos.deployment
    shards = set(deployment.shards(second))
    state = chaos.state(second)
    materialized = deployment.materializations(second)
    committed = [committed_of(m) for m in materialized if not m.get("backfill") and m.get("shard") is not None]
    letters = [(d.shard, d.start, d.end) for d in state.dead_letters] if state is not None else []
    parks = {p for p in sampler.parks | chaos.parks if p[0] in shards} | set(letters)
    if state is not None:
        parks |= {(sid, s.parked.start, s.parked.end) for sid, s in state.shards.items() if s.parked}
    produced = producer.payload_hashes()
    check = verdict(
        produced,
        dict.fromkeys(produced, 0),
        committed,
        [r for r in records if r.shard in shards],
        [x for x in sampler.samples if x.shard in shards],
        letters,
        parks,
        producer.poisoned,
    )
    if state is not None and state.unrecorded_runs:
        check.details.append(f"committed runs never confirmed recorded: {sorted(state.unrecorded_runs)[:5]}")
    left = len(state.unrecorded_runs) if state is not None else 0
    return GroupEvidence(state, check, committed, letters, left)


def committed_of(materialization: dict[str, Any]) -> Committed:
    """A materialization as the check sees it, tied to the run that committed its range: the run that recorded
    it, or, for one a member recorded for a run killed after its commit, the run it names (``run_id``)."""
    m = materialization
    repaired = bool(m.get("repaired"))
    run_id = m.get("run_id") if repaired else m.get("runId")
    return Committed(m["shard"], m["start"], m["end"], run_id or None, repaired, m.get("run_key"))


def _sum_dicts(items: list[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for item in items:
        total.update(item)
    return dict(total)


def _drain(chaos: Chaos, sampler: Sampler, highs: dict[str, int], deadline: float) -> bool:
    """Wait until the state's and Kafka's committed offsets reach ``highs`` (both groups' shards), resuming any
    parked shard once no poison is pending. Resuming is what lets the run end; it hides nothing: every park is
    counted (the sampler, ``resolve_parked``) and the check fails on one that holds no poison record (a range
    parked by retries that other faults exhausted, or a shard parked because the broker lost offsets)."""
    groups = {False: chaos.deployment.group_name, True: chaos.deployment.second_group}
    while time.monotonic() < deadline:
        if sampler.at("state", highs) and sampler.at("kafka", highs):
            return True
        with chaos.lock:
            quiet = not chaos.poison_pending
        if quiet:
            (chaos.work / recorder.POISON_SWITCH).unlink(missing_ok=True)
            for second, name in groups.items():
                state = None
                with contextlib.suppress(Exception):
                    state = chaos.state(second)
                if state is not None:
                    faults.note_park_reasons(chaos, state)
                    parked = {sid: (s.parked.start, s.parked.end) for sid, s in state.shards.items() if s.parked}
                    if parked:
                        faults.resolve_parked(chaos, parked, group=name)
        time.sleep(2.0)
    behind = {
        s: (sampler.latest.get(("state", s)), sampler.latest.get(("kafka", s)), h)
        for s, h in highs.items()
        if sampler.latest.get(("state", s)) != h or sampler.latest.get(("kafka", s)) != h
    }
    chaos.errors.append(f"not drained in time: (state, kafka, high) {behind}")
    return False


def _confirmed(chaos: Chaos, timeout_s: float) -> None:
    """Wait until every committed run's record is confirmed by its member, or by a stand-in of its deployment
    for a member removed (``unrecorded_runs`` empty, in both groups): a run killed after its commit gets its
    materializations from its member's next tick after the run is seen ended, which can come after the drain.
    What is left then is counted (``unrecorded_runs_left``) and fails the run."""

    def confirmed() -> bool | None:
        states = []
        with contextlib.suppress(Exception):
            states = [chaos.state(), chaos.state(second=True)]
        return True if len(states) == 2 and all(s is not None and not s.unrecorded_runs for s in states) else None

    with contextlib.suppress(TimeoutError):
        wait_for("every committed run to be confirmed recorded", confirmed, timeout_s, 2.0)


def _ended_runs(deployment: ChaosDeployment, timeout_s: float) -> list[dict[str, Any]]:
    def ended() -> list[dict[str, Any]] | None:
        runs = deployment.dev.runs()
        return None if any(r["status"] in IN_PROGRESS for r in runs) else runs

    try:
        return wait_for("every run to end", ended, timeout_s, 2.0)
    except TimeoutError:
        return deployment.dev.runs()


def parse(argv: list[str] | None = None) -> ChaosOptions:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--faults", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole run")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--gap-min", type=float, default=2.0, help="seconds between faults, at least")
    parser.add_argument("--gap-max", type=float, default=8.0, help="seconds between faults, at most")
    parser.add_argument("--after-max-attempts", choices=["park", "dead_letter"], default="park")
    parser.add_argument("--max-records-per-run", type=int, default=200_000)
    parser.add_argument("--carry-on-s", type=float, default=0.0, help="the groups' carry_on_s (0: a run per wave)")
    parser.add_argument("--kinds", default=",".join(faults.KINDS), help="the fault kinds to draw from, comma-separated")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, records)")
    parser.add_argument(
        "--sinks", action="store_true", help="the runs also commit into a Delta table and a Kafka topic, each checked"
    )
    args = parser.parse_args(argv)
    for name in ("messages", "partitions", "faults", "members", "max_records_per_run"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be >= 1")
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = sorted(set(kinds) - set(faults.KINDS))
    if unknown or not kinds:
        parser.error(f"--kinds: unknown {unknown}; choose among {', '.join(faults.KINDS)}")
    if args.carry_on_s < 0:
        parser.error("--carry-on-s: must be >= 0")
    if args.gap_min < 0 or args.gap_max < args.gap_min:
        parser.error("--gap-min/--gap-max: need 0 <= gap-min <= gap-max")
    return ChaosOptions(
        messages=args.messages,
        partitions=args.partitions,
        faults=args.faults,
        seed=args.seed,
        timeout_s=args.timeout,
        members=args.members,
        gap_min_s=args.gap_min,
        gap_max_s=args.gap_max,
        after_max_attempts=args.after_max_attempts,
        max_records_per_run=args.max_records_per_run,
        carry_on_s=args.carry_on_s,
        kinds=kinds,
        keep=args.keep,
        sinks=args.sinks,
    )


def main(argv: list[str] | None = None) -> int:
    result = run_chaos(parse(argv))
    print(json.dumps(result), flush=True)
    return 0 if result.get("passed") else 1


if __name__ == "__main__":
    sys.exit(main())
