"""The group state object: one per (stream, consumer group), held by a store under compare-and-set.

Offsets are always the *next offset to read* (exclusive end of what is done), as Kafka counts them.
Times are seconds on the store's clock (``StateStore.now()``), never a member's own wall clock.
Everything is immutable: transitions build new states (``evolve`` for the per-shard records, which are
frozen dataclasses because a tick over 10,000 shards cannot afford a pydantic copy per shard; ``GroupState``
is the pydantic model that validates and serialises them), so a state that a failed CAS attempt produced
can never leak into the next attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

STATE_KIND = "dagster-streamgroup/group-state"
SCHEMA_VERSION = 5
"""2: ``ShardState.retry_end`` and ``ahead_since``; a version-1 state reads as one with neither set.
3: ``ShardState.last_commit_member``/``last_commit_epoch``, ``GroupState.dead_letters`` and
``GroupState.unrecorded_runs``; a version-2 state reads as one with none of them (a replayed commit of a range
accepted before the upgrade is refused, not applied twice).
4: ``InFlight.relaunches``/``not_before`` (launches that raised) and ``UnrecordedRun.orphaned_at``; a version-3
state reads as one with none.
5: ``DeadLetter.records`` and ``DeadLetter.dead_records`` (records a typed range could not decode);
``ShardState.lease`` (a backfill's hold on a shard, ``protocol/lease.py``); and the stream's life:
``ShardState.identity``/``repositioned``/``missing_since``/``removed``, ``Parked.cause``, ``Member.scope`` and
``GroupState.moved_to``. A version-4 state reads as one with none of them set: its dead letters hold no records,
no shard is leased, its shards adopt their log's identity at the next tick (there is nothing to compare it
with) and its members consume the whole stream; a version-4 member refuses a version-5 state instead of planning
a leased shard."""


T = TypeVar("T")


def evolve(record: T, **changes: object) -> T:
    """A copy of a frozen record with some fields changed.

    Like ``dataclasses.replace`` without re-running ``__init__``: several times faster, which matters when a
    cold start assigns 10,000 shards in one tick. Only the protocol's own frozen dataclasses come here."""
    unknown = changes.keys() - record.__dict__.keys()
    if unknown:
        raise TypeError(f"{type(record).__name__} has no field(s) {sorted(unknown)}")
    new = object.__new__(type(record))
    fields = new.__dict__
    fields.update(record.__dict__)
    fields.update(changes)
    return new


def handed_over(shard: ShardState, owner: str | None, **changes: object) -> ShardState:
    """The shard under a new owner (or none): a new epoch fences the previous owner's runs, and what the
    previous owner observed over time (``ahead_since``) does not carry over."""
    return evolve(shard, owner=owner, epoch=shard.epoch + 1, ahead_since=None, **changes)


@dataclass(frozen=True)
class Member:
    """A live member. ``joined`` lets a new member wait one tick before claiming, so a cold start of
    many members does not hand everything to whichever registers first (Pravega's greedy first reader)."""

    member_id: str
    joined: float
    heartbeat: float
    scope: tuple[str, ...] | None = None
    """The parts of the stream this member consumes (a Kafka group's topics, ``part_of`` its shards), as its
    own configuration lists them; ``None``: the whole stream. Deployments that briefly disagree about the list (a
    rolling change) each serve only what they list, and a part leaves the group only once no member lists it."""


@dataclass(frozen=True)
class InFlight:
    """A range launched as a run and not yet committed or failed.

    ``epoch`` is the shard epoch the range was launched under; a commit must present it.
    ``orphaned_at`` is set when the launching member was evicted: the run may still be executing, so the
    range is not launched again until that run reports or the drain timeout passes.
    ``alive_at`` is the last time the run said it is alive (``touch``, three times per session timeout while it
    executes): a run of a departed member that stopped saying so for a session timeout is dead, and its range is
    relaunched without waiting out the whole drain timeout (a deployment lost whole cannot report its runs'
    deaths).
    """

    start: int
    end: int
    attempt: int
    run_key: str
    epoch: int
    member_id: str
    launched_at: float
    orphaned_at: float | None = None
    alive_at: float | None = None
    relaunches: int = 0
    """Launches of this range that raised in a row (the run launcher's error; no worker read anything): each
    is relaunched under a new run key without counting an attempt."""
    not_before: float | None = None
    """After a launch that raised: the range's run is not requested again before this time (backoff)."""


