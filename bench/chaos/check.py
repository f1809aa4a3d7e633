"""The chaos run's verdict, from what the user function recorded, what the producer was acknowledged, and what
Dagster and the stream show.

Pure: no I/O, so a test can feed it fabricated evidence (an overlap, a gap, a duplicate, an offset that went
back, a commit by a run that read nothing, a payload that changed, a park without poison) and see each
reported. The group state is not trusted: a range counts as processed only if the record of the very run that
committed it (its run id and run key) saw its offsets with the payloads the producer was acknowledged, and as
committed only if Dagster holds a materialization of it.

- ``lost``: acknowledged records of ``[low, end)`` of a shard (``end``: what the producer had acknowledged,
  never the broker's watermark, which a broker that lost records lowers) that are in no committed range
  (``uncommitted``), that the run that committed their range did not see (``committed_unseen``), or that it
  saw with another payload than the one acknowledged at that offset (``payload_mismatches``: an offset reused
  after the broker lost the record). A range the group dead-lettered counts as processed only where a
  backfill's function call saw it.
- ``unattributed_commits``: materializations whose committing run left no record of that range (it read
  nothing, or the materialization names a run that never ran the function over it).
- ``unacknowledged_seen``: records a committing run saw at offsets where the producer was acknowledged none
  (a record written twice, or one nobody produced).
- ``overlapping_commits``: pairs of distinct committed ranges of one shard that intersect.
- ``duplicate_materializations``: materializations of a range beyond its first.
- ``backwards``: a committed offset (the group state's, or Kafka's group offset) lower than the one sampled
  before it, per shard and source.
- ``unexplained_parks``: parked (or dead-lettered) ranges that hold none of the injected poison records: the
  drain resumes every parked shard, so a shard parked for no reason would otherwise go unnoticed.
- ``reprocessed_records``: records the function saw in member runs beyond the first time (retries, refused
  zombies, runs killed before or after their commit), counted, not hidden.
- ``refused_launch_parks`` (``refused_launch_parks``): parked or dead-lettered ranges whose reason blames a launch
  that the launcher outage refused. A refused launch read nothing and is not an attempt; a range given up for it
  is counted whether or not it also holds a poison record, which the park matching would otherwise accept.

``failures`` turns the whole run's JSON line into the reasons it fails: any of the counts above, committed runs
whose records their members never confirmed (``unrecorded_runs_left``), a fault that never landed, an error of
the driver, a zombie whose commit was not refused, Kafka's group offsets staying behind the state's longer than
``mirror_lag_bound_s`` plus its margin, or the second group (``second_group``: its own verdict, by the same
rules) failing any of the same counts or having consumed nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.recorder import RangeRecord, intervals, offsets_of

Span = tuple[int, int]
ShardSpan = tuple[str, int, int]

NOT_ACKNOWLEDGED = -1
"""The payload hash of an offset where the producer was acknowledged no record (a CRC-32 is never negative)."""

COMMIT_WAIT_S = 30.0
"""How long ``run_kill_after_commit`` keeps the broker paused, at most, waiting for the held run's commit."""

MIRROR_LAG_TICKS = 6
"""Ticks the mirror may take to catch up once the broker answers again: run monitoring fails the killed run,
its member repairs the range and mirrors it at its next tick; a mirror that failed catches up at the shard's
next commit (new records wait ``max_wait_s``, one tick, then a run)."""

MIRROR_LAG_MARGIN_S = 30.0
"""Margin over ``mirror_lag_bound_s``: a run or a broker restart slowed down by a loaded machine."""


def mirror_lag_bound_s(heartbeat_s: float) -> float:
    """The longest Kafka's group offset of a shard may stay below the group state's in the chaos run: the broker
    paused by ``run_kill_after_commit`` (``COMMIT_WAIT_S``), then ``MIRROR_LAG_TICKS`` ticks."""
    return COMMIT_WAIT_S + MIRROR_LAG_TICKS * heartbeat_s


@dataclass(frozen=True)
class Committed:
    """One materialization of a committed range (Dagster's record of it)."""

    shard: str
    start: int
    end: int
    run_id: str | None = None
    """The run that committed the range (for a materialization a member repaired: the run it repaired)."""
    repaired: bool = False
    run_key: str | None = None
    """The run key the materialization names; the committing run's record must carry the same."""


