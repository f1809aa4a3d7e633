"""A backfill's lease on a shard: the group and a backfill never process one shard at once.

A member run holds a shard while its range is in flight, and a run may hold several shards; a backfill of one of
them must neither start while that range is read nor let the member plan the shard's next range while it reads.
Dagster's tag concurrency cannot say "a run holding several shards", so the hold lives where the group's own
invariants do: in the state, under compare-and-set. A backfill run asks for the shard's lease before it reads
anything; the lease is granted at once when no range is in flight, and otherwise waits, recorded, until the range
commits or fails: no member plans a range of a shard with a lease, granted or waiting, so the wait ends with the run
that holds the shard now (a member whose run carries on does not carry the shard on). The run says it is alive while
it holds the lease and releases it when it ends; a lease silent for a session timeout is dropped by the next member
tick, with an event.

Pure, like the rest of the protocol: each transition returns the same object when nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dagster_streamgroup.protocol.membership import add_events
from dagster_streamgroup.protocol.state import EventKind, GroupEvent, GroupState, Lease, ShardState, evolve


class LeaseOutcome(StrEnum):
    GRANTED = "granted"
    """The backfill holds the shard: no range of it is in flight, and none is planned until it releases it."""
    WAITING = "waiting"
    """Recorded, not granted: a range of the shard is in flight; no new one is planned, and the lease is granted
    once it commits or fails."""
    BUSY = "busy"
    """Another backfill holds the shard (or waits for it) and is alive."""
    UNKNOWN_SHARD = "unknown_shard"


@dataclass(frozen=True)
class LeaseStatus:
    outcome: LeaseOutcome
    detail: str = ""
    lease: Lease | None = None


def lease_is_stale(lease: Lease, now: float, timeout_s: float) -> bool:
    return now - lease.alive_at > timeout_s


def request_lease(
    state: GroupState, shard_id: str, holder: str, now: float, timeout_s: float
) -> tuple[GroupState, LeaseStatus]:
    """Ask for (or keep asking for) ``shard_id``'s lease on behalf of the backfill run ``holder``: granted when no
    range of the shard is in flight, else recorded as waiting. A lease of another backfill that is alive makes this
    one wait behind it; one silent for ``timeout_s`` is dropped (an event says so)."""
    shard = state.shards.get(shard_id)
    if shard is None:
        return state, LeaseStatus(LeaseOutcome.UNKNOWN_SHARD, f"{shard_id} is not a shard of group {state.group!r}")
    events: list[GroupEvent] = []
    lease = shard.lease
    if lease is not None and lease.holder != holder:
        if not lease_is_stale(lease, now, timeout_s):
            since = "holds it" if lease.granted_at is not None else "waits for it"
            return state, LeaseStatus(LeaseOutcome.BUSY, f"backfill run {lease.holder} {since}", lease)
        events.append(_expired_event(shard_id, lease, now))
        lease = None
    if lease is None:
        lease = Lease(holder=holder, requested_at=now, alive_at=now)
    elif now > lease.alive_at:
        lease = evolve(lease, alive_at=now)
    if lease.granted_at is None and shard.inflight is None:
        lease = evolve(lease, granted_at=now)
    if lease is not shard.lease:
        state = add_events(_with_lease(state, shard_id, shard, lease), *events)
    if lease.granted_at is not None:
        return state, LeaseStatus(LeaseOutcome.GRANTED, "", lease)
    inflight = shard.inflight
    assert inflight is not None
    detail = f"range [{inflight.start}, {inflight.end}) of run {inflight.run_key} is in flight"
    return state, LeaseStatus(LeaseOutcome.WAITING, detail, lease)


def touch_lease(state: GroupState, shard_id: str, holder: str, now: float) -> tuple[GroupState, bool]:
    """The backfill ``holder`` says it is alive; False when it no longer has the lease (it was dropped as silent,
    and maybe taken by another backfill): the backfill must stop reading."""
    shard = state.shards.get(shard_id)
    lease = None if shard is None else shard.lease
    if shard is None or lease is None or lease.holder != holder:
        return state, False
    if now <= lease.alive_at:
        return state, True
    return _with_lease(state, shard_id, shard, evolve(lease, alive_at=now)), True


def release_lease(state: GroupState, shard_id: str, holder: str) -> GroupState:
    """The backfill ``holder`` is done with the shard (whether or not it was granted): the group plans it again."""
    shard = state.shards.get(shard_id)
    if shard is None or shard.lease is None or shard.lease.holder != holder:
        return state
    return _with_lease(state, shard_id, shard, None)


def expire_leases(state: GroupState, now: float, timeout_s: float) -> GroupState:
    """Drop the leases of backfills silent for ``timeout_s`` (their run died): the shards are planned again."""
    stale = [sid for sid, s in state.shards.items() if s.lease is not None and lease_is_stale(s.lease, now, timeout_s)]
    if not stale:
        return state
    shards = dict(state.shards)
    events = []
    for sid in stale:
        lease = shards[sid].lease
        assert lease is not None
        events.append(_expired_event(sid, lease, now))
        shards[sid] = evolve(shards[sid], lease=None)
    return add_events(state.model_copy(update={"shards": shards}), *events)


def _with_lease(state: GroupState, shard_id: str, shard: ShardState, lease: Lease | None) -> GroupState:
    return state.model_copy(update={"shards": {**state.shards, shard_id: evolve(shard, lease=lease)}})


def _expired_event(shard_id: str, lease: Lease, now: float) -> GroupEvent:
    return GroupEvent(
        kind=EventKind.LEASE_EXPIRED,
        at=now,
        shard=shard_id,
        detail=f"backfill run {lease.holder} did not say it is alive for {now - lease.alive_at:.0f} s: its lease "
        "on the shard was dropped and the group plans it again",
    )
