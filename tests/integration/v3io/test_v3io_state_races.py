"""The v3io store racing its folds, each race forced to happen at one place, through the real client and the
project's v3io server.

A fold deletes the log items the previous base item held. A writer that loaded a version two folds back must be
refused, whether it paused before ``save_if`` or inside it (after its checks, before its first write), and a
reader must never follow a log item that a writer left behind when it lost the head. The stores fold on every
write here (thresholds set per store)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dagster_streamgroup import protocol
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.protocol import GroupState, delta
from dagster_streamgroup.protocol.codec import encode_state
from dagster_streamgroup.protocol.state import EventKind, GroupEvent
from dagster_streamgroup.stores.base import state_key
from dagster_streamgroup.stores.v3io import HEAD, V3ioStateStore, encode_attributes
from dagster_streamgroup.stores.v3io_log import LINEAGE, VERSION, head_item, is_legacy, log_item, parse_log_item
from dagster_streamgroup.streams.v3io_config import V3ioConnection
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io.conftest import CONTAINER

pytestmark = pytest.mark.v3io
FOLD_EVERY_WRITE: dict[str, Any] = {"min_fold_bytes": 0, "fold_fraction": 0.0}
ITEM = "g-state.json"
LEGACY_LINEAGE = "0123456789ab"


@pytest.fixture
def path() -> str:
    return unique_v3io_name("races")


@pytest.fixture
def key(path: str) -> str:
    return state_key(f"v3io://127.0.0.1/{CONTAINER}/{path}", "g")


@pytest.fixture
def open_store(v3io_server: V3ioServerInfo) -> Iterator[Callable[..., V3ioStateStore]]:
    """Opens stores on the test server (``min_fold_bytes``, ``fold_fraction``); closed at the test's end."""
    opened: list[V3ioStateStore] = []

    def make(**settings: Any) -> V3ioStateStore:
        connection = V3ioConnection(
            endpoint=v3io_server.endpoint, container=CONTAINER, access_key=v3io_server.access_key
        )
        opened.append(V3ioStateStore(connection, **settings))
        return opened[-1]

    yield make
    for store in opened:
        store.close()


def _next(state: GroupState, member: str, at: float) -> GroupState:
    """The state after one write of ``member``: its heartbeat and one event (so a change applied twice shows)."""
    beat = protocol.heartbeat(state, member, at)
    event_ = GroupEvent(kind=EventKind.LEFT, at=at, member_id=member, detail=f"{member}@{at}")
    return beat.model_copy(update={"events": (*beat.events, event_), "revision": state.revision + 1})


def _write(store: V3ioStateStore, key: str, member: str, at: float) -> GroupState:
    state, token = store.load(key)
    assert state is not None
    written = _next(state, member, at)
    assert store.save_if(key, written, token)
    return written


def _hooked(store: V3ioStateStore, method: str, *, before: Callable[[], None] | None = None,
            after: Callable[[], None] | None = None) -> Callable[[], None]:  # fmt: skip
    """Run ``before``/``after`` around the first call of ``store.<method>``; returns what undoes it."""
    original = getattr(store, method)
    calls = []

    def once(*args: Any, **kwargs: Any) -> Any:
        first = not calls
        calls.append(1)
        if first and before is not None:
            before()
        result = original(*args, **kwargs)
        if first and after is not None:
            after()
        return result

    setattr(store, method, once)
    return lambda: delattr(store, method)


def _version(token: str | None) -> int:
    assert token is not None
    return int(token.rsplit(":", 1)[1])


def _log_names(client: Any, path: str) -> list[str]:
    items = client.kv.new_cursor(CONTAINER, path + "/", attribute_names=["__name"], sharding_key="g-state",
                                 sort_key_range_start="json.log-", sort_key_range_end="json.log.").all()  # fmt: skip
    return sorted(str(item["__name"]) for item in items)


@pytest.mark.parametrize("pause", ["before save_if", "inside save_if"])
def test_a_write_from_a_version_two_folds_behind_is_refused(
    open_store: Callable[..., V3ioStateStore], key: str, pause: str
) -> None:
    writer, late = open_store(**FOLD_EVERY_WRITE), open_store()
    assert writer.save_if(key, protocol.new_group("s", "g", 1.0), None)
    loaded, token = late.load(key)
    assert loaded is not None
    written: list[GroupState] = []

    def others() -> None:
        written.extend(_write(writer, key, "a", 2.0 + i) for i in range(3))

    late_write = _next(loaded, "late", 9.0)
    if pause == "before save_if":
        others()
        refused = late.save_if(key, late_write, token)
    else:  # after its checks, before its first write
        undo = _hooked(late, "_put", before=others)
        try:
            refused = late.save_if(key, late_write, token)
        finally:
            undo()
    assert writer.folds >= 2, "the log item the late write claims was folded and deleted"
    assert refused is False
    assert open_store().load(key)[0] == written[-1]
    state, token = late.load(key)
    assert state == written[-1]
    assert late.save_if(key, _next(state, "late", 9.0), token), "a write from the newest version goes in"