@dataclass(frozen=True)
class Sample:
    """A committed offset seen at ``at`` from ``source`` (``state`` or ``kafka``)."""

    at: float
    source: str
    shard: str
    offset: int


@dataclass
class Verdict:
    lost: int = 0
    overlapping_commits: int = 0
    duplicate_materializations: int = 0
    backwards: int = 0
    reprocessed_records: int = 0
    processed_records: int = 0
    committed_unseen: int = 0
    """Acknowledged records inside committed ranges that the committing run did not see (part of ``lost``)."""
    uncommitted: int = 0
    """Acknowledged records that no committed range holds (part of ``lost``)."""
    payload_mismatches: int = 0
    """Acknowledged records whose offset the committing run saw with another payload (part of ``lost``)."""
    unattributed_commits: int = 0
    unacknowledged_seen: int = 0
    parks: int = 0
    unexplained_parks: int = 0
    repaired_materializations: int = 0
    details: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "lost": self.lost,
            "overlapping_commits": self.overlapping_commits,
            "duplicate_materializations": self.duplicate_materializations,
            "backwards": self.backwards,
            "unattributed_commits": self.unattributed_commits,
            "unacknowledged_seen": self.unacknowledged_seen,
            "unexplained_parks": self.unexplained_parks,
            "reprocessed_records": self.reprocessed_records,
        }


def merge(spans: Iterable[Span]) -> list[Span]:
    """Sorted, disjoint, non-adjacent union of ``[start, end)`` spans."""
    out: list[Span] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def size(spans: Iterable[Span]) -> int:
    return sum(end - start for start, end in spans)


def intersect(a: Sequence[Span], b: Sequence[Span]) -> list[Span]:
    """Intersection of two merged span lists."""
    out: list[Span] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Span], b: Sequence[Span]) -> list[Span]:
    """``a`` minus ``b``, both merged."""
    cut = intersect(a, b)
    out: list[Span] = []
    j = 0
    for start, end in a:
        position = start
        while j < len(cut) and cut[j][1] <= start:
            j += 1
        k = j
        while k < len(cut) and cut[k][0] < end:
            if cut[k][0] > position:
                out.append((position, cut[k][0]))
            position = max(position, cut[k][1])
            k += 1
        if position < end:
            out.append((position, end))
    return out


def backwards_steps(samples: Iterable[Sample]) -> tuple[int, list[str]]:
    """Decreases between consecutive samples of one (source, shard)."""
    last: dict[tuple[str, str], Sample] = {}
    count = 0
    details = []
    for sample in sorted(samples, key=lambda s: s.at):
        key = (sample.source, sample.shard)
        before = last.get(key)
        if before is not None and sample.offset < before.offset:
            count += 1
            details.append(
                f"{sample.source} offset of {sample.shard} went back from {before.offset} to {sample.offset} "
                f"(at +{sample.at - before.at:.1f} s)"
            )
        last[key] = sample
    return count, details


def mirror_lag_s(samples: Iterable[Sample]) -> dict[str, float]:
    """Per shard, the longest stretch during which Kafka's group offset stayed below the group state's
    committed offset (the mirror runs after the state commit; a run killed between them leaves it behind
    until the shard's next commit).

    Before a shard's first commit Kafka holds no offset for it (nothing is mirrored for a position), while the
    state holds the position it starts from: until the state moves past its first sampled offset, a missing
    Kafka offset is not behind. Otherwise a shard that takes long to commit its first range (a poisoned one,
    parked until it is resumed) would count as a lagging mirror. The sampler starts before any record is
    produced, so the first sampled offset is that starting position."""
    state: dict[str, int] = {}
    kafka: dict[str, int] = {}
    start: dict[str, int] = {}
    behind_since: dict[str, float] = {}
    longest: dict[str, float] = defaultdict(float)
    for sample in sorted(samples, key=lambda s: s.at):
        (state if sample.source == "state" else kafka)[sample.shard] = sample.offset
        shard = sample.shard
        if sample.source == "state":
            start.setdefault(shard, sample.offset)
        if shard in state and kafka.get(shard, start.get(shard, -1)) < state[shard]:
            behind_since.setdefault(shard, sample.at)
            longest[shard] = max(longest[shard], sample.at - behind_since[shard])
        else:
            behind_since.pop(shard, None)
    return dict(longest)


