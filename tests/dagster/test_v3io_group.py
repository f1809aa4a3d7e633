"""The v3io group resource: configuration errors, and members that keep their state next to the stream."""

from __future__ import annotations

from typing import Any

import pytest
import v3io.dataplane
from pydantic import ValidationError

from dagster_streamgroup.dagster import StreamGroupConfigError, V3ioStreamGroup
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.protocol import report_of
from tests.fixtures.v3io import unique_v3io_name

SECRET = "s3cr3t-key-value"


def test_configuration_errors_name_the_field_and_hide_the_key() -> None:
    with pytest.raises((ValidationError, StreamGroupConfigError), match="group 'a-b'"):
        V3ioStreamGroup(group="a-b", endpoint="http://127.0.0.1:1", container="c", stream_path="s", access_key=SECRET)
    with pytest.raises((ValidationError, StreamGroupConfigError), match="endpoint") as caught:
        V3ioStreamGroup(group="g", endpoint="ftp://x", container="c", stream_path="s", access_key=SECRET)
    assert SECRET not in str(caught.value)
    resource = V3ioStreamGroup(group="g", endpoint="127.0.0.1:1", container="c", stream_path="s", access_key=SECRET)
    assert SECRET not in repr(resource) and SECRET not in repr(resource.stream_config())


@pytest.mark.v3io
def test_members_claim_launch_and_commit_with_state_next_to_the_stream(
    v3io_server: V3ioServerInfo, v3io_client: Any
) -> None:
    stream = unique_v3io_name("clicks")
    v3io_client.stream.create(container="bigdata", stream_path=stream, shard_count=2)
    records = [{"shard_id": i % 2, "data": f"event-{i}"} for i in range(10)]
    v3io_client.stream.put_records(container="bigdata", stream_path=stream, records=records)
    resource = V3ioStreamGroup(
        group="readers",
        endpoint=v3io_server.endpoint,
        container="bigdata",
        stream_path=stream,
        access_key=v3io_server.access_key.get_secret_value(),
        store_url="v3io",
        heartbeat_interval_s=1,
        session_timeout_s=5,
        join_grace_s=0,
        min_backlog=1,
    )
    member = resource.member("m0")
    report = member.tick()
    assert sorted(report.owned) == ["0", "1"]
    assert sorted((x.shard, x.start, x.end) for x in report.new_launches) == [("0", 1, 6), ("1", 1, 6)]
    assert len({x.run_key for x in report.new_launches}) == 1, "one run over both shards"
    launch = report.new_launches[0]
    outcome = member.commit_run([report_of(x) for x in report.new_launches])
    assert outcome.accepted
    item = v3io_client.kv.get(
        container="bigdata",
        table_path=stream,
        key=launch.shard,
        attribute_names=["__readers_committed_sequence_number"],
    )
    assert item.output.item["__readers_committed_sequence_number"] == 5, "v3io keeps the last processed number"
    state_item = v3io.dataplane.Client(
        endpoint=v3io_server.endpoint, access_key=v3io_server.access_key.get_secret_value()
    ).kv.get(container="bigdata", table_path=stream, key="readers-state.json", attribute_names=["state_kind"])
    assert state_item.output.item["state_kind"] == "dagster-streamgroup/group-state"
    assert resource.backend().committed("readers", ["0", "1"]) == {"0": 6, "1": 6}
