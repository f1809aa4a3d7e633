"""``streamgroup reset`` and ``status`` over a v3io group, as a user coming from Nuclio runs them: the supported
way to replay a group, and the warning a committed-sequence attribute set by hand gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dagster_streamgroup import protocol
from dagster_streamgroup.cli import main
from dagster_streamgroup.dagster import V3ioStreamGroup
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.streams.v3io import committed_attribute
from tests.fixtures.v3io import unique_v3io_name

pytestmark = pytest.mark.v3io

DEFINITIONS = """
import dagster as dg
from dagster_streamgroup.dagster import V3ioStreamGroup, stream_asset

@stream_asset(group={group!r}, name="events")
def events(context, df):
    return None

defs = dg.Definitions(
    assets=[events],
    resources={{"streamgroup": V3ioStreamGroup(group={group!r}, endpoint={endpoint!r}, container="bigdata",
        stream_path={stream!r}, access_key={key!r}, store_url={store!r}, heartbeat_interval_s=1.0,
        join_grace_s=0.0, min_backlog=1, max_attempts=1)}},
)
"""


def test_reset_and_status_of_a_v3io_group(v3io_server: V3ioServerInfo, v3io_client: Any, tmp_path: Path) -> None:
    stream, group = unique_v3io_name("clicks"), unique_v3io_name("g")
    v3io_client.stream.create(container="bigdata", stream_path=stream, shard_count=1)
    v3io_client.stream.put_records("bigdata", stream, [{"shard_id": 0, "data": f"e{i}"} for i in range(30)])
    key = v3io_server.access_key.get_secret_value()
    store = f"sqlite:///{tmp_path / 'state.db'}"
    definitions = tmp_path / "definitions.py"
    definitions.write_text(
        DEFINITIONS.format(group=group, endpoint=v3io_server.endpoint, stream=stream, key=key, store=store)
    )
    resource = V3ioStreamGroup(
        group=group,
        endpoint=v3io_server.endpoint,
        container="bigdata",
        stream_path=stream,
        access_key=key,
        store_url=store,
        heartbeat_interval_s=1,
        join_grace_s=0,
        min_backlog=1,
    )
    member = resource.member("m0")
    report = member.tick()
    assert member.commit_run([protocol.report_of(x) for x in report.new_launches]).accepted
    runner = CliRunner()

    def cli(*args: str) -> Any:
        return runner.invoke(main, [*args, "--group", group, "--definitions", str(definitions)])

    attribute = committed_attribute(group)
    v3io_client.kv.update("bigdata", stream, "0", attributes={attribute: 9})  # Nuclio's replay
    status = cli("status")
    assert status.exit_code == 0, status.output
    assert "WARNING" in status.output and "streamgroup reset" in status.output and "v3io" in status.output
    assert key not in status.output

    moved = cli("reset", "--shard", "0", "--to-offset", "10")
    assert moved.exit_code == 0, moved.output
    assert "0: 31 -> 10 ([10, 31) read again" in moved.output, moved.output
    item = v3io_client.kv.get("bigdata", stream, "0", attribute_names=[attribute]).output.item
    assert item == {attribute: 9}, "the mirror holds the reset (last processed 9 = next 10)"
    quiet = cli("status")
    assert "WARNING" not in quiet.output, quiet.output
    report = member.tick()
    assert [e for e in report.new_events if e.kind == "reset_refused"] == []
    assert sorted((x.shard, x.start, x.end) for x in report.new_launches) == [("0", 10, 31)]
