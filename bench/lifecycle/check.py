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
- ``removed`` of the shard, for offsets from ``start`` on, when the topic is not on the group's list at the end.

A version of a topic off the group's list at the end that was created after the topic's removal (``unlisted_since``)
was never the group's to read: its records are reported as ``unlisted``, not lost.

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
    unlisted_since: dict[str, float] = field(default_factory=dict)
    """Topic -> when the last member took it off its list, for the topics off the list at the end."""
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
        for offset in offsets:
            verdict.acknowledged += 1
            if (topic, number, partition, offset) in seen:
                continue
            cause = next((kind for kind, lo, hi in spans if lo <= offset < hi), None)
            if cause is None and _unlisted(evidence, version):
                cause = "unlisted"
            if cause is not None:
                verdict.reported[cause] = verdict.reported.get(cause, 0) + 1
                continue
            verdict.lost += 1
            if len(verdict.details) < 40:
                verdict.details.append(f"{topic} v{number} ({version.topic_id}) :{partition}@{offset} unread, no event")
    return verdict


def _unlisted(evidence: Evidence, version: Version) -> bool:
    """Whether ``version`` was created after its topic left every member's list, for good."""
    since = evidence.unlisted_since.get(version.topic)
    return since is not None and version.topic not in evidence.final_topics and version.created_at >= since


def _coverage(evidence: Evidence) -> dict[tuple[str, int, int], list[tuple[str, int, float]]]:
    """(topic, version number, partition) -> the spans of offsets events report unread, with the kind of each."""
    out: dict[tuple[str, int, int], list[tuple[str, int, float]]] = defaultdict(list)
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
        elif event.kind == "removed" and topic not in evidence.final_topics:
            out[where].append(("removed", event.start, float("inf")))
    return out


def summary(verdict: Verdict, extra: Mapping[str, Any], errors: Iterable[str]) -> dict[str, Any]:
    """The run's JSON line: the verdict's figures, what the driver measured, and why it failed (if it did)."""
    failures = [*verdict.failures, *(f"error: {e}" for e in errors)]
    return {**extra, **verdict.as_dict(), "failures": failures, "passed": not failures, "details": verdict.details[:20]}
