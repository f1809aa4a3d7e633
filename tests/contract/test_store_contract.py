"""The StateStore contract, written once and run against every store (see store_harness.py to add one).

Real stores only: SQLite in a temporary file and a real PostgreSQL server.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagster_streamgroup.protocol.codec import ForeignStateError, NewerSchemaError, StateFormatError, encode_state
from dagster_streamgroup.protocol.state import SCHEMA_VERSION, GroupState, Member, ShardState
from dagster_streamgroup.stores.base import StateStore, state_key
from tests.contract.store_harness import BUILDERS, PARAMS, StoreHarness


@pytest.fixture(params=PARAMS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
    h = BUILDERS[request.param](request, tmp_path)
    try:
        yield h
    finally:
        h.store.close()
        if h.cleanup is not None:
            h.cleanup()


@pytest.fixture
def store(harness: StoreHarness) -> StateStore:
    return harness.store


@pytest.fixture
def key() -> str:
    """A fresh key per test: the PostgreSQL database is shared by the whole session."""
    return state_key(f"stream-{uuid.uuid4().hex[:8]}", "group")


def _state(key: str, *, created_at: float = 1000.0, members: tuple[str, ...] = ()) -> GroupState:
    stream, group = key.split("|")
    return GroupState(
        stream=stream,
        group=group,
        created_at=created_at,
        members={m: Member(member_id=m, joined=created_at, heartbeat=created_at) for m in members},
    )


def _newer_schema_body(key: str) -> str:
    raw = json.loads(encode_state(_state(key)))
    raw["schema_version"] = SCHEMA_VERSION + 1
    raw["field_from_the_future"] = {"x": 1}
    return json.dumps(raw)


FOREIGN_BODIES = {
    "v3io-go": json.dumps({"session_states": [{"member_id": "nuclio-0", "shards": [0, 1]}]}),
    "other-kind": json.dumps({"kind": "someone-else/state", "schema_version": 1}),
    "not-json": "<xml>not ours</xml>",
}


def test_load_absent_key(store: StateStore, key: str) -> None:
    assert store.load(key) == (None, None)


def test_create_if_absent_refuses_a_second_create(store: StateStore, key: str) -> None:
    first, second = _state(key, created_at=1.0), _state(key, created_at=2.0)
    assert store.save_if(key, first, None) is True
    assert store.save_if(key, second, None) is False
    state, token = store.load(key)
    assert state == first
    assert token is not None


def test_save_if_with_the_current_token_writes(store: StateStore, key: str) -> None:
    assert store.save_if(key, _state(key), None)
    _, token = store.load(key)
    updated = _state(key, members=("m1", "m2")).model_copy(
        update={"shards": {"0": ShardState(owner="m1", epoch=3, committed=42)}, "revision": 1}
    )
    assert store.save_if(key, updated, token) is True
    state, new_token = store.load(key)
    assert state == updated
    assert new_token != token


def test_save_if_with_a_stale_token_is_refused(store: StateStore, key: str) -> None:
    assert store.save_if(key, _state(key), None)
    _, token_a = store.load(key)
    _, token_b = store.load(key)
    winner = _state(key, members=("a",))
    loser = _state(key, members=("b",))
    assert store.save_if(key, winner, token_a) is True
    assert store.save_if(key, loser, token_b) is False
    assert store.load(key)[0] == winner


def test_save_if_with_a_token_for_an_absent_key_is_refused(store: StateStore, key: str) -> None:
    other = key + "-other"
    assert store.save_if(other, _state(other), None)
    _, token = store.load(other)
    assert store.save_if(key, _state(key), token) is False
    assert store.load(key) == (None, None)


def test_tokens_change_on_every_write(store: StateStore, key: str) -> None:
    assert store.save_if(key, _state(key), None)
    seen: list[str] = []
    for i in range(6):
        state, token = store.load(key)
        assert state is not None and token is not None
        seen.append(token)
        assert store.save_if(key, state.model_copy(update={"revision": i + 1}), token)
    final, token = store.load(key)
    assert token is not None
    seen.append(token)
    assert len(set(seen)) == len(seen)
    assert final is not None and final.revision == 6


def test_keys_are_independent(store: StateStore, key: str) -> None:
    k1, k2 = key, key + "-2"
    assert store.save_if(k1, _state(k1), None)
    assert store.save_if(k2, _state(k2, members=("only-in-k2",)), None)
    before, token2 = store.load(k2)
    for _ in range(3):
        _, token1 = store.load(k1)
        assert store.save_if(k1, _state(k1, members=("m",)), token1)
    after, token2_after = store.load(k2)
    assert (after, token2_after) == (before, token2)
    assert store.load(k1)[0] == _state(k1, members=("m",))


def test_now_is_sane_and_non_decreasing(store: StateStore) -> None:
    readings = [store.now() for _ in range(20)]
    # Every store here runs on this host, so its clock is within minutes of ours (a store on another host
    # may differ by its skew, which is why members use store.now() and not time.time()).
    assert abs(readings[0] - time.time()) < 300
    assert all(b >= a for a, b in itertools.pairwise(readings))


def _needs_raw(harness: StoreHarness) -> None:
    if harness.put_raw is None or harness.read_raw is None:
        pytest.skip(f"{harness.name}: holds only states it encoded itself, nothing foreign can be planted")


@pytest.mark.parametrize("kind", sorted(FOREIGN_BODIES))
def test_foreign_object_is_refused_and_left_untouched(harness: StoreHarness, key: str, kind: str) -> None:
    _needs_raw(harness)
    assert harness.put_raw is not None and harness.read_raw is not None
    body = FOREIGN_BODIES[kind]
    harness.put_raw(key, body)
    with pytest.raises(ForeignStateError) as refused:
        harness.store.load(key)
    assert key in str(refused.value)
    _assert_never_overwritten(harness, key, body)


def test_newer_schema_is_refused_and_left_untouched(harness: StoreHarness, key: str) -> None:
    _needs_raw(harness)
    assert harness.put_raw is not None and harness.read_raw is not None
    body = _newer_schema_body(key)
    harness.put_raw(key, body)
    with pytest.raises(NewerSchemaError, match="newer"):
        harness.store.load(key)
    _assert_never_overwritten(harness, key, body)


def _assert_never_overwritten(harness: StoreHarness, key: str, body: str) -> None:
    """Neither a create nor a save with a guessed token (a caller that could not decode the row, so it never
    got a real token, tries the first versions) may replace the object."""
    assert harness.read_raw is not None
    ours = _state(key, members=("intruder",))
    assert harness.store.save_if(key, ours, None) is False
    for guess in ("0", "1", "2"):
        try:
            written = harness.store.save_if(key, ours, guess)
        except StateFormatError:
            written = False
        assert written is False
    assert harness.read_raw(key) == body
