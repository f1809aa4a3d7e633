"""The topic-lifecycle run's verdict: every record each topic version held is read exactly once, or reported by an
event that names it.

Pure: a test feeds it fabricated evidence (a record nobody read and no event names, one read twice, one read from
another topic version than its range's, an event of another version) and sees each reported. The group state is
not trusted: a record counts as read only if a committed run read it, with the payload the producer was
acknowledged at that offset of that topic version (the payload names the version it was written to, so a range
read from a recreated topic under the old topic's offsets is caught).

A topic version is a topic name and the id Kafka gave it when it was created (a topic deleted and created again
under the name is a new version). On v3io a version is a stream path and how many times it was created there, and
each shard's log has an identity of its own (``Evidence.identities`` maps each to its version); shard ids are bare
shard numbers of the one stream ``Evidence.stream`` names. An event names records when it is one of:

- ``data_loss`` of the shard, for offsets in ``[start, end)`` (records deleted before they were read);
- ``recreated`` of the shard, for the old version it names (``identity OLD -> NEW``) and offsets from ``start``
  on (the old topic was deleted before they were read);
- ``removed`` of the shard, for offsets from ``start`` on, when the topic is not put back on the group's list while
  the version the event names still exists (``off_list``; without it: when the topic is off the list at the end).

A version created while its topic was off every list and gone before the topic was put back (or never put back) was
never the group's to read: its records are reported as ``unlisted``, not lost.

Events other than ``recreated`` carry no identity: each is given the version the group held the shard in at the
time, from the shard's ``recreated`` events (before the first one: that event's old identity; with none, the
version created last before the event).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

RECREATED_IDS = re.compile(r"identity (\S+) -> ([^\s):]+)")


@dataclass(frozen=True)
class Version:
    topic: str
    number: int
    topic_id: str
    partitions: int
    created_at: float


@dataclass(frozen=True)
class ReadRange:
    """A committed range and what its run read: ``records`` are ``(offset, payload)``."""

    shard: str
    identity: str | None
    start: int
    end: int
    records: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True)
class Event:
    kind: str
    shard: str | None
    start: int | None
    end: int | None
    detail: str
    at: float


@dataclass
class Evidence:
    versions: list[Version]
    acked: dict[tuple[str, int, int], dict[int, bytes]]
    """``(topic, version number, partition)`` -> offset -> payload, from the producer's delivery reports."""
    reads: list[ReadRange]
    events: list[Event]
    final_topics: set[str]
    """The group's list at the end (a topic removed for good may have records nobody was to read)."""
    identities: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Log identity -> ``(topic, version number)``, besides each version's ``topic_id`` (v3io: one per shard)."""
    off_list: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)
    """Topic -> the spans it was off the lists, ``(removal began, putting back began)``; None: off at the end."""
    stream: str | None = None
    """Set when shard ids are bare shard numbers of this one stream (v3io), else they are ``topic:partition``."""

    def owners(self) -> dict[str, tuple[str, int]]:
        """Every identity a read or an event may carry, with the version it names."""
        return {**{v.topic_id: (v.topic, v.number) for v in self.versions}, **self.identities}

    def split(self, shard: str) -> tuple[str, int]:
        """``(topic, partition)`` of a shard id."""
        if self.stream is not None:
            return self.stream, int(shard)
        topic, _, partition = shard.rpartition(":")
        return topic, int(partition)


@dataclass
class Verdict:
    acknowledged: int = 0
    read: int = 0
    lost: int = 0
    lost_where: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """``topic vN:partition`` -> how many records were lost there, the lowest offset and the highest."""
    duplicates: int = 0
    payload_mismatches: int = 0
    unacknowledged_seen: int = 0
    reported: dict[str, int] = field(default_factory=dict)
    """Unread records by the event kind that names them."""
    details: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        return [
            f"{name} {value}"
            for name, value in (
                ("lost", self.lost),
                ("duplicates", self.duplicates),
                ("payload_mismatches", self.payload_mismatches),
                ("unacknowledged_seen", self.unacknowledged_seen),
            )
            if value
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "acknowledged": self.acknowledged,
            "read": self.read,
            "lost": self.lost,
            "lost_where": {w: f"{n} in [{lo}, {hi}]" for w, (n, lo, hi) in sorted(self.lost_where.items())},
            "duplicates": self.duplicates,
            "payload_mismatches": self.payload_mismatches,
            "unacknowledged_seen": self.unacknowledged_seen,
            "reported_unread": dict(sorted(self.reported.items())),
        }


