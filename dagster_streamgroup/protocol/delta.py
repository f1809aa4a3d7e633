"""What a transition changed, as a small record a store can append instead of rewriting the whole state.

A member tick changes its own heartbeat and the few shards it plans or commits; at 200 members x 10,000 shards
the whole state is megabytes, the change is bytes. ``diff`` and ``apply`` are pure and exact:
``apply(old, diff(old, new)) == new`` for any two states of one group (Pravega's state synchronizer appends
updates the same way and compacts them into a new base from time to time). Transitions keep the records they
do not change (the same objects), so a diff is found by identity first and costs little.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dagster_streamgroup.protocol.state import (
    MAX_EVENTS,
    DeadLetter,
    GroupEvent,
    GroupState,
    Member,
    ShardState,
    UnrecordedRun,
)


class StateDelta(BaseModel):
    """The change from the state at ``base_revision`` to the next one."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    base_revision: int
    revision: int
    members_set: dict[str, Member] = Field(default_factory=dict)
    members_removed: tuple[str, ...] = ()
    shards_set: dict[str, ShardState] = Field(default_factory=dict)
    events_added: tuple[GroupEvent, ...] = ()
    events_replaced: tuple[GroupEvent, ...] | None = None
    """Set instead of ``events_added`` when the new events cannot be told as an append (more new events than
    the list keeps)."""
    dead_letters: tuple[DeadLetter, ...] | None = None
    """The whole list, when it changed (dead letters change rarely)."""
    unrecorded_set: dict[str, UnrecordedRun] = Field(default_factory=dict)
    unrecorded_removed: tuple[str, ...] = ()
    schema_version: int | None = None
    moved_to: str | None = None
    """Set when the state was closed, carried over to another key (``GroupState.moved_to``)."""

    @property
    def is_empty(self) -> bool:
        return not (
            self.members_set
            or self.members_removed
            or self.shards_set
            or self.events_added
            or self.events_replaced is not None
            or self.dead_letters is not None
            or self.unrecorded_set
            or self.unrecorded_removed
            or self.schema_version is not None
            or self.moved_to is not None
        )


def diff(old: GroupState, new: GroupState) -> StateDelta:
    """The delta that turns ``old`` into ``new`` (two states of the same group)."""
    if (old.stream, old.group, old.created_at) != (new.stream, new.group, new.created_at):
        raise ValueError("a delta joins two states of one group")
    if old.moved_to is not None and new.moved_to != old.moved_to:
        raise ValueError("a state closed by its carry-over is never opened again")
    members_set = {mid: m for mid, m in new.members.items() if (was := old.members.get(mid)) is not m and was != m}
    members_removed = tuple(sorted(mid for mid in old.members if mid not in new.members))
    shards_set = {sid: s for sid, s in new.shards.items() if (had := old.shards.get(sid)) is not s and had != s}
    missing = [sid for sid in old.shards if sid not in new.shards]
    if missing:
        raise ValueError(f"shards are never removed from a group, yet {missing[:3]} are gone")
    events_added, events_replaced = _event_change(old.events, new.events)
    return StateDelta(
        base_revision=old.revision,
        revision=new.revision,
        members_set=members_set,
        members_removed=members_removed,
        shards_set=shards_set,
        events_added=events_added,
        events_replaced=events_replaced,
        dead_letters=None if new.dead_letters == old.dead_letters else new.dead_letters,
        unrecorded_set={
            k: u
            for k, u in new.unrecorded_runs.items()
            if (prior := old.unrecorded_runs.get(k)) is not u and prior != u
        },
        unrecorded_removed=tuple(sorted(k for k in old.unrecorded_runs if k not in new.unrecorded_runs)),
        schema_version=None if new.schema_version == old.schema_version else new.schema_version,
        moved_to=None if new.moved_to == old.moved_to else new.moved_to,
    )


def _event_change(
    old: tuple[GroupEvent, ...], new: tuple[GroupEvent, ...]
) -> tuple[tuple[GroupEvent, ...], tuple[GroupEvent, ...] | None]:
    """Events are appended and the oldest dropped past ``MAX_EVENTS``: find the appended ones after the last
    event ``old`` had, and check the append really gives ``new``; otherwise send the list whole."""
    if new == old:
        return (), None
    added = len(new)
    if old:
        last = old[-1]
        found = next((i for i in range(len(new) - 1, -1, -1) if new[i] == last), None)
        if found is not None:
            added = len(new) - found - 1
    appended = new[len(new) - added :] if added else ()
    if (*old, *appended)[-MAX_EVENTS:] == new:
        return appended, None
    return (), new


def apply(state: GroupState, delta: StateDelta) -> GroupState:
    """``state`` (at ``delta.base_revision``) with the delta applied."""
    if state.revision != delta.base_revision:
        raise ValueError(
            f"delta to revision {delta.revision} applies to revision {delta.base_revision}, not {state.revision}"
        )
    update: dict[str, object] = {"revision": delta.revision}
    if delta.members_set or delta.members_removed:
        members = {mid: m for mid, m in state.members.items() if mid not in delta.members_removed}
        members.update(delta.members_set)
        update["members"] = members
    if delta.shards_set:
        update["shards"] = {**state.shards, **delta.shards_set}
    if delta.events_replaced is not None:
        update["events"] = delta.events_replaced
    elif delta.events_added:
        update["events"] = (*state.events, *delta.events_added)[-MAX_EVENTS:]
    if delta.dead_letters is not None:
        update["dead_letters"] = delta.dead_letters
    if delta.unrecorded_set or delta.unrecorded_removed:
        unrecorded = {k: u for k, u in state.unrecorded_runs.items() if k not in delta.unrecorded_removed}
        unrecorded.update(delta.unrecorded_set)
        update["unrecorded_runs"] = unrecorded
    if delta.schema_version is not None:
        update["schema_version"] = delta.schema_version
    if delta.moved_to is not None:
        update["moved_to"] = delta.moved_to
    return state.model_copy(update=update)


def encode_delta(delta: StateDelta) -> str:
    return delta.model_dump_json(exclude_defaults=True)  # most shard fields are at their defaults


def decode_delta(text: str | bytes) -> StateDelta:
    return StateDelta.model_validate_json(text)
