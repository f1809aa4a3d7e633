"""Serialising the state object, and refusing what is not ours or is newer than we understand.

A store must never overwrite a state it cannot read: a foreign object (for example a v3io-go
``session_states`` document) or one written by a newer schema raises here, before any write.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from pydantic import ValidationError

from dagster_streamgroup.protocol.state import SCHEMA_VERSION, STATE_KIND, GroupState


class StateFormatError(Exception):
    """The stored object is not a dagster-streamgroup state this version can read; it is left untouched."""


class ForeignStateError(StateFormatError):
    pass


class NewerSchemaError(StateFormatError):
    pass


def encode_state(state: GroupState) -> str:
    return state.model_dump_json(exclude_defaults=False)


DECODED_KEPT = 8
"""Stored texts whose decoded state is kept: a few groups' latest, in a process that loads them over and over."""


def decode_state(text: str | bytes, *, where: str) -> GroupState:
    """Parse a stored state. ``where`` names the object in error messages (store URL and key).

    A member's tick, its runs' heartbeats and a tick's wait for a run load the same state many times between two
    writes; the state is immutable, so the last few texts' states are kept and the same text is parsed and
    validated once (a text that fails to parse is never kept: it raises every time)."""
    return _decode(text, where=where)


@functools.lru_cache(maxsize=DECODED_KEPT)
def _decode(text: str | bytes, *, where: str) -> GroupState:
    try:
        raw: Any = json.loads(text)
    except ValueError as exc:
        raise ForeignStateError(f"{where}: the stored state is not JSON ({exc}); refusing to overwrite it") from exc
    if not isinstance(raw, dict):
        raise ForeignStateError(f"{where}: the stored state is a JSON {type(raw).__name__}, not an object")
    kind = raw.get("kind")
    if kind != STATE_KIND:
        if "session_states" in raw:
            raise ForeignStateError(
                f"{where}: this consumer group is managed by v3io-go/Nuclio consumers (a 'session_states' "
                "document); dagster-streamgroup will not overwrite it. Give this group another name, or stop those "
                "consumers and delete the item to hand the group over (it then starts at the offsets they committed)."
            )
        raise ForeignStateError(
            f"{where}: the stored object is not a dagster-streamgroup state (kind={kind!r}); refusing to overwrite it"
        )
    version = raw.get("schema_version")
    if not isinstance(version, int):
        raise ForeignStateError(f"{where}: schema_version is missing or not an integer")
    if version > SCHEMA_VERSION:
        raise NewerSchemaError(
            f"{where}: the state was written by a newer dagster-streamgroup (schema {version}, this version "
            f"reads up to {SCHEMA_VERSION}); upgrade this member instead of overwriting it"
        )
    if version < 3:
        # Version 3 dropped successor gating, which no member ever fed: the field was always empty.
        for shard in (raw.get("shards") or {}).values():
            if isinstance(shard, dict):
                shard.pop("pending_predecessors", None)
    try:
        state = GroupState.model_validate(raw)
    except ValidationError as exc:
        raise ForeignStateError(f"{where}: the stored state does not validate: {exc}") from exc
    # Written back at this version: a member of an older version then refuses it instead of dropping fields.
    return state if version == SCHEMA_VERSION else state.model_copy(update={"schema_version": SCHEMA_VERSION})
