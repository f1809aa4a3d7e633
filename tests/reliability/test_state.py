"""A state object a member cannot read: corrupted bytes, a foreign JSON object, a newer schema, a write cut short,
fields of the wrong type, in each real store (SQLite, PostgreSQL, the v3io KV item).

A member refuses it on every call (tick, commit, failure report), naming the store and the key, and never
overwrites it: the object an operator finds is the one that was there. Once the object is readable again
(restored from a backup, or the newer members finish their upgrade), the member goes on where it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from dagster_streamgroup.cli import main
from dagster_streamgroup.local.kafka_data import produce_sample
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.member import GroupMember
from dagster_streamgroup.protocol import NewerSchemaError, RangeReport, StateFormatError, inflight_launches, report_of
from dagster_streamgroup.stores.sql import SqlStateStore
from dagster_streamgroup.stores.v3io import PARTS, STATE, V3ioStateStore
from dagster_streamgroup.streams.v3io_config import V3ioConnection
from tests.fixtures.kafka import TopicFactory, unique_name
from tests.integration.v3io.conftest import CONTAINER, NewStream, put
from tests.reliability.conftest import kafka_backend, member_of


def _kafka_member(url: str, bootstrap: str, topics: TopicFactory) -> tuple[GroupMember, RangeReport]:
    """A member with one range in flight over a fresh two-partition topic."""
    topic = topics(2)
    produce_sample(bootstrap, topic, 2, 40)
    member = member_of(SqlStateStore(url), kafka_backend(bootstrap, topic), unique_name("g"))
    return _with_one_range_in_flight(member)


def _with_one_range_in_flight(member: GroupMember) -> tuple[GroupMember, RangeReport]:
    """The member, and what the run of its first range in flight would present when it ends."""
    launches = member.tick().new_launches
    assert launches
    return member, report_of(launches[0])


def _raw_body(url: str, key: str) -> Any:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT body FROM streamgroup_state WHERE key = :k"), {"k": key}).scalar_one()
    finally:
        engine.dispose()


def _set_row(url: str, key: str, body: Any, **columns: Any) -> None:
    """Write the row around the store, as a bug, a crash or another program would."""
    assignments = ", ".join(["body = :body", *(f"{name} = :{name}" for name in columns)])
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(f"UPDATE streamgroup_state SET {assignments} WHERE key = :k"), {"k": key, "body": body, **columns}
            )
    finally:
        engine.dispose()


def _refused_everywhere(
    member: GroupMember, report: RangeReport, error: type[StateFormatError], pattern: str, where: str
) -> None:
    """Every call that would write refuses the object, naming where it is: the tick, and the commit and the
    failure report of the run that was in flight when the object went bad."""
    calls = (member.tick, lambda: member.commit(report), lambda: member.fail(report, "the run failed"))
    for call in calls:
        with pytest.raises(error, match=pattern) as caught:
            call()
        assert where in str(caught.value), str(caught.value)


def _resumes(member: GroupMember) -> None:
    """The restored state is the one from before: its ranges in flight commit, and the member ticks on."""
    state = member.load()
    assert state is not None
    launches = inflight_launches(state, member.member_id)
    assert launches and all(member.commit(report_of(launch)).accepted for launch in launches)
    member.tick()


@pytest.mark.kafka
def test_corrupted_bytes_in_a_sqlite_state_are_refused_untouched_and_restorable(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    member, report = _kafka_member(sqlite_url, kafka_bootstrap, kafka_topics)
    backup = _raw_body(sqlite_url, member.key)
    garbage = b"\x00\xff\xfe" + bytes(range(256)) * 4
    _set_row(sqlite_url, member.key, garbage)
    _refused_everywhere(member, report, StateFormatError, "not JSON", f"{sqlite_url} key {member.key!r}")
    assert _raw_body(sqlite_url, member.key) == garbage
    _set_row(sqlite_url, member.key, backup)  # the operator restores the object
    _resumes(member)


@pytest.mark.kafka
@pytest.mark.postgres
def test_a_foreign_json_object_in_postgresql_is_refused_untouched(
    kafka_bootstrap: str, kafka_topics: TopicFactory, postgres_url: str
) -> None:
    member, report = _kafka_member(postgres_url, kafka_bootstrap, kafka_topics)
    backup = _raw_body(postgres_url, member.key)
    foreign = json.dumps({"owner": "billing-service", "offsets": {"0": 17}})
    _set_row(postgres_url, member.key, foreign)
    shown = SqlStateStore(postgres_url).url
    assert "***" in shown
    _refused_everywhere(member, report, StateFormatError, r"not a dagster-streamgroup state \(kind=None\)", shown)
    assert _raw_body(postgres_url, member.key) == foreign
    _set_row(postgres_url, member.key, backup)
    _resumes(member)


@pytest.mark.kafka
def test_a_state_of_a_newer_schema_is_refused_until_this_member_is_upgraded(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    member, report = _kafka_member(sqlite_url, kafka_bootstrap, kafka_topics)
    topic = member.backend.shards()[0].rpartition(":")[0]
    shards = [f"{topic}:0", f"{topic}:1"]
    mirrored = member.backend.committed(member.group, shards)
    assert mirrored == dict.fromkeys(shards, 0), "the starting offsets were mirrored when the tick positioned them"
    backup = _raw_body(sqlite_url, member.key)
    newer = json.loads(backup) | {"schema_version": 99, "added_in_99": {"x": 1}}
    _set_row(sqlite_url, member.key, json.dumps(newer), schema_version=99)
    _refused_everywhere(member, report, NewerSchemaError, "schema 99.*upgrade this member", member.key)
    assert json.loads(_raw_body(sqlite_url, member.key)) == newer
    assert member.backend.committed(member.group, shards) == mirrored, "Kafka's group offsets untouched"
    _set_row(sqlite_url, member.key, backup, schema_version=json.loads(backup)["schema_version"])
    _resumes(member)


@pytest.mark.kafka
@pytest.mark.postgres
def test_a_state_with_fields_of_the_wrong_type_is_refused_untouched(
    kafka_bootstrap: str, kafka_topics: TopicFactory, postgres_url: str
) -> None:
    member, report = _kafka_member(postgres_url, kafka_bootstrap, kafka_topics)
    backup = _raw_body(postgres_url, member.key)
    broken = json.loads(backup)
    first = next(iter(broken["shards"]))
    broken["shards"][first]["committed"] = "a lot"
    _set_row(postgres_url, member.key, json.dumps(broken))
    _refused_everywhere(member, report, StateFormatError, "does not validate", member.key)
    assert json.loads(_raw_body(postgres_url, member.key)) == broken
    _set_row(postgres_url, member.key, backup)
    _resumes(member)


def _v3io_member(
    server: V3ioServerInfo, new_stream: NewStream, client: Any
) -> tuple[GroupMember, RangeReport, str, str]:
    backend = new_stream(1)
    path = backend.config.stream_path
    put(client, path, 0, [b"r"] * 5)
    store = V3ioStateStore(V3ioConnection(endpoint=server.endpoint, container=CONTAINER, access_key=server.access_key))
    member, report = _with_one_range_in_flight(member_of(store, backend, "cg"))
    return member, report, path, "cg-state.json"


def _item(client: Any, path: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = client.kv.get(CONTAINER, path, name, attribute_names=["**"]).output.item
    return found


@pytest.mark.v3io
def test_a_truncated_state_write_in_the_v3io_store_is_refused_untouched(
    v3io_server: V3ioServerInfo, new_stream: NewStream, v3io_client: Any
) -> None:
    member, report, path, name = _v3io_member(v3io_server, new_stream, v3io_client)
    whole = _item(v3io_client, path, name)[STATE]
    v3io_client.kv.update(CONTAINER, path, name, attributes={STATE: whole[: len(whole) // 2]})
    before = _item(v3io_client, path, name)
    _refused_everywhere(member, report, StateFormatError, "not JSON", f"{path}/{name}")
    assert _item(v3io_client, path, name) == before, "not even its mtime moved"
    v3io_client.kv.update(CONTAINER, path, name, attributes={STATE: whole})
    _resumes(member)


@pytest.mark.v3io
def test_a_multi_part_state_missing_a_part_is_refused_untouched(
    v3io_server: V3ioServerInfo, new_stream: NewStream, v3io_client: Any
) -> None:
    """A state larger than one attribute is written in parts within one item; an item that says it has three
    parts but lacks one (a write cut short by a tool that copies attributes one by one) is not read as a
    shorter state."""
    member, report, path, name = _v3io_member(v3io_server, new_stream, v3io_client)
    whole = _item(v3io_client, path, name)[STATE]
    v3io_client.kv.update(CONTAINER, path, name, attributes={STATE: whole[:40], f"{STATE}_1": whole[40:], PARTS: 3})
    before = _item(v3io_client, path, name)
    _refused_everywhere(member, report, StateFormatError, "attribute state_2 of the 3-part state is missing", name)
    assert _item(v3io_client, path, name) == before
    v3io_client.kv.update(
        CONTAINER, path, name, attributes={STATE: whole, PARTS: 1}, update_mode="CreateOrReplaceAttributes"
    )
    v3io_client.kv.update(CONTAINER, path, name, expression=f"REMOVE {STATE}_1")
    _resumes(member)


@pytest.mark.kafka
def test_status_of_an_unreadable_state_prints_the_reason_without_a_traceback(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str, tmp_path: Path
) -> None:
    topic = kafka_topics(1)
    produce_sample(kafka_bootstrap, topic, 1, 10)
    group = unique_name("g")
    definitions = tmp_path / "definitions.py"
    definitions.write_text(
        "import dagster as dg\n"
        "from dagster_streamgroup.dagster import KafkaStreamGroup, stream_asset\n"
        f"@stream_asset(group={group!r}, name='events')\n"
        "def events(context, df):\n"
        "    return None\n"
        "defs = dg.Definitions(assets=[events], resources={'streamgroup': KafkaStreamGroup(\n"
        f"    group={group!r}, bootstrap_servers={kafka_bootstrap!r}, topics=[{topic!r}], store_url={sqlite_url!r},\n"
        "    heartbeat_interval_s=1, join_grace_s=0, min_backlog=1, max_wait_s=0)})\n"
    )
    member = member_of(SqlStateStore(sqlite_url), kafka_backend(kafka_bootstrap, topic), group)
    member.tick()
    _set_row(sqlite_url, member.key, "{truncated")
    result = CliRunner().invoke(main, ["status", "--group", group, "--definitions", str(definitions)])
    assert result.exit_code == 1, result.output
    assert "not JSON" in result.output and member.key in result.output
    assert "Traceback" not in result.output
    assert _raw_body(sqlite_url, member.key) == "{truncated"
