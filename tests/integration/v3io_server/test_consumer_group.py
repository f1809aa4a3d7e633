"""The v3io-go consumer-group round trip the group-state store relies on: create the state item with
``not(exists(state))``, update it under ``(__mtime_nsecs == N) AND (__mtime_secs == S)``, see a stale mtime
refused, and commit ``__<group>_committed_sequence_number`` on the shard object under ``__obj_type == 3``."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import v3io.dataplane

from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io_server.helpers import CONTAINER, NEVER

pytestmark = pytest.mark.v3io

MTIME = ["__mtime_nsecs", "__mtime_secs", "state"]


def _condition_false(response: Any) -> bool:
    body = response.body.decode()
    return response.status_code == 400 and body.count("ErrorCode") == 1 and "16777244" in body


def _read_state(client: Any, stream: str) -> tuple[dict[str, Any], str]:
    item = client.kv.get(CONTAINER, stream, "cg0-state.json", attribute_names=MTIME).output.item
    condition = f"(__mtime_nsecs == {item['__mtime_nsecs']}) AND (__mtime_secs == {item['__mtime_secs']})"
    return json.loads(item["state"]), condition


def test_state_item_create_update_and_stale_refusal(v3io_client: Any) -> None:
    stream = unique_v3io_name("stream")
    v3io_client.stream.create(CONTAINER, stream, shard_count=2)
    assert v3io_client.kv.get(CONTAINER, stream, "cg0-state.json", raise_for_status=NEVER).status_code == 404

    initial = {"schema_version": "0.0.1", "session_states": []}
    v3io_client.kv.update(
        CONTAINER, stream, "cg0-state.json", attributes={"state": json.dumps(initial)}, condition="not(exists(state))"
    )
    second_create = v3io_client.kv.update(
        CONTAINER,
        stream,
        "cg0-state.json",
        attributes={"state": "{}"},
        condition="not(exists(state))",
        raise_for_status=NEVER,
    )
    assert _condition_false(second_create)

    state, condition = _read_state(v3io_client, stream)
    assert state == initial
    state["session_states"].append({"member_id": "m-1", "last_heartbeat_time": "2024-01-02T03:04:05Z", "shards": [0]})
    v3io_client.kv.update(
        CONTAINER, stream, "cg0-state.json", attributes={"state": json.dumps(state)}, condition=condition
    )

    stale = v3io_client.kv.update(
        CONTAINER, stream, "cg0-state.json", attributes={"state": "{}"}, condition=condition, raise_for_status=NEVER
    )
    assert _condition_false(stale)
    assert _read_state(v3io_client, stream)[0] == state

    # storey's form: the transaction-verifier header of the last write, verbatim, as the condition
    written = v3io_client.kv.update(
        CONTAINER, stream, "cg0-state.json", attributes={"state": "{}"}, condition=_read_state(v3io_client, stream)[1]
    )
    verifier = written.headers["X-v3io-transaction-verifier"]
    v3io_client.kv.update(CONTAINER, stream, "cg0-state.json", attributes={"state": "[]"}, condition=verifier)
    again = v3io_client.kv.update(
        CONTAINER, stream, "cg0-state.json", attributes={"state": "x"}, condition=verifier, raise_for_status=NEVER
    )
    assert _condition_false(again)


def test_committed_sequence_number_on_shard(v3io_client: Any) -> None:
    stream = unique_v3io_name("stream")
    v3io_client.stream.create(CONTAINER, stream, shard_count=2)
    attribute = "__cg0_committed_sequence_number"

    # shard 1 has no records yet: the shard object does not exist and the guarded commit is refused
    early = v3io_client.kv.update(
        CONTAINER, stream, "1", attributes={attribute: 3}, condition="__obj_type == 3", raise_for_status=NEVER
    )
    assert _condition_false(early)
    assert v3io_client.kv.get(CONTAINER, stream, "1", raise_for_status=NEVER).status_code == 404

    v3io_client.stream.put_records(CONTAINER, stream, [{"data": str(i), "shard_id": 1} for i in range(20)])
    fresh = v3io_client.kv.get(CONTAINER, stream, "1", attribute_names=[attribute]).output.item
    assert fresh == {}  # present shard, missing attribute: v3io-go seeks its initial location

    v3io_client.kv.update(CONTAINER, stream, "1", attributes={attribute: 17}, condition="__obj_type == 3")
    committed = v3io_client.kv.get(CONTAINER, stream, "1", attribute_names=[attribute]).output.item[attribute]
    assert committed == 17
    location = v3io_client.stream.seek(
        CONTAINER, stream, 1, "SEQUENCE", starting_sequence_number=committed + 1
    ).output.location
    assert [
        r.sequence_number for r in v3io_client.stream.get_records(CONTAINER, stream, 1, location).output.records
    ] == [
        18,
        19,
        20,
    ]
    # records written later keep the commit attribute
    v3io_client.stream.put_records(CONTAINER, stream, [{"data": "more", "shard_id": 1}])
    item = v3io_client.kv.get(CONTAINER, stream, "1", attribute_names=[attribute, "__last_sequence_num"]).output.item
    assert item == {attribute: 17, "__last_sequence_num": 21}

    # a plain item is not a shard
    v3io_client.kv.put(CONTAINER, stream, "cg0-state.json", {"state": "{}"})
    not_shard = v3io_client.kv.update(
        CONTAINER,
        stream,
        "cg0-state.json",
        attributes={attribute: 1},
        condition="__obj_type == 3",
        raise_for_status=NEVER,
    )
    assert _condition_false(not_shard)


def test_concurrent_mtime_cas_loses_no_update(v3io_server: V3ioServerInfo) -> None:
    """Threads race read-modify-write cycles on one item; every acknowledged write must be counted once."""
    table = unique_v3io_name("cas")
    setup = v3io.dataplane.Client(**v3io_server.client_kwargs())
    setup.kv.put(CONTAINER, table, "counter", {"n": 0})
    successes = [0] * 4
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        client = v3io.dataplane.Client(**v3io_server.client_kwargs(), max_connections=1)
        try:
            for _ in range(40):
                item = client.kv.get(
                    CONTAINER, table, "counter", attribute_names=["n", "__mtime_secs", "__mtime_nsecs"]
                )
                values = item.output.item
                condition = (
                    f"(__mtime_nsecs == {values['__mtime_nsecs']}) AND (__mtime_secs == {values['__mtime_secs']})"
                )
                response = client.kv.update(
                    CONTAINER,
                    table,
                    "counter",
                    attributes={"n": values["n"] + 1},
                    condition=condition,
                    raise_for_status=NEVER,
                )
                if response.status_code == 200:
                    successes[index] += 1
                elif not _condition_false(response):
                    raise AssertionError(response.body)
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    final = setup.kv.get(CONTAINER, table, "counter").output.item["n"]
    setup.close()
    assert final == sum(successes) and final > 0
