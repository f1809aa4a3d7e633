"""The v3io state store beyond the shared contract: thousands of shards in one item, a v3io-go group left
untouched, the platform clock, concurrent members, and a real member tick next to a real stream."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.member import GroupMember, update_state
from dagster_streamgroup.protocol import GroupPolicy
from dagster_streamgroup.protocol.codec import ForeignStateError
from dagster_streamgroup.protocol.state import GroupState, InFlight, ShardState
from dagster_streamgroup.stores import v3io_log
from dagster_streamgroup.stores.base import StoreConfigError, state_key
from dagster_streamgroup.stores.factory import open_store
from dagster_streamgroup.stores.v3io import PART_CHARS, PARTS, STATE, V3ioStateStore
from dagster_streamgroup.streams.v3io_config import V3ioConnection
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io.conftest import CONTAINER, NewStream

pytestmark = pytest.mark.v3io


def _store(server: V3ioServerInfo, **options: Any) -> V3ioStateStore:
    connection = V3ioConnection(endpoint=server.endpoint, container=CONTAINER, access_key=server.access_key)
    return V3ioStateStore(connection, **options)


@pytest.fixture
def store(v3io_server: V3ioServerInfo) -> Iterator[V3ioStateStore]:
    s = _store(v3io_server)
    try:
        yield s
    finally:
        s.close()


def _big_state(stream: str, group: str, shards: int) -> GroupState:
    records = {
        str(i): ShardState(
            owner=f"member-{i % 13}-c0ffee",
            epoch=i % 5,
            committed=1 + i * 37,
            inflight=InFlight(1 + i * 37, 1 + i * 37 + 500, 0, f"run-{i}-{i * 7919 % 100003}", i % 5,
                              f"member-{i % 13}-c0ffee", 1_700_000_000.5 + i),
            discovered_at=1_700_000_000.0 + i / 3,
        )
        for i in range(shards)
    }  # fmt: skip
    return GroupState(stream=stream, group=group, created_at=1_700_000_000.0, shards=records)


@pytest.mark.parametrize("compress", [True, False], ids=["compressed", "plain"])
def test_a_state_of_thousands_of_shards_round_trips_in_one_item(
    v3io_server: V3ioServerInfo, v3io_client: Any, compress: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(v3io_server, compress=compress)
    try:
        stream = f"v3io://127.0.0.1/{CONTAINER}/{unique_v3io_name('big')}"
        key = state_key(stream, "g")
        state = _big_state(stream, "g", 6000)
        assert store.save_if(key, state, None)
        loaded, token = store.load(key)
        assert loaded == state
        stream_path = stream.split(f"/{CONTAINER}/", 1)[1]
        item = v3io_client.kv.get(CONTAINER, stream_path, "g-state.json", attribute_names=["**"]).output.item
        parts = item[PARTS]
        assert parts > 1 and all(len(item[f"{STATE}_{i}"]) <= PART_CHARS for i in range(1, parts))
        smaller = _big_state(stream, "g", 10)
        assert store.save_if(key, smaller, token)  # logged whole (shards went away: no delta joins them)
        assert _store(v3io_server, compress=compress).load(key)[0] == smaller
        monkeypatch.setattr(v3io_log, "MIN_FOLD_BYTES", 0)
        monkeypatch.setattr(v3io_log, "FOLD_FRACTION", 0.0)
        assert store.save_if(key, smaller.model_copy(update={"revision": 1}), store.load(key)[1])
        # folded: the shorter state replaced every part of the base item
        item = v3io_client.kv.get(CONTAINER, stream_path, "g-state.json", attribute_names=["*"]).output.item
        assert sorted(n for n in item if n.startswith(f"{STATE}_")) == sorted(
            ["state_encoding", "state_kind", "state_lineage", "state_parts", "state_schema", "state_version"]
        )
        assert _store(v3io_server, compress=compress).load(key)[0] == smaller.model_copy(update={"revision": 1})
    finally:
        store.close()


def test_a_v3io_go_group_is_refused_and_left_untouched(
    store: V3ioStateStore, new_stream: NewStream, v3io_client: Any
) -> None:
    backend = new_stream(2)
    path = backend.config.stream_path
    go_state = json.dumps(
        {"schema_version": "0.0.1",
         "session_states": [{"member_id": "fn-c9k2", "last_heartbeat_time": "2026-11-02T03:04:05.1+02:00",
                             "shards": [0, 1]}]}
    )  # fmt: skip
    # Exactly how v3io-go creates its group state (UpdateItem with attributes, create-only condition).
    v3io_client.kv.update(CONTAINER, path, "nuclio-state.json", attributes={STATE: go_state},
                          condition="not(exists(state))")  # fmt: skip
    names = ["__mtime_secs", "__mtime_nsecs", STATE]
    before = v3io_client.kv.get(CONTAINER, path, "nuclio-state.json", attribute_names=names).output.item
    key = state_key(backend.stream_id, "nuclio")

    with pytest.raises(ForeignStateError, match="managed by v3io-go/Nuclio") as refused:
        store.load(key)
    assert f"{path}/nuclio-state.json" in str(refused.value)
    assert store.save_if(key, GroupState(stream=backend.stream_id, group="nuclio", created_at=1.0), None) is False
    real_token = f"m:{before['__mtime_secs']}:{before['__mtime_nsecs']}"  # as if it were an earlier state of ours
    with pytest.raises(ForeignStateError):  # even with its true mtime, the item is not ours to replace
        store.save_if(key, GroupState(stream=backend.stream_id, group="nuclio", created_at=1.0), real_token)
    after = v3io_client.kv.get(CONTAINER, path, "nuclio-state.json", attribute_names=names).output.item
    assert after == before


def test_now_is_the_platform_mtime_and_only_moves_forward(store: V3ioStateStore, v3io_client: Any) -> None:
    readings = [store.now() for _ in range(30)]
    assert all(b > a for a, b in itertools.pairwise(readings))
    item = v3io_client.kv.get(CONTAINER, store.directory, "clock", attribute_names=["__mtime_secs", "__mtime_nsecs"])
    mtime = item.output.item["__mtime_secs"] + item.output.item["__mtime_nsecs"] / 1e9
    assert mtime == pytest.approx(readings[-1], abs=1e-6)


def test_concurrent_members_lose_no_update(v3io_server: V3ioServerInfo) -> None:
    """Four threads, each with its own store (client), add themselves to one state under CAS."""
    key = state_key(f"v3io://127.0.0.1/{CONTAINER}/{unique_v3io_name('race')}", "g")
    per_thread, threads_n = 8, 4
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        s = _store(v3io_server)
        try:
            for i in range(per_thread):

                def add(current: GroupState | None, now: float, tag: str = f"t{n}-{i}") -> tuple[GroupState, None]:
                    base = current or GroupState(stream=key.split("|")[0], group="g", created_at=now)
                    return base.model_copy(update={"shards": {**base.shards, tag: ShardState()}}), None

                update_state(s, key, add, max_attempts=50, backoff_cap_s=0.05)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    check = _store(v3io_server)
    try:
        state, _ = check.load(key)
    finally:
        check.close()
    assert state is not None and len(state.shards) == per_thread * threads_n


def test_a_member_keeps_its_group_next_to_the_stream(
    store: V3ioStateStore, new_stream: NewStream, v3io_client: Any
) -> None:
    backend = new_stream(3)
    group = unique_v3io_name("cg")
    member = GroupMember(store, backend, group, "member-a", GroupPolicy(join_grace_s=0))
    for _ in range(2):
        report = member.tick()
    assert sorted(report.owned) == ["0", "1", "2"]
    item = v3io_client.kv.get(CONTAINER, backend.config.stream_path, f"{group}-state.json",
                              attribute_names=[STATE]).output.item  # fmt: skip
    assert json.loads(item[STATE])["group"] == group


def test_store_urls_are_checked_and_never_carry_the_key(v3io_server: V3ioServerInfo, tmp_path: Path) -> None:
    port = v3io_server.port
    with pytest.raises(StoreConfigError, match="must not be in the URL") as caught:
        open_store(f"v3io://user:s3cret@127.0.0.1:{port}/bigdata")
    assert "s3cret" not in str(caught.value)
    with pytest.raises(StoreConfigError, match="must not be in the URL"):
        open_store(f"v3io://127.0.0.1:{port}/bigdata?access_key=s3cret")
    with pytest.raises(StoreConfigError, match="unknown option"):
        open_store(f"v3io://127.0.0.1:{port}/bigdata?colour=red")
    with pytest.raises(StoreConfigError, match=r"store_url: .*CONTAINER"):
        open_store(f"v3io://127.0.0.1:{port}")
    with pytest.raises(StoreConfigError, match="access_key_file: cannot read"):
        open_store(f"v3io://127.0.0.1:{port}/bigdata?access_key_file={tmp_path / 'absent'}")
    key_file = tmp_path / "key"
    key_file.write_text(v3io_server.access_key.get_secret_value())
    opened = open_store(f"v3io://127.0.0.1:{port}/bigdata/groups/prod?access_key_file={key_file}&compress=false")
    try:
        assert isinstance(opened, V3ioStateStore)
        assert (opened.directory, opened.compress) == ("groups/prod", False)
        assert v3io_server.access_key.get_secret_value() not in repr(opened)
        assert opened.now() > 0
    finally:
        opened.close()


def test_an_unreachable_platform_is_a_clear_error(tmp_path: Path) -> None:
    connection = V3ioConnection(endpoint="http://127.0.0.1:9", container=CONTAINER, access_key="k")
    store = V3ioStateStore(connection)
    try:
        with pytest.raises(Exception, match="cannot load") as caught:
            store.load(state_key("s", "g"))
        assert type(caught.value).__name__ == "StoreUnavailableError"
    finally:
        store.close()


def test_keys_of_other_streams_live_under_the_store_directory(store: V3ioStateStore, v3io_client: Any) -> None:
    key = state_key("kafka://127.0.0.1:9092/orders,payments", "g")
    assert store.save_if(key, GroupState(stream="kafka://127.0.0.1:9092/orders,payments", group="g", created_at=1.0),
                         None)  # fmt: skip
    listing = v3io_client.container.list(CONTAINER, f"{store.directory}/").output
    names = [p.prefix for p in listing.common_prefixes]
    assert any("kafka_127.0.0.1_9092_orders_payments-" in n for n in names)
