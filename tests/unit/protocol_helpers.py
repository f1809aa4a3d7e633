"""Small builders for protocol tests."""

from __future__ import annotations

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import GroupPolicy, GroupState, Watermark

POLICY = GroupPolicy(
    heartbeat_interval_s=5,
    session_timeout_s=20,
    drain_timeout_s=60,
    max_records_per_run=100,
    min_backlog=1,
    max_wait_s=60,
)


def group(shards: int = 4, members: tuple[str, ...] = (), now: float = 0.0) -> GroupState:
    state = protocol.new_group("stream", "g", now)
    state = protocol.sync_shards(state, [f"s{i}" for i in range(shards)], now)
    for member in members:
        state = protocol.heartbeat(state, member, now)
    return state


def marks(state: GroupState, low: int = 0, high: int = 1000) -> dict[str, Watermark]:
    return {sid: Watermark(low=low, high=high) for sid in state.shards}


report = protocol.report_of


def owned(state: GroupState, member: str) -> list[str]:
    return [sid for sid, s in state.shards.items() if s.owner == member]


def balanced_start(shards: int, members: tuple[str, ...], policy: GroupPolicy = POLICY) -> GroupState:
    """Members registered at t=0, then one rebalance after the grace period."""
    state = group(shards, members)
    return protocol.rebalance(state, members[0], policy.grace_s, policy)


def policy_with(**fields: object) -> GroupPolicy:
    """A policy that launches whatever waits at once (``min_backlog=1``), as most protocol tests want."""
    return GroupPolicy(**{"min_backlog": 1, "max_wait_s": 60, **fields})  # type: ignore[arg-type]