def test_a_read_across_two_folds_and_a_late_write_returns_a_state_that_was_written(
    open_store: Callable[..., V3ioStateStore], key: str
) -> None:
    """The reader holds version 1 and reads the base item; then a writer folds twice and a late writer (which
    passed its checks before the folds) writes version 2 again; then the reader reads the log."""
    writer, late, reader = open_store(**FOLD_EVERY_WRITE), open_store(), open_store()
    first = protocol.new_group("s", "g", 1.0)
    assert writer.save_if(key, first, None)
    written = {1: first}
    assert reader.load(key)[0] == first
    late_loaded, late_token = late.load(key)
    assert late_loaded is not None
    outcome: list[bool] = []

    def two_folds() -> None:
        for version in (2, 3):
            written[version] = _write(writer, key, "a", float(version))

    def late_write() -> None:
        undo = _hooked(late, "_put", before=two_folds)
        try:
            outcome.append(late.save_if(key, _next(late_loaded, "late", 9.0), late_token))
        finally:
            undo()

    undo = _hooked(reader, "_get", after=late_write)
    try:
        state, token = reader.load(key)
    finally:
        undo()
    assert outcome == [False]
    assert state == written[_version(token)], "a state the writers never wrote"
    assert reader.load(key)[0] == written[3]


def test_a_log_item_left_by_a_writer_that_lost_the_head_is_never_read(
    open_store: Callable[..., V3ioStateStore], key: str, path: str, v3io_client: Any
) -> None:
    """A writer that stops between losing the head and deleting its log item leaves a second item of that
    version: readers follow the head's write ids past it, writers go on, and a fold deletes it."""
    winner, loser = open_store(**FOLD_EVERY_WRITE), open_store()
    assert winner.save_if(key, protocol.new_group("s", "g", 1.0), None)
    state_w, token_w = winner.load(key)
    state_l, token_l = loser.load(key)
    assert state_w is not None and state_l is not None
    assert winner.save_if(key, _next(state_w, "w", 2.0), token_w)
    loser._delete = lambda *_args: None  # type: ignore[method-assign]  # stops before deleting its item
    assert loser.save_if(key, _next(state_l, "l", 2.0), token_l) is False
    versions = [parsed.version for n in _log_names(v3io_client, path) if (parsed := parse_log_item(ITEM, n))]
    assert versions.count(2) == 2, "the winner's item and the one left behind"
    fresh = open_store()
    state, token = fresh.load(key)
    assert state is not None and set(state.members) == {"w"}
    assert fresh.save_if(key, _next(state, "f", 3.0), token)
    later = _write(winner, key, "w", 4.0)  # folds at 4: deletes what the base at 2 held
    assert open_store().load(key)[0] == later
    versions = [parsed.version for n in _log_names(v3io_client, path) if (parsed := parse_log_item(ITEM, n))]
    assert 2 not in versions


def _plant_legacy(client: Any, path: str, states: list[GroupState], base_version: int = 1) -> None:
    """A state as the earlier log layout wrote it: the base item at ``base_version`` (a 12-digit lineage, no
    head item) and one log item per later version, named by version alone."""
    base = encode_attributes(encode_state(states[base_version - 1]))
    base.update({VERSION: base_version, LINEAGE: LEGACY_LINEAGE})
    client.kv.put(CONTAINER, path, ITEM, base)
    for version in range(base_version + 1, len(states) + 1):
        change = delta.diff(states[version - 2], states[version - 1])
        attributes = encode_attributes('{"delta":' + delta.encode_delta(change) + "}")
        attributes[VERSION] = version
        client.kv.put(CONTAINER, path, log_item(ITEM, LEGACY_LINEAGE, version), attributes)


def _legacy_states() -> list[GroupState]:
    states = [protocol.new_group("s", "g", 1.0)]
    for i in range(2):
        states.append(_next(states[-1], f"old{i}", 2.0 + i))
    return states


def test_a_state_of_the_earlier_log_layout_is_read_and_its_first_write_moves_it_to_a_new_lineage(
    open_store: Callable[..., V3ioStateStore], key: str, path: str, v3io_client: Any
) -> None:
    states = _legacy_states()
    _plant_legacy(v3io_client, path, states)
    store = open_store()
    state, token = store.load(key)
    assert state == states[-1] and token == f"v:{LEGACY_LINEAGE}:3"
    written = _next(state, "new", 5.0)
    assert store.save_if(key, written, token)
    base = v3io_client.kv.get(CONTAINER, path, ITEM, attribute_names=["**"]).output.item
    assert not is_legacy(base[LINEAGE]) and base[VERSION] == 1
    head = v3io_client.kv.get(CONTAINER, path, head_item(ITEM, base[LINEAGE]), attribute_names=["**"]).output.item
    assert head[HEAD] == 1
    assert all(LEGACY_LINEAGE not in name for name in _log_names(v3io_client, path)), "the earlier log is gone"
    assert open_store().load(key)[0] == written
    assert _write(store, key, "next", 6.0) == open_store().load(key)[0]


def test_a_write_that_would_move_an_earlier_layout_state_its_log_moved_past_is_refused(
    open_store: Callable[..., V3ioStateStore], key: str, path: str, v3io_client: Any
) -> None:
    """The writer loaded version 1 of the earlier layout and passed its checks; then members of that layout
    wrote versions 2 and 3 and folded twice, deleting item 2. Its tombstone at 2 proves nothing then."""
    states = _legacy_states()
    _plant_legacy(v3io_client, path, states[:1])
    store = open_store()
    loaded, token = store.load(key)
    assert loaded == states[0] and token == f"v:{LEGACY_LINEAGE}:1"

    def earlier_members_fold_twice() -> None:  # the base item at 3; item 2 written, folded and deleted
        _plant_legacy(v3io_client, path, states, base_version=3)

    undo = _hooked(store, "_put", before=earlier_members_fold_twice)
    try:
        assert store.save_if(key, _next(loaded, "late", 9.0), token) is False
    finally:
        undo()
    state, token = open_store().load(key)
    assert state == states[-1]
    assert json.loads(encode_state(state))["members"].keys() == {"old0", "old1"}