@dataclass(frozen=True)
class Parked:
    """A shard that stopped: retries exhausted, its offsets fell out of retention under ``fail``, or the
    stream ends below offsets the group has seen (``OFFSETS_AHEAD``: ``start`` is the stream's end then)."""

    start: int
    end: int
    reason: str
    at: float
    cause: str = ""
    """Why, as a word a program can test: ``retries``, ``data_loss``, ``offsets_ahead``, ``missing`` (the shard's
    log does not exist), ``recreated`` (its log was deleted and created again); empty for parks of version 4."""


@dataclass(frozen=True)
class Repositioned:
    """The shard's offsets were moved other than by a run's commit: its log was recreated (offsets of a new log),
    or an operator reset it. Ranges launched before, at an epoch below ``epoch``, were planned over the old
    position, and their commits are refused for ``cause`` (``recreated`` or ``reset``)."""

    epoch: int
    cause: str
    at: float


@dataclass(frozen=True)
class Lease:
    """A backfill's hold on a shard (``protocol/lease.py``): while a shard has one, no member plans a range of it,
    so a backfill and the group never process the shard at once. Requested while a range is in flight, it waits
    (``granted_at`` unset) until that range commits or fails; the backfill run holding it says it is alive, and
    one silent for a session timeout loses it."""

    holder: str
    """The backfill run's id."""
    requested_at: float
    alive_at: float
    granted_at: float | None = None


@dataclass(frozen=True)
class ShardState:
    owner: str | None = None
    epoch: int = 0
    committed: int | None = None
    """Next offset to read; ``None`` until the seek policy positions the shard."""
    inflight: InFlight | None = None
    attempt: int = 0
    """Attempt number of the next launch of the range at ``committed`` (0 = first try)."""
    parked: Parked | None = None
    discovered_at: float = 0.0
    late: bool = False
    """Appeared after the group was created: positioned at the earliest offset even under ``latest``,
    so the first records of a new shard are never skipped (v3io-go IG-19366)."""
    backlog_since: float | None = None
    """When a backlog below ``min_backlog`` was first seen; launching waits at most ``max_wait`` after it."""
    last_run_key: str | None = None
    """Run key of the last accepted commit, so a replayed commit is recognised instead of refused."""
    last_commit_member: str | None = None
    last_commit_epoch: int | None = None
    """Member and epoch of the run that made the last accepted commit: only that run may be told
    ``already_committed``. A zombie relaunched under the same run key (a drain that expired) must be refused."""
    retry_end: int | None = None
    """End of the failed range that starts at ``committed``: its retries read exactly the same offsets. The
    failed attempt may have had side effects over them, and a retry grown with the backlog would spread an
    attempt count over different ranges."""
    ahead_since: float | None = None
    """When the stream was first seen ending below an offset the group has seen (a recreated or truncated
    stream; briefly, a Kafka leader change), by the current owner: the shard is parked if it lasts a session
    timeout. Cleared when the owner changes, so one owner's observation never parks the next one's shard."""
    lease: Lease | None = None
    """A backfill's hold on the shard: no range is planned while it is set, granted or waiting."""
    identity: str | None = None
    """The identity of the log the shard's offsets count in (for Kafka, its topic's id), recorded when the shard
    is first positioned: a log deleted and created again under the same name restarts its offsets, and only its
    identity tells it from the old one. ``None`` where the backend has none (or a state of version 4, until the
    next tick adopts the current one)."""
    repositioned: Repositioned | None = None
    missing_since: float | None = None
    """When the shard's log was first seen missing (a deleted topic): it is parked once that lasts a session
    timeout, as a missing log may only be a broker's answer during a restart."""
    removed: bool = False
    """Its part of the stream is in no member's ``scope`` any more (a topic taken off the group's list): it is
    not assigned or planned; a run in flight over it still commits. Its offsets stay, for a part listed again."""


