"""The consumer-group protocol: pure transitions over ``GroupState``. No I/O, no clock, no randomness."""

from dagster_streamgroup.protocol.assignment import is_draining, quotas, rebalance
from dagster_streamgroup.protocol.codec import (
    ForeignStateError,
    NewerSchemaError,
    StateFormatError,
    decode_state,
    encode_state,
)
from dagster_streamgroup.protocol.completion import (
    CommitOutcome,
    FailOutcome,
    RangeReport,
    Refusal,
    commit,
    fail,
    report_of,
    unpark,
)
from dagster_streamgroup.protocol.membership import evict_stale, expire_drains, heartbeat, leave
from dagster_streamgroup.protocol.planning import (
    Launch,
    Watermark,
    complete_shard,
    inflight_launches,
    plan,
    run_key,
    sync_shards,
)
from dagster_streamgroup.protocol.policy import GroupPolicy
from dagster_streamgroup.protocol.state import (
    EventKind,
    GroupEvent,
    GroupState,
    InFlight,
    Member,
    Parked,
    ShardState,
)
from dagster_streamgroup.protocol.tick import member_tick, membership_step, new_group, owned_idle_shards

__all__ = [
    "CommitOutcome",
    "EventKind",
    "FailOutcome",
    "ForeignStateError",
    "GroupEvent",
    "GroupPolicy",
    "GroupState",
    "InFlight",
    "Launch",
    "Member",
    "NewerSchemaError",
    "Parked",
    "RangeReport",
    "Refusal",
    "ShardState",
    "StateFormatError",
    "Watermark",
    "commit",
    "complete_shard",
    "decode_state",
    "encode_state",
    "evict_stale",
    "expire_drains",
    "fail",
    "heartbeat",
    "inflight_launches",
    "is_draining",
    "leave",
    "member_tick",
    "membership_step",
    "new_group",
    "owned_idle_shards",
    "plan",
    "quotas",
    "rebalance",
    "report_of",
    "run_key",
    "sync_shards",
    "unpark",
]
