"""Errors a v3io user meets, each through the real client and the project's v3io server: they name what the
platform said and what to do, and none is taken for an empty or absent thing."""

from __future__ import annotations

from typing import Any

import pytest

from dagster_streamgroup.dagster import V3ioStreamGroup
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.stores.base import StoreUnavailableError, state_key
from dagster_streamgroup.stores.v3io import V3ioStateStore
from dagster_streamgroup.streams.base import StreamError
from dagster_streamgroup.streams.v3io import V3ioBackend
from dagster_streamgroup.streams.v3io_config import V3ioConnection, V3ioStreamConfig
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io.conftest import CONTAINER, NewStream, put

pytestmark = pytest.mark.v3io


def test_a_missing_container_is_named_by_the_backend_and_never_read_as_an_empty_state(
    v3io_server: V3ioServerInfo,
) -> None:
    """The stream used to be reported as missing, and the state store read 'no state' from a container that does
    not exist (a member would then have tried to create its state there)."""
    config = V3ioStreamConfig(
        endpoint=v3io_server.endpoint, container="nosuch", stream_path="clicks", access_key=v3io_server.access_key
    )
    backend = V3ioBackend(config)
    try:
        with pytest.raises(StreamError, match="container 'nosuch' does not exist") as caught:
            backend.shards()
        assert "stream does not exist" not in str(caught.value)
        with pytest.raises(StreamError, match="container 'nosuch' does not exist"):
            backend.committed("g", ["0"])
    finally:
        backend.close()
    connection = V3ioConnection(endpoint=v3io_server.endpoint, container="nosuch", access_key=v3io_server.access_key)
    store = V3ioStateStore(connection)
    try:
        key = state_key(f"v3io://127.0.0.1/nosuch/{unique_v3io_name('s')}", "g")
        for call in (lambda: store.load(key), store.now):
            with pytest.raises(StoreUnavailableError, match="container 'nosuch' does not exist"):
                call()
    finally:
        store.close()


def test_a_state_item_replaced_by_something_else_says_how_to_restore_it(
    v3io_server: V3ioServerInfo, v3io_client: Any, new_stream: NewStream
) -> None:
    """The refusal used to say only 'use another group name': wrong advice for a group that was ours and whose
    item someone overwrote (renaming it would start a new group and leave the old offsets behind)."""
    backend = new_stream(1)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"a"] * 3)
    group = unique_v3io_name("replaced")
    resource = V3ioStreamGroup(
        group=group, endpoint=v3io_server.endpoint, container=CONTAINER, stream_path=path,
        access_key=v3io_server.access_key.get_secret_value(), store_url="v3io", heartbeat_interval_s=1,
        session_timeout_s=5, join_grace_s=0, min_backlog=1, max_wait_s=0,
    )  # fmt: skip
    resource.member("m0").tick()
    v3io_client.kv.put(CONTAINER, path, f"{group}-state.json", attributes={"state": '{"owner": "someone else"}'})
    with pytest.raises(StreamError) as caught:
        resource.member("m0").tick()
    message = str(caught.value)
    assert f"{group}-state.json" in message and "restore" in message and "delete" in message, message