def acknowledged_spans(hashes: Sequence[int], low: int = 0) -> list[Span]:
    """The offsets from ``low`` on where the producer was acknowledged a record, as merged spans."""
    spans: list[Span] = []
    first: int | None = None
    for offset in range(low, len(hashes)):
        if hashes[offset] != NOT_ACKNOWLEDGED:
            if first is None:
                first = offset
        elif first is not None:
            spans.append((first, offset))
            first = None
    if first is not None:
        spans.append((first, len(hashes)))
    return spans


@dataclass
class _Read:
    """What one function call saw of ``[start, end)``, held against what the producer was acknowledged."""

    seen: list[Span] = field(default_factory=list)
    """Offsets seen with the acknowledged payload."""
    mismatched: set[int] = field(default_factory=set)
    unacknowledged: set[int] = field(default_factory=set)


def _read_of(record: RangeRecord, start: int, end: int, acknowledged: Sequence[int], details: list[str]) -> _Read:
    read = _Read()
    offsets = list(offsets_of(record.intervals))
    if len(offsets) != len(record.hashes):
        details.append(
            f"{record.shard}: the record of run {record.run_id} over [{record.start}, {record.end}) holds "
            f"{len(record.hashes)} payload hashes for {len(offsets)} offsets: none of its offsets count as seen"
        )
        return read
    matched: list[int] = []
    for offset, crc in zip(offsets, record.hashes, strict=True):
        if not start <= offset < end:
            continue
        expected = acknowledged[offset] if offset < len(acknowledged) else NOT_ACKNOWLEDGED
        if expected == NOT_ACKNOWLEDGED:
            read.unacknowledged.add(offset)
        elif crc != expected:
            read.mismatched.add(offset)
        else:
            matched.append(offset)
    read.seen = list(intervals(matched))
    return read


def unexplained_parks(parks: Iterable[tuple[str, int, int]], poisoned: Iterable[tuple[str, int]]) -> list[ShardSpan]:
    """Parked (or dead-lettered) ranges that hold no injected poison record: a shard parked for no reason."""
    poison: dict[str, list[int]] = defaultdict(list)
    for shard, offset in poisoned:
        poison[shard].append(offset)
    return [
        (shard, start, end)
        for shard, start, end in sorted(set(parks))
        if not any(start <= offset < end for offset in poison.get(shard, []))
    ]


def names_refused(reason: str, run_id: str, run_key: str | None) -> bool:
    """Whether a park's reason (``run <key> failed N time(s); last error: ...``) blames a refused launch: its last
    failure was that run, by its id (only the refusal of a run that never started can name it) or by its run key
    (a relaunch has a key of its own, ``<key>:l<n>``)."""
    return run_id in reason or (run_key is not None and f"run {run_key} failed" in reason)


def refused_launch_parks(
    reasons: Mapping[ShardSpan, str], refused: Iterable[tuple[str, str | None]]
) -> list[ShardSpan]:
    """Parked or dead-lettered ranges (with their reasons) that blame one of the ``refused`` launches (run id,
    run key)."""
    launches = list(refused)
    return sorted(span for span, reason in reasons.items() if any(names_refused(reason, i, k) for i, k in launches))