class EventKind(StrEnum):
    DATA_LOSS = "data_loss"
    PARKED = "parked"
    DEAD_LETTER = "dead_letter"
    UNPARKED = "unparked"
    EVICTED = "evicted"
    LEFT = "left"
    DRAIN_EXPIRED = "drain_expired"
    OFFSETS_AHEAD = "offsets_ahead"
    CARRIED_OVER = "carried_over"
    LAUNCH_FAILING = "launch_failing"
    UNRECORDED_DROPPED = "unrecorded_dropped"
    LEASE_EXPIRED = "lease_expired"
    RECREATED = "recreated"
    """The shard's log was deleted and created again (a new identity): ``start`` is the first offset of the old log
    the group did not read; everything from it on in the old log is what this event reports unread."""
    MISSING = "missing"
    REMOVED = "removed"
    RESET = "reset"
    """An operator moved the shard (``streamgroup reset``): ``[start, end)`` is what was skipped (``skipped``
    in the detail) or what will be read again (``read again``)."""
    RESET_REFUSED = "reset_refused"
    """The stream's record of the group's offset (Kafka's group offsets) was set by something other than the
    group's members (Kafka's consumer-groups tool): not applied, the record restored."""
    ADOPTED = "adopted"
    """A shard with no position in the state started at the stream's record of the group's offset that something
    other than the group's members wrote there (a state lost, then Kafka's tool used; ``adopt_group_offsets``)."""


@dataclass(frozen=True)
class GroupEvent:
    """Something an operator must see: never silent (retention loss, parking, dead letters, evictions)."""

    kind: EventKind
    at: float
    shard: str | None = None
    member_id: str | None = None
    start: int | None = None
    end: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class UnrecordedRun:
    """A run whose commit was accepted and whose materializations its member has not yet seen recorded.

    A run can die between its commit and Dagster's record of it; the range is committed, so it is never run
    again, and only its launching member's deployment can see whether the record exists. The entry stays
    until that member has seen every range recorded or has recorded the missing ones itself, however many
    commits the shards take meanwhile (the member may be stopped while others carry its shards on)."""

    member_id: str
    epoch: int
    ranges: tuple[tuple[str, int, int], ...]
    """``(shard, start, end)`` of every committed range of the run (of a run that carries on: its last two waves,
    the earlier ones were recorded before it read them)."""
    orphaned_at: float | None = None
    """When no live member of the run's deployment was left (its records can no longer be checked): the entry is
    dropped, with an event naming its ranges, after ``drain_timeout_s``."""


@dataclass(frozen=True)
class DeadRecord:
    """A record of a committed range that could not be decoded: its offset, its raw key and value (base64) and
    why."""

    offset: int
    error: str
    key: str | None = None
    value: str | None = None


@dataclass(frozen=True)
class DeadLetter:
    """A range given up without being processed, or the records of a processed range that could not be decoded
    (``dead_records`` of them, the first ``records`` kept with their raw bytes): kept in the state until an
    operator resolves it, so it can neither go unnoticed nor drop out of view the way an event in the bounded
    event list does."""

    shard: str
    start: int
    end: int
    reason: str
    at: float
    run_key: str | None = None
    dead_records: int = 0
    """Records of the range given up (0: the whole range was, as after ``after_max_attempts``)."""
    records: tuple[DeadRecord, ...] = ()


class GroupState(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["dagster-streamgroup/group-state"] = "dagster-streamgroup/group-state"
    schema_version: int = SCHEMA_VERSION
    stream: str
    group: str
    created_at: float
    revision: int = 0
    """Counts successful writes; informative only (stores keep their own CAS version)."""
    members: dict[str, Member] = Field(default_factory=dict)
    shards: dict[str, ShardState] = Field(default_factory=dict)
    events: tuple[GroupEvent, ...] = ()
    """The most recent events, newest last, bounded by ``MAX_EVENTS``."""
    dead_letters: tuple[DeadLetter, ...] = ()
    """Every range given up and not yet resolved by an operator, oldest first."""
    unrecorded_runs: dict[str, UnrecordedRun] = Field(default_factory=dict)
    """Committed runs, by run key, whose records in Dagster their member has not confirmed yet."""
    moved_to: str | None = None
    """Set on a state an earlier version kept under another key, once carried over to ``moved_to``: closed, so
    that members of that version (which cannot read this schema) stop, and none of its shards is planned twice."""


MAX_EVENTS = 200
