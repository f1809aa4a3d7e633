"""One member tick as a composition of the transitions, in the order the invariants need.

Evict before assigning (shards of the dead are reassigned in the same write), heartbeat before assigning
(the member counts itself), rebalance before planning (surplus shards leave at a safe point instead of
being given a new range).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dagster_streamgroup.protocol.assignment import rebalance
from dagster_streamgroup.protocol.completion import settle_orphaned_unrecorded
from dagster_streamgroup.protocol.lease import expire_leases
from dagster_streamgroup.protocol.lifecycle import StreamView, add_shards, in_scope, sync_log, sync_scope
from dagster_streamgroup.protocol.membership import add_events, evict_stale, expire_drains, heartbeat
from dagster_streamgroup.protocol.planning import Launch, Watermark, plan, sync_shards
from dagster_streamgroup.protocol.policy import GroupPolicy
from dagster_streamgroup.protocol.state import EventKind, GroupEvent, GroupState


def new_group(stream: str, group: str, now: float) -> GroupState:
    return GroupState(stream=stream, group=group, created_at=now)


def carry_over(state: GroupState, stream: str, old_stream: str, now: float) -> GroupState:
    """The state an earlier version kept under the stream's old name, now under ``stream``: everything kept
    (members, owners, epochs, offsets, ranges in flight, whose runs commit to the new name), with an event."""
    event = GroupEvent(
        kind=EventKind.CARRIED_OVER,
        at=now,
        detail=f"the group's state was carried over from the stream's earlier name {old_stream!r} to {stream!r}",
    )
    return add_events(state.model_copy(update={"stream": stream}), event)


def closed(state: GroupState, moved_to: str) -> GroupState:
    """The state an earlier version kept under another key, closed once carried over to ``moved_to``: written at
    this schema, which members of that version refuse to read, so they stop instead of planning its shards as a
    second group would (their runs' commits are refused too, and their ranges run again under the new state)."""
    if state.moved_to == moved_to:
        return state
    return state.model_copy(update={"moved_to": moved_to})


def membership_step(
    state: GroupState,
    member_id: str,
    now: float,
    policy: GroupPolicy,
    shard_ids: Iterable[str] | None = None,
    view: StreamView | None = None,
) -> GroupState:
    """Evict, heartbeat, follow the stream (``view``: what the member's backend lists now; or only ``shard_ids``),
    expire drains, rebalance. The stream is followed after the heartbeat, which records the parts the member
    consumes, and before the rebalance, which must not hand out a shard its log's change is about to fence."""
    if shard_ids is not None:
        state = sync_shards(state, shard_ids, now)
    if view is not None:
        state = add_shards(state, view, now)
    state = evict_stale(state, now, policy.session_timeout_s)
    if view is not None:
        state = heartbeat(state, member_id, now, policy.session_timeout_s, scope=view.parts)
        state = sync_scope(state, now)
        state = sync_log(state, view, member_id, now, policy)
    else:
        state = heartbeat(state, member_id, now, policy.session_timeout_s)
    state = expire_drains(state, now, policy.drain_timeout_s, policy.session_timeout_s)
    state = settle_orphaned_unrecorded(state, now, policy.drain_timeout_s)
    state = expire_leases(state, now, policy.session_timeout_s)
    return rebalance(state, member_id, now, policy)


def owned_idle_shards(state: GroupState, member_id: str) -> list[str]:
    """The shards whose watermarks the next ``plan`` needs: owned, idle, not leased, and of a part the member
    consumes."""
    member = state.members.get(member_id)
    scope = member.scope if member is not None else None
    return [
        sid
        for sid, s in state.shards.items()
        if s.owner == member_id
        and s.inflight is None
        and s.parked is None
        and s.lease is None
        and not s.removed
        and in_scope(scope, sid)
    ]


def member_tick(
    state: GroupState,
    member_id: str,
    now: float,
    policy: GroupPolicy,
    watermarks: Mapping[str, Watermark],
    shard_ids: Iterable[str] | None = None,
    view: StreamView | None = None,
) -> tuple[GroupState, list[Launch]]:
    """The whole tick when the watermarks are already known (the simulator and tests)."""
    state = membership_step(state, member_id, now, policy, shard_ids, view)
    return plan(state, member_id, now, watermarks, policy)
