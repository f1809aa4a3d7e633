"""The v3io store's log, through the real client and the project's v3io server: a write creates one log item
and moves the head item to it, readers elsewhere rebuild the same state from the base item and the newer log
items (a range scan), the log is folded into the base item and the folded items deleted, a base item written whole by an
earlier version is rewritten before anything is logged, and a heartbeat costs a few hundred bytes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from v3io.dataplane import RaiseForStatus

from dagster_streamgroup import protocol
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.member import update_state
from dagster_streamgroup.protocol import GroupPolicy, GroupState, Watermark
from dagster_streamgroup.protocol.codec import NewerSchemaError, encode_state
from dagster_streamgroup.stores import v3io_log
from dagster_streamgroup.stores.base import state_key
from dagster_streamgroup.stores.v3io import KIND, SCHEMA, STATE, V3ioStateStore, encode_attributes
from dagster_streamgroup.stores.v3io_log import LINEAGE, VERSION, parse_log_item
from dagster_streamgroup.streams.v3io_config import V3ioConnection
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io.conftest import CONTAINER

pytestmark = pytest.mark.v3io
POLICY = GroupPolicy(heartbeat_interval_s=5, session_timeout_s=20, min_backlog=1, join_grace_s=0)
SHARDS = [f"s{i}" for i in range(300)]


def _store(server: V3ioServerInfo) -> V3ioStateStore:
    return V3ioStateStore(V3ioConnection(endpoint=server.endpoint, container=CONTAINER, access_key=server.access_key))


@pytest.fixture
def stores(v3io_server: V3ioServerInfo) -> Iterator[list[V3ioStateStore]]:
    made = [_store(v3io_server) for _ in range(3)]
    try:
        yield made
    finally:
        for s in made:
            s.close()


@pytest.fixture
def path() -> str:
    """A fresh v3io stream path per test: the state item lives in it, as next to a real stream."""
    return unique_v3io_name("logged")


def _key(path: str) -> str:
    return state_key(f"v3io://127.0.0.1/{CONTAINER}/{path}", "g")


def tick(store: V3ioStateStore, key: str, member: str, now: float, high: int) -> list[protocol.Launch]:
    def transition(current: GroupState | None, at: float) -> tuple[GroupState, list[protocol.Launch]]:
        base = current or protocol.new_group(key.split("|", maxsplit=1)[0], "g", at)
        state = protocol.membership_step(base, member, now, POLICY, SHARDS)
        marks = {sid: Watermark(low=0, high=high) for sid in protocol.owned_idle_shards(state, member)}
        return protocol.plan(state, member, now, marks, POLICY)

    launches, _ = update_state(store, key, transition, sleep=lambda _s: None)
    return launches


def commit(store: V3ioStateStore, key: str, launches: list[protocol.Launch]) -> None:
    reports = [protocol.report_of(x) for x in launches]
    outcome, _ = update_state(store, key, lambda s, _at: protocol.commit_run(s, reports) if s else (s, None))
    assert outcome is not None and outcome.accepted


def base_item(client: Any, path: str) -> dict[str, Any]:
    found: dict[str, Any] = client.kv.get(CONTAINER, path, "g-state.json", attribute_names=["**"]).output.item
    return found


def log_items(client: Any, path: str) -> dict[int, dict[str, Any]]:
    """Every log item of the state, by version (read with the real client's range scan); the head item aside."""
    items = client.kv.new_cursor(CONTAINER, path + "/", attribute_names=["**"], sharding_key="g-state",
                                 sort_key_range_start="json.log-", sort_key_range_end="json.log.").all()  # fmt: skip
    out = {}
    for item in items:
        parsed = parse_log_item("g-state.json", item["__name"])
        assert parsed is not None, item["__name"]
        if not parsed.is_head:
            assert parsed.version not in out, f"two log items of version {parsed.version}"
            out[parsed.version] = item
    return out


def test_a_fresh_reader_rebuilds_the_writers_state_from_the_base_and_the_log(
    stores: list[V3ioStateStore], path: str, v3io_client: Any
) -> None:
    writer, other, _ = stores
    key = _key(path)
    now = 0.0
    for round_ in range(1, 6):
        for member in ("a", "b", "c"):
            now += 1.0
            launches = tick(writer if member != "c" else other, key, member, now, high=round_ * 10)
            if launches:
                commit(writer, key, launches)
        state, _ = writer.load(key)
        fresh = _store_like(writer)  # a host that never saw this key
        try:
            assert fresh.load(key)[0] == state
            assert other.load(key)[0] == state
        finally:
            fresh.close()
    assert state is not None and sum(1 for s in state.shards.values() if s.committed) == len(SHARDS)
    base, logged = base_item(v3io_client, path), log_items(v3io_client, path)
    assert base[VERSION] == 1, "small state: nothing folded yet, every write is a log item"
    assert sorted(logged) == list(range(2, 2 + len(logged))) and len(logged) >= 20
    assert LINEAGE in base and all(base[LINEAGE] in name for name in (i["__name"] for i in logged.values()))
    whole = encode_attributes(encode_state(state))  # the state as a fold would write it
    whole_chars = sum(len(value) for name, value in whole.items() if name.startswith(STATE) and isinstance(value, str))
    assert max(len(item[STATE]) for item in logged.values()) < whole_chars / 2, "a delta, not the state"


def _store_like(store: V3ioStateStore) -> V3ioStateStore:
    return V3ioStateStore(store.connection, directory=store.directory)


def test_two_writers_holding_one_version_one_wins(stores: list[V3ioStateStore], path: str, v3io_client: Any) -> None:
    first, second, _ = stores
    key = _key(path)
    assert first.save_if(key, protocol.new_group("s", "g", 1.0), None)
    state_a, token_a = first.load(key)
    state_b, token_b = second.load(key)
    assert token_a == token_b and state_a is not None and state_b is not None
    assert first.save_if(key, protocol.heartbeat(state_a, "a", 2.0), token_a)
    assert not second.save_if(key, protocol.heartbeat(state_b, "b", 2.0), token_b)
    logged = log_items(v3io_client, path)
    assert list(logged) == [2] and '"a"' in logged[2][STATE] and '"b"' not in logged[2][STATE]
    state, token = second.load(key)
    assert state is not None and set(state.members) == {"a"}
    assert second.save_if(key, protocol.heartbeat(state, "b", 3.0), token)
    assert set(first.load(key)[0].members) == {"a", "b"}  # type: ignore[union-attr]


def test_the_log_is_folded_into_the_base_and_folded_items_deleted(
    stores: list[V3ioStateStore], path: str, v3io_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(v3io_log, "MIN_FOLD_BYTES", 0)
    monkeypatch.setattr(v3io_log, "FOLD_FRACTION", 1.0)  # fold once the log weighs the base item
    writer, reader, _ = stores
    key = _key(path)
    tick(writer, key, "a", 1.0, high=10)
    assert reader.load(key)[0] is not None  # holds an early version, to read on from it after folds
    seen_bases = set()
    for i in range(2, 60):
        tick(writer, key, "a" if i % 2 else "b", float(i), high=10 + i)
        seen_bases.add(base_item(v3io_client, path)[VERSION])
    base = base_item(v3io_client, path)
    assert len(seen_bases) >= 3, f"the log was folded more than once: {sorted(seen_bases)}"
    logged = log_items(v3io_client, path)
    assert logged and min(logged) > 1 and max(logged) >= base[VERSION]
    assert len(logged) < 40, "the items the folds covered were deleted"
    state, token = writer.load(key)
    assert reader.load(key)[0] == state
    fresh = _store_like(writer)
    try:
        assert fresh.load(key) == (state, token)
    finally:
        fresh.close()


def _old_base(v3io_client: Any, path: str, state: GroupState, schema: int) -> None:
    """The base item as the whole-item store (no log) wrote it, at ``schema``."""
    raw = json.loads(encode_state(state))
    raw["schema_version"] = schema
    attributes = encode_attributes(json.dumps(raw))
    attributes[SCHEMA] = schema
    v3io_client.kv.put(CONTAINER, path, "g-state.json", attributes)


@pytest.mark.parametrize("schema", [2, 3])
def test_a_base_written_whole_by_an_earlier_version_is_rewritten_whole_first(
    stores: list[V3ioStateStore], path: str, v3io_client: Any, schema: int
) -> None:
    store, _, _ = stores
    key = _key(path)
    _old_base(v3io_client, path, protocol.new_group("s", "g", 1.0), schema)
    before = base_item(v3io_client, path)
    state, token = store.load(key)
    assert state is not None and token is not None and token.startswith("m:")
    assert store.save_if(key, protocol.heartbeat(state, "a", 2.0), token)
    after = base_item(v3io_client, path)
    assert (after[SCHEMA], after[VERSION], after[KIND]) == (protocol.state.SCHEMA_VERSION, 1, before[KIND])
    assert log_items(v3io_client, path) == {}, "nothing was logged over a base an earlier member still replaces"
    if schema < protocol.state.SCHEMA_VERSION:
        # The earlier version's own write (the mtime it now reads, its schema guard) is refused.
        old_condition = (
            f"(__mtime_secs == {after['__mtime_secs']}) AND (__mtime_nsecs == {after['__mtime_nsecs']}) "
            f"AND ({KIND} == '{after[KIND]}') AND ({SCHEMA} <= {schema})"
        )
        response = v3io_client.kv.update(CONTAINER, path, "g-state.json", attributes={STATE: "{}"},
                                         condition=old_condition, raise_for_status=RaiseForStatus.never)  # fmt: skip
        assert response.status_code == 400
    state, token = _store_like(store).load(key)
    assert state is not None and set(state.members) == {"a"}
    assert store.save_if(key, protocol.heartbeat(state, "b", 3.0), token)
    assert list(log_items(v3io_client, path)) == [2]


def test_an_append_never_builds_on_a_base_of_a_newer_version(
    stores: list[V3ioStateStore], path: str, v3io_client: Any
) -> None:
    store, _, _ = stores
    key = _key(path)
    assert store.save_if(key, protocol.new_group("s", "g", 1.0), None)
    state, token = store.load(key)
    assert state is not None
    raw = json.loads(encode_state(state))
    raw["schema_version"] = protocol.state.SCHEMA_VERSION + 1  # a newer member rewrote the base
    v3io_client.kv.update(CONTAINER, path, "g-state.json",
                          attributes={STATE: json.dumps(raw), SCHEMA: protocol.state.SCHEMA_VERSION + 1})  # fmt: skip
    with pytest.raises(NewerSchemaError):
        store.save_if(key, protocol.heartbeat(state, "a", 2.0), token)
    assert log_items(v3io_client, path) == {}


def test_log_items_of_a_deleted_state_are_never_read_and_are_removed(
    stores: list[V3ioStateStore], path: str, v3io_client: Any
) -> None:
    store, other, _ = stores
    key = _key(path)
    assert store.save_if(key, protocol.new_group("s", "g", 1.0), None)
    state, token = store.load(key)
    assert state is not None and store.save_if(key, protocol.heartbeat(state, "old", 2.0), token)
    v3io_client.kv.delete(CONTAINER, path, "g-state.json")  # an operator hands the group over
    assert other.save_if(key, protocol.new_group("s", "g", 5.0), None)
    assert log_items(v3io_client, path) == {}, "the earlier state's log went with it"
    state, token = store.load(key)
    assert state is not None and state.created_at == 5.0 and not state.members
    assert store.save_if(key, protocol.heartbeat(state, "new", 6.0), token)
    assert set(other.load(key)[0].members) == {"new"}  # type: ignore[union-attr]


def test_a_heartbeat_only_write_is_a_few_hundred_bytes(
    stores: list[V3ioStateStore], path: str, v3io_client: Any
) -> None:
    store, _, _ = stores
    key = _key(path)
    start = 1_000.0
    members = [f"m{i:03d}" for i in range(20)]
    state = protocol.sync_shards(protocol.new_group("s", "g", start), [f"s{i:05d}" for i in range(2_000)], start)
    for member in members:
        state = protocol.heartbeat(state, member, start)
    state = protocol.rebalance(state, members[0], start, POLICY)
    assert store.save_if(key, state, None)
    base_bytes = len(base_item(v3io_client, path)[STATE])
    before = store.bytes_written
    state, token = store.load(key)
    assert state is not None and store.save_if(key, protocol.heartbeat(state, "m007", start + 5), token)
    written = store.bytes_written - before
    logged = log_items(v3io_client, path)
    assert list(logged) == [2] and len(logged[2][STATE]) == written
    assert written < 4_096 < base_bytes, (written, base_bytes)