def verdict(
    produced: Mapping[str, Sequence[int]],
    lows: Mapping[str, int],
    committed: Sequence[Committed],
    records: Sequence[RangeRecord],
    samples: Sequence[Sample] = (),
    dead_letters: Sequence[tuple[str, int, int]] = (),
    parks: Iterable[tuple[str, int, int]] = (),
    poisoned: Iterable[tuple[str, int]] = (),
) -> Verdict:
    """The check over every shard of ``produced``: per shard, the payload hash the producer was acknowledged at
    each offset (``NOT_ACKNOWLEDGED`` where none), so its length is the acknowledged end."""
    v = Verdict()
    by_shard: dict[str, list[Committed]] = defaultdict(list)
    for c in committed:
        by_shard[c.shard].append(c)
        v.repaired_materializations += int(c.repaired)
    by_run: dict[tuple[str, str, int, int], list[RangeRecord]] = defaultdict(list)
    by_key: dict[tuple[str, str, int, int], list[RangeRecord]] = defaultdict(list)
    backfills: dict[str, list[RangeRecord]] = defaultdict(list)
    seen_member: dict[str, list[Span]] = defaultdict(list)
    seen_total: dict[str, int] = defaultdict(int)
    for r in records:
        if r.backfill:
            if not r.raised:
                backfills[r.shard].append(r)
            continue
        by_run[(r.run_id, r.shard, r.start, r.end)].append(r)
        if r.run_key is not None:
            by_key[(r.run_key, r.shard, r.start, r.end)].append(r)
        seen_member[r.shard].extend(r.intervals)
        seen_total[r.shard] += r.seen
    letters: dict[str, list[Span]] = defaultdict(list)
    for shard, start, end in dead_letters:
        letters[shard].append((start, end))

    for shard in sorted(set(produced) | set(by_shard)):
        acknowledged = produced.get(shard, ())
        stream = acknowledged_spans(acknowledged, lows.get(shard, 0))
        ranges = by_shard.get(shard, [])
        counts: dict[Span, int] = defaultdict(int)
        for c in ranges:
            counts[(c.start, c.end)] += 1
        for span, n in sorted(counts.items()):
            if n > 1:
                v.duplicate_materializations += n - 1
                v.details.append(f"{shard} [{span[0]}, {span[1]}) materialized {n} times")
        distinct = sorted(counts)
        for i, a in enumerate(distinct):
            for b in distinct[i + 1 :]:
                if b[0] >= a[1]:
                    break
                v.overlapping_commits += 1
                v.details.append(f"{shard}: committed ranges [{a[0]}, {a[1]}) and [{b[0]}, {b[1]}) overlap")

        unseen: list[Span] = []
        mismatched: set[int] = set()
        unacknowledged: set[int] = set()
        for c in ranges:
            expected = intersect(stream, [(c.start, c.end)])
            record = _committing_record(c, by_run, by_key)
            if record is None:
                v.unattributed_commits += 1
                v.details.append(
                    f"{shard} [{c.start}, {c.end}) committed by run {c.run_id} (key {c.run_key}), which left no "
                    "record of reading it"
                )
                unseen.extend(expected)
                continue
            read = _read_of(record, c.start, c.end, acknowledged, v.details)
            unseen.extend(subtract(expected, merge([*read.seen, *((o, o + 1) for o in read.mismatched)])))
            mismatched |= read.mismatched
            unacknowledged |= read.unacknowledged
        # A dead-lettered range was given up by the group, not committed by a run: it counts as processed
        # only where a function call (a backfill) saw it.
        for start, end in letters.get(shard, []):
            expected = intersect(stream, [(start, end)])
            seen: list[Span] = []
            for record in backfills.get(shard, []):
                read = _read_of(record, start, end, acknowledged, v.details)
                seen.extend(read.seen)
                mismatched |= read.mismatched
                unacknowledged |= read.unacknowledged
            unseen.extend(subtract(expected, merge([*seen, *((o, o + 1) for o in mismatched)])))
        covered = merge([*distinct, *letters.get(shard, [])])
        uncommitted = subtract(stream, covered)
        unseen = merge(unseen)
        if uncommitted:
            v.uncommitted += size(uncommitted)
            v.details.append(f"{shard}: acknowledged, never committed {uncommitted[:5]}")
        if unseen:
            v.committed_unseen += size(unseen)
            v.details.append(f"{shard}: committed, never seen by the run that committed it {unseen[:5]}")
        if mismatched:
            v.payload_mismatches += len(mismatched)
            v.details.append(
                f"{shard}: offsets read with another payload than the acknowledged one {sorted(mismatched)[:5]}"
            )
        if unacknowledged:
            v.unacknowledged_seen += len(unacknowledged)
            v.details.append(f"{shard}: records read where none was acknowledged {sorted(unacknowledged)[:5]}")
        distinct_seen = size(merge(seen_member.get(shard, [])))
        v.processed_records += distinct_seen
        v.reprocessed_records += seen_total.get(shard, 0) - distinct_seen
    v.lost = v.uncommitted + v.committed_unseen + v.payload_mismatches
    v.backwards, steps = backwards_steps(samples)
    v.details.extend(steps)
    distinct_parks = set(parks)
    v.parks = len(distinct_parks)
    odd = unexplained_parks(distinct_parks, poisoned)
    v.unexplained_parks = len(odd)
    v.details.extend(f"{shard} [{start}, {end}) parked, holding no poison record" for shard, start, end in odd)
    return v