def payload(topic: str, number: int, partition: int, seq: int) -> bytes:
    """What the producer writes: the record names the topic version and partition it was written to."""
    return f"{topic}|{number}|{partition}|{seq}".encode()


def payload_key(value: bytes) -> tuple[str, int, int] | None:
    parts = value.decode(errors="replace").split("|")
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return parts[0], int(parts[1]), int(parts[2])


VersionKey = tuple[str, int]
"""``(topic, version number)``."""


def attribute(evidence: Evidence) -> list[tuple[Event, VersionKey | None]]:
    """Each event with the version the group held its shard in when it happened."""
    events, versions, owners = evidence.events, evidence.versions, evidence.owners()
    switches: dict[str, list[tuple[float, int, str, str]]] = defaultdict(list)
    for i, event in enumerate(events):
        if event.kind == "recreated" and event.shard is not None:
            found = RECREATED_IDS.search(event.detail)
            if found:
                switches[event.shard].append((event.at, i, found.group(1), found.group(2)))
    out: list[tuple[Event, VersionKey | None]] = []
    for i, event in enumerate(events):
        if event.shard is None:
            out.append((event, None))
            continue
        if event.kind == "recreated":
            found = RECREATED_IDS.search(event.detail)
            out.append((event, owners.get(found.group(1)) if found else None))
            continue
        timeline = sorted(switches.get(event.shard, []))
        before = [s for s in timeline if (s[0], s[1]) <= (event.at, i)]
        after = [s for s in timeline if (s[0], s[1]) > (event.at, i)]
        if before:
            out.append((event, owners.get(before[-1][3])))
        elif after:
            out.append((event, owners.get(after[0][2])))
        else:
            topic, partition = evidence.split(event.shard)
            candidates = [
                v for v in versions if v.topic == topic and v.partitions > partition and v.created_at <= event.at
            ]
            chosen = max(candidates, key=lambda v: v.created_at) if candidates else None
            out.append((event, (chosen.topic, chosen.number) if chosen is not None else None))
    return out


def check(evidence: Evidence) -> Verdict:
    verdict = Verdict()
    owners = evidence.owners()
    seen: Counter[tuple[str, int, int, int]] = Counter()
    for r in evidence.reads:
        owner = owners.get(r.identity or "")
        topic, partition = evidence.split(r.shard)
        if owner is None or owner[0] != topic:
            verdict.unacknowledged_seen += len(r.records)
            verdict.details.append(f"{r.shard} [{r.start}, {r.end}) committed under an unknown identity {r.identity}")
            continue
        key = (topic, owner[1], partition)
        acked = evidence.acked.get(key, {})
        for offset, value in r.records:
            if not r.start <= offset < r.end:
                verdict.payload_mismatches += 1
                verdict.details.append(f"{r.shard}: offset {offset} read outside [{r.start}, {r.end})")
                continue
            if payload_key(value) != key:
                verdict.payload_mismatches += 1
                verdict.details.append(f"{r.shard}@{offset}: read {value[:60]!r}, the range's version is {key}")
                continue
            if offset not in acked:
                verdict.unacknowledged_seen += 1
                continue
            if acked[offset] != value:
                verdict.payload_mismatches += 1
                continue
            seen[(topic, owner[1], partition, offset)] += 1
    verdict.read = len(seen)
    for record, count in seen.items():
        if count > 1:
            verdict.duplicates += count - 1
            if len(verdict.details) < 40:
                verdict.details.append(f"{record} read {count} times")
    covering = _coverage(evidence)
    for (topic, number, partition), offsets in evidence.acked.items():
        version = next(v for v in evidence.versions if (v.topic, v.number) == (topic, number))
        spans = covering.get((topic, number, partition), [])
        unlisted = _unlisted(evidence, version)
        for offset in offsets:
            verdict.acknowledged += 1
            if (topic, number, partition, offset) in seen:
                continue
            cause = next((kind for kind, lo, hi in spans if lo <= offset < hi), None)
            if cause is None and unlisted:
                cause = "unlisted"
            if cause is not None:
                verdict.reported[cause] = verdict.reported.get(cause, 0) + 1
                continue
            verdict.lost += 1
            _widen(verdict.lost_where, f"{topic} v{number}:{partition}", offset)
            if len(verdict.details) < 40:
                verdict.details.append(f"{topic} v{number} ({version.topic_id}) :{partition}@{offset} unread, no event")
    return verdict


