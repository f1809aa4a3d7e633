"""The chaos run's verdict, from what the user function recorded and what Dagster and the stream show.

Pure: no I/O, so a test can feed it fabricated evidence (an overlap, a gap, a duplicate, an offset that went
back) and see each reported. The group state is not trusted: a range counts as processed only if the
function's own record of a call that did not raise saw its offsets, and as committed only if Dagster holds a
materialization of it.

- ``lost``: offsets of ``[low, end)`` of a shard (``end``: what the producer had acknowledged) that are not
  in any committed range, plus offsets of committed ranges that no successful function call saw. A range
  the group dead-lettered counts as processed only where a backfill's function call saw it.
- ``overlapping_commits``: pairs of distinct committed ranges of one shard that intersect.
- ``duplicate_materializations``: materializations of a range beyond its first.
- ``backwards``: a committed offset (the group state's, or Kafka's group offset) lower than the one sampled
  before it, per shard and source.
- ``reprocessed_records``: records the function saw in member runs beyond the first time (retries, refused
  zombies, runs killed before or after their commit), counted, not hidden.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.recorder import RangeRecord

Span = tuple[int, int]


@dataclass(frozen=True)
class Committed:
    """One materialization of a committed range (Dagster's record of it)."""

    shard: str
    start: int
    end: int
    run_id: str | None = None
    repaired: bool = False


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
    """Offsets inside committed ranges that no successful function call saw (part of ``lost``)."""
    uncommitted: int = 0
    """Offsets of the stream that no committed range holds (part of ``lost``)."""
    repaired_materializations: int = 0
    details: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "lost": self.lost,
            "overlapping_commits": self.overlapping_commits,
            "duplicate_materializations": self.duplicate_materializations,
            "backwards": self.backwards,
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
    until the shard's next commit)."""
    state: dict[str, int] = {}
    kafka: dict[str, int] = {}
    behind_since: dict[str, float] = {}
    longest: dict[str, float] = defaultdict(float)
    for sample in sorted(samples, key=lambda s: s.at):
        (state if sample.source == "state" else kafka)[sample.shard] = sample.offset
        shard = sample.shard
        if shard in state and kafka.get(shard, -1) < state[shard]:
            behind_since.setdefault(shard, sample.at)
            longest[shard] = max(longest[shard], sample.at - behind_since[shard])
        else:
            behind_since.pop(shard, None)
    return dict(longest)


def verdict(
    ends: Mapping[str, int],
    lows: Mapping[str, int],
    committed: Sequence[Committed],
    records: Sequence[RangeRecord],
    samples: Sequence[Sample] = (),
    dead_letters: Sequence[tuple[str, int, int]] = (),
) -> Verdict:
    """The check over every shard of ``ends`` (exclusive end offsets the producer was acknowledged)."""
    v = Verdict()
    by_shard: dict[str, list[Committed]] = defaultdict(list)
    for c in committed:
        by_shard[c.shard].append(c)
        v.repaired_materializations += int(c.repaired)
    seen_ok: dict[str, list[Span]] = defaultdict(list)
    seen_member: dict[str, list[Span]] = defaultdict(list)
    seen_total: dict[str, int] = defaultdict(int)
    for r in records:
        if not r.raised:
            seen_ok[r.shard].extend(r.intervals)
        if not r.backfill:
            seen_member[r.shard].extend(r.intervals)
            seen_total[r.shard] += r.seen
    letters: dict[str, list[Span]] = defaultdict(list)
    for shard, start, end in dead_letters:
        letters[shard].append((start, end))

    for shard in sorted(set(ends) | set(by_shard)):
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
        # A dead-lettered range was given up by the group, not committed by a run: it counts as processed
        # only where a function call (a backfill) saw it.
        covered = merge([*distinct, *letters.get(shard, [])])
        processed = merge(seen_ok.get(shard, []))
        stream = [(lows.get(shard, 0), ends.get(shard, 0))]
        uncommitted = subtract(merge(stream), covered)
        unseen = subtract(covered, processed)
        if uncommitted:
            v.uncommitted += size(uncommitted)
            v.details.append(f"{shard}: offsets never committed {uncommitted[:5]}")
        if unseen:
            v.committed_unseen += size(unseen)
            v.details.append(f"{shard}: committed, never seen by the function {unseen[:5]}")
        distinct_seen = size(merge(seen_member.get(shard, [])))
        v.processed_records += distinct_seen
        v.reprocessed_records += seen_total.get(shard, 0) - distinct_seen
    v.lost = v.uncommitted + v.committed_unseen
    v.backwards, steps = backwards_steps(samples)
    v.details.extend(steps)
    return v
