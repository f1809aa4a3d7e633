"""Membership transitions: join/heartbeat, eviction of silent members, explicit leave, drain expiry.

Each is pure and idempotent: applied twice with the same inputs it changes nothing more, and it never
raises on a state it has already applied to (Pravega #5712). A transition that changes nothing returns the
very same object, so callers can tell a no-op by identity.
"""

from __future__ import annotations

from dagster_streamgroup.protocol.state import (
    MAX_EVENTS,
    EventKind,
    GroupEvent,
    GroupState,
    InFlight,
    Member,
    ShardState,
    evolve,
    handed_over,
)


def add_events(state: GroupState, *events: GroupEvent) -> GroupState:
    if not events:
        return state
    return state.model_copy(update={"events": (*state.events, *events)[-MAX_EVENTS:]})


_KEEP = object()


def heartbeat(
    state: GroupState,
    member_id: str,
    now: float,
    liveness_timeout_s: float = float("inf"),
    scope: tuple[str, ...] | object | None = _KEEP,
) -> GroupState:
    """Join, or refresh the heartbeat (and the parts of the stream the member consumes, ``scope``, when given). A
    heartbeat never moves back, whatever a skewed caller says."""
    member = state.members.get(member_id)
    if member is None:
        joined = Member(member_id=member_id, joined=now, heartbeat=now)
        if scope is not _KEEP:
            joined = evolve(joined, scope=scope)
        members = {**state.members, member_id: joined}
        shards = _reclaim_draining(state, member_id, now, liveness_timeout_s)
        return state.model_copy(update={"members": members, "shards": shards})
    changes: dict[str, object] = {}
    if now > member.heartbeat:
        changes["heartbeat"] = now
    if scope is not _KEEP and scope != member.scope:
        changes["scope"] = scope
    if not changes:
        return state
    members = {**state.members, member_id: evolve(member, **changes)}
    return state.model_copy(update={"members": members})


def released_with_bounds(inflight: InFlight) -> dict[str, object]:
    """A range whose run may still be running (a drain that expired, a run that stopped saying it is alive) goes
    back to the pool with its bounds: the next run of the shard reads exactly ``[start, end)`` again (as a
    failed range's retry does, without counting an attempt), so a zombie that still writes its output writes
    the same range's output, which that run replaces, instead of an overlapping one."""
    return {"inflight": None, "backlog_since": None, "retry_end": inflight.end}


def run_is_dead(inflight: InFlight, now: float, liveness_timeout_s: float) -> bool:
    """The run said it was alive once, and has not for ``liveness_timeout_s``: its process is gone (or stopped)."""
    return inflight.alive_at is not None and now - inflight.alive_at >= liveness_timeout_s


def _reclaim_draining(
    state: GroupState, member_id: str, now: float, liveness_timeout_s: float
) -> dict[str, ShardState]:
    """A member that comes back under its old id (a restarted daemon) keeps the runs it launched, unless a run
    stopped saying it is alive: it died with the deployment, so its range goes back to the pool (a new epoch
    fences it) and is launched again, instead of waiting on a run that will never report."""
    shards = state.shards
    for shard_id, shard in state.shards.items():
        inflight = shard.inflight
        if shard.owner == member_id and inflight is not None and inflight.orphaned_at is not None:
            if shards is state.shards:
                shards = dict(state.shards)
            if run_is_dead(inflight, now, liveness_timeout_s):
                shards[shard_id] = handed_over(shard, None, **released_with_bounds(inflight))
            else:
                shards[shard_id] = evolve(shard, inflight=evolve(inflight, orphaned_at=None))
    return shards


def _hand_back(shard: ShardState, now: float) -> ShardState:
    """A departing member's shard: free at its committed offset, or draining while a run is in flight.

    A draining shard keeps its owner and epoch so the in-flight run can still commit (the run is a
    separate process that outlives the sensor); it is reassigned when that run reports or the drain
    timeout passes (Nuclio's drain on rebalance, without its fixed sleep)."""
    if shard.inflight is None:
        return handed_over(shard, None, backlog_since=None)
    if shard.inflight.orphaned_at is not None:
        return shard
    return evolve(shard, inflight=evolve(shard.inflight, orphaned_at=now))


def _remove_members(state: GroupState, gone: set[str], now: float, kind: EventKind, detail: str) -> GroupState:
    if not gone:
        return state
    members = {mid: m for mid, m in state.members.items() if mid not in gone}
    shards = dict(state.shards)
    for shard_id, shard in state.shards.items():
        if shard.owner in gone:
            shards[shard_id] = _hand_back(shard, now)
    updated = state.model_copy(update={"members": members, "shards": shards})
    return add_events(updated, *(GroupEvent(kind=kind, at=now, member_id=mid, detail=detail) for mid in sorted(gone)))


def evict_stale(state: GroupState, now: float, session_timeout_s: float) -> GroupState:
    """Remove members whose heartbeat is older than the session timeout (decided on fresh state, in the CAS)."""
    stale = {mid for mid, m in state.members.items() if now - m.heartbeat > session_timeout_s}
    return _remove_members(state, stale, now, EventKind.EVICTED, f"no heartbeat for more than {session_timeout_s}s")


def leave(state: GroupState, member_id: str, now: float) -> GroupState:
    """Explicit leave: hand shards back at their committed offsets now instead of after a session timeout."""
    if member_id not in state.members:
        return state
    return _remove_members(state, {member_id}, now, EventKind.LEFT, "left the group")


def expire_drains(
    state: GroupState, now: float, drain_timeout_s: float, liveness_timeout_s: float = float("inf")
) -> GroupState:
    """Give up waiting for runs of departed members: reassign their shards and relaunch the range, once the drain
    timeout passed, or once the run stopped saying it is alive for ``liveness_timeout_s`` (it died with its
    member's deployment).

    The epoch bump fences the old run: should it still finish, its commit is refused."""
    expired: list[str] = []
    for shard_id, shard in state.shards.items():
        inflight = shard.inflight
        if inflight is None or inflight.orphaned_at is None:
            continue
        if now - inflight.orphaned_at >= drain_timeout_s or run_is_dead(inflight, now, liveness_timeout_s):
            expired.append(shard_id)
    if not expired:
        return state
    shards = dict(state.shards)
    events = []
    for shard_id in expired:
        shard = shards[shard_id]
        assert shard.inflight is not None
        events.append(
            GroupEvent(
                kind=EventKind.DRAIN_EXPIRED,
                at=now,
                shard=shard_id,
                member_id=shard.inflight.member_id,
                start=shard.inflight.start,
                end=shard.inflight.end,
                detail=(
                    f"run {shard.inflight.run_key} stopped saying it is alive {now - shard.inflight.alive_at:.0f}s ago"
                    if run_is_dead(shard.inflight, now, liveness_timeout_s) and shard.inflight.alive_at is not None
                    else f"run {shard.inflight.run_key} did not report within {drain_timeout_s}s"
                )
                + "; range relaunched",
            )
        )
        shards[shard_id] = handed_over(shard, None, **released_with_bounds(shard.inflight))
    return add_events(state.model_copy(update={"shards": shards}), *events)