def _widen(spans: dict[str, tuple[int, int, int]], where: str, offset: int) -> None:
    count, lo, hi = spans.get(where, (0, offset, offset))
    spans[where] = (count + 1, min(lo, offset), max(hi, offset))


def _successor(evidence: Evidence, version: Version) -> Version | None:
    """The version of the topic created next (this one was deleted before it)."""
    later = [v for v in evidence.versions if v.topic == version.topic and v.number > version.number]
    return min(later, key=lambda v: v.number) if later else None


def _off_span(evidence: Evidence, topic: str, at: float) -> tuple[float, float | None] | None:
    """The span during which ``topic`` was off the lists that holds ``at``."""
    return next((x for x in evidence.off_list.get(topic, []) if x[0] <= at and (x[1] is None or at < x[1])), None)


def _gone_before_back(span: tuple[float, float | None], successor: Version | None) -> bool:
    """Whether a version ended (its successor was created) before its topic was put back on the lists."""
    return span[1] is None or (successor is not None and successor.created_at <= span[1])


def _unlisted(evidence: Evidence, version: Version) -> bool:
    """Whether ``version`` lived all its life while its topic was off every member's list."""
    span = _off_span(evidence, version.topic, version.created_at)
    return span is not None and _gone_before_back(span, _successor(evidence, version))


def _removal_covers(evidence: Evidence, event: Event, version: Version | None) -> bool:
    """Whether a ``removed`` event names its version's unread records for good: the topic stayed off the lists,
    or the version was deleted before the topic was put back (without the spans: off the list at the end)."""
    topic = evidence.split(event.shard or "")[0]
    if topic not in evidence.off_list:
        return topic not in evidence.final_topics
    span = _off_span(evidence, topic, event.at)
    return span is not None and version is not None and _gone_before_back(span, _successor(evidence, version))


def _coverage(evidence: Evidence) -> dict[tuple[str, int, int], list[tuple[str, int, float]]]:
    """(topic, version number, partition) -> the spans of offsets events report unread, with the kind of each."""
    out: dict[tuple[str, int, int], list[tuple[str, int, float]]] = defaultdict(list)
    by_key = {(v.topic, v.number): v for v in evidence.versions}
    for event, version in attribute(evidence):
        if event.shard is None or version is None or event.start is None:
            continue
        topic, partition = evidence.split(event.shard)
        if topic != version[0]:
            continue
        where = (topic, version[1], partition)
        if event.kind == "data_loss" and event.end is not None:
            out[where].append(("data_loss", event.start, event.end))
        elif event.kind == "recreated":
            out[where].append(("recreated", event.start, float("inf")))
        elif event.kind == "removed" and _removal_covers(evidence, event, by_key.get(version)):
            out[where].append(("removed", event.start, float("inf")))
    return out


def summary(verdict: Verdict, extra: Mapping[str, Any], errors: Iterable[str]) -> dict[str, Any]:
    """The run's JSON line: the verdict's figures, what the driver measured, and why it failed (if it did)."""
    failures = [*verdict.failures, *(f"error: {e}" for e in errors)]
    return {**extra, **verdict.as_dict(), "failures": failures, "passed": not failures, "details": verdict.details[:20]}