def _committing_record(
    c: Committed,
    by_run: Mapping[tuple[str, str, int, int], list[RangeRecord]],
    by_key: Mapping[tuple[str, str, int, int], list[RangeRecord]],
) -> RangeRecord | None:
    """The record of the run that committed ``c``: the same run (by id, or by run key where the materialization
    names no run), shard and range, from a call that did not raise, under the same run key."""
    if c.run_id is not None:
        candidates = by_run.get((c.run_id, c.shard, c.start, c.end), [])
    elif c.run_key is not None:
        candidates = by_key.get((c.run_key, c.shard, c.start, c.end), [])
    else:
        candidates = []
    for r in candidates:
        if not r.raised and (c.run_key is None or r.run_key == c.run_key):
            return r
    return None


GROUP_COUNTS = (
    "lost",
    "overlapping_commits",
    "duplicate_materializations",
    "backwards",
    "unattributed_commits",
    "unacknowledged_seen",
    "unexplained_parks",
    "broker_lost_acknowledged",
    "unrecorded_runs_left",
)
"""The counts judged for each group, the main one and ``second_group``: any non-zero is a violation."""

COUNTS = (*GROUP_COUNTS, "refused_launch_parks")
"""The counts of the run's JSON line judged at its top level."""

REQUIRED = (
    *COUNTS,
    "second_group",
    "drain_s",
    "faults",
    "faults_missed",
    "faults_skipped_out_of_time",
    "errors",
    "zombies",
    "kafka_behind_state_max_s",
    "kafka_behind_state_limit_s",
)
"""The fields of the run's JSON line that ``failures`` judges; one missing is a failure, never a pass."""


def failures(result: Mapping[str, Any]) -> list[str]:
    """Every reason the chaos run fails, from its JSON line. A run passes only when this is empty: nothing lost,
    overlapped, duplicated, gone back, committed unread or parked for no reason (or for a refused launch), no
    committed run left unconfirmed, in either group, the second one having consumed records; every planned fault
    landed and the driver met no error; every zombie's commit was refused; the backlog drained; Kafka's group
    offsets never stayed behind the state's past their bound plus its margin."""
    if result.get("error"):
        return [f"the run broke: {result['error']}"]
    missing = [name for name in REQUIRED if name not in result]
    if missing:
        return [f"evidence missing from the result: {missing}"]
    out = [
        f"{name}: {result[name]}"
        for name in COUNTS
        if result[name]  # counts: any non-zero is a violation
    ]
    second: Mapping[str, Any] = result["second_group"]
    missing = [name for name in (*GROUP_COUNTS, "messages") if name not in second]
    if missing:
        out.append(f"evidence of the second group missing: {missing}")
    else:
        out += [f"second_group {name}: {second[name]}" for name in GROUP_COUNTS if second[name]]
        if not second["messages"]:
            out.append("the second group was given no records: its check says nothing")
    if result["drain_s"] is None:
        out.append("the backlog did not drain in time")
    if result["faults_missed"]:
        out.append(f"faults that found nothing to act on or whose action failed: {result['faults_missed']}")
    if result["faults_skipped_out_of_time"]:
        out.append(f"faults never injected (out of time): {result['faults_skipped_out_of_time']}")
    if result["errors"]:
        out.append(f"{len(result['errors'])} error(s) of the driver: {result['errors'][:3]}")
    zombies: list[Mapping[str, Any]] = result["zombies"]
    landed = result["faults"].get("run_pause_zombie", 0)
    if len(zombies) != landed:
        out.append(f"{landed} zombie fault(s) landed, {len(zombies)} zombie run(s) recorded")
    for zombie in zombies:
        if zombie.get("status") != "FAILURE" or zombie.get("cause") != "commit_refused":
            out.append(
                f"zombie run {zombie.get('run')} ended {zombie.get('status')} ({zombie.get('cause')}): its commit "
                "was not refused"
            )
    for sink, found in (result.get("sinks") or {}).items():  # the Delta table and the output topic, if written
        out += [f"sink {sink} {name}: {found[name]}" for name in ("lost", "doubled", "extra") if found[name]]
    lag, limit = result["kafka_behind_state_max_s"], result["kafka_behind_state_limit_s"]
    if lag > limit:
        out.append(f"Kafka's group offset stayed behind the state's for {lag} s, past the limit of {limit} s")
    return out
