"""``streamgroup status | unpark | backfill --dry-run`` over a real broker and store, through click (a backfill's launch
against a real webserver: tests/e2e/test_backfill.py)."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from click.testing import CliRunner
from dagster._core.test_utils import create_run_for_test

from dagster_streamgroup import protocol
from dagster_streamgroup.cli import main
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.local.kafka_data import produce_records, produce_sample
from tests.dagster.helpers import (
    SensorDriver,
    commit_ranges,
    counting_asset,
    group_name,
    group_resource,
    ranges_of_request,
    sensors_for,
)
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.kafka_tools import reset_with_kafkas_tool

pytestmark = pytest.mark.kafka

DEFINITIONS = """
import dagster as dg
from dagster_streamgroup.dagster import KafkaStreamGroup, stream_asset

@stream_asset(group={group!r}, name="events")
def events(context, df):
    return None

defs = dg.Definitions(
    assets=[events],
    resources={{"streamgroup": KafkaStreamGroup(group={group!r}, bootstrap_servers={bootstrap!r}, topics=[{topic!r}],
        store_url={store!r}, heartbeat_interval_s=1.0, join_grace_s=0.0, max_records_per_run=300, max_attempts=1)}},
)
"""


def cli_args(group: str, definitions: Path, shard: str) -> list[str]:
    return ["backfill", "--group", group, "--definitions", str(definitions), "--shard", shard, "--dry-run"]


def write_definitions(tmp_path: Path, group: str, bootstrap: str, topic: str) -> Path:
    path = tmp_path / "definitions.py"
    store = f"sqlite:///{tmp_path / 'state.db'}"
    path.write_text(DEFINITIONS.format(group=group, bootstrap=bootstrap, topic=topic, store=store))
    return path


def test_status_unpark_and_backfill_plan(kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path) -> None:
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 1000)
    group = group_name()
    definitions = write_definitions(tmp_path, group, kafka_bootstrap, topic)
    runner = CliRunner()
    empty = runner.invoke(main, ["status", "--group", group, "--definitions", str(definitions)])
    assert empty.exit_code == 0, empty.output
    assert "has no state yet" in empty.output

    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_attempts=1, run_mode="shard")
    sensor = sensors_for(counting_asset(group, []), members=1)[0]

    def request_of(requests: list[dg.RunRequest], shard: str) -> dg.RunRequest:
        return next(r for r in requests if ranges_of_request(r)[0][0] == shard)

    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensor, instance, resource)
        request = request_of(driver.requests(), f"{topic}:0")
        assert request.tags is not None
        create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.FAILURE,
            tags={**request.tags, "dagster/run_key": request.run_key or ""},
        )
        driver.tick()  # max_attempts=1: the failed range parks the shard

        status = runner.invoke(main, ["status", "--group", group, "--definitions", str(definitions)])
        assert status.exit_code == 0, status.output
        assert sensor.name in status.output
        assert f"{topic}:0" in status.output and f"{topic}:1" in status.output
        assert "[0, 300)" in status.output  # parked range (and the range in flight on the other shard)
        assert "parked" in status.output and "total lag: 1002 records" in status.output
        assert "seconds behind" in status.output

        as_json = runner.invoke(main, ["status", "--group", group, "--definitions", str(definitions), "--json"])
        assert as_json.exit_code == 0, as_json.output
        report = json.loads(as_json.output)
        assert report["group"] == group and report["state"]["total_lag"] == 1002
        members = report["state"]["members"]
        assert len(members) == 1 and members[0]["member"].startswith(sensor.name) and members[0]["shards"] == 2
        rows = {row["shard"]: row for row in report["state"]["shards"]}
        assert set(rows) == {f"{topic}:0", f"{topic}:1"}
        for row in rows.values():
            assert row["lag"] == 501 and row["committed"] == 0
            assert 0.0 < row["seconds_behind"] < 600.0  # the first record was written moments ago
        assert rows[f"{topic}:0"]["parked"].startswith("[0, 300)")
        assert report["state"]["max_seconds_behind"] == max(r["seconds_behind"] for r in rows.values())

        unparked = runner.invoke(
            main, ["unpark", "--group", group, "--definitions", str(definitions), "--shard", f"{topic}:0"]
        )
        assert unparked.exit_code == 0 and "unparked" in unparked.output
        state = resource.member("reader").load()
        assert state is not None and state.shards[f"{topic}:0"].parked is None
        again = runner.invoke(
            main, ["unpark", "--group", group, "--definitions", str(definitions), "--shard", f"{topic}:0"]
        )
        assert "was not parked" in again.output

        # the sensor retries the parked range under a new run key: the failed run's key is not seen as its
        # outcome (which would park the shard again), and the daemon would skip a reused key
        retry = request_of(driver.requests(), f"{topic}:0")
        assert retry.tags is not None and retry.run_key != request.run_key
        assert ranges_of_request(retry) == [(f"{topic}:0", 0, 300)]
        driver.tick()
        state = resource.member("reader").load()
        assert state is not None and state.shards[f"{topic}:0"].parked is None
        assert state.shards[f"{topic}:0"].inflight is not None

    # Shard 1's range is in flight, nothing of it is committed: a backfill would write its records twice.
    ahead = runner.invoke(main, [*cli_args(group, definitions, f"{topic}:1"), "--from", "100", "--to", "450"])
    assert ahead.exit_code == 2, ahead.output
    assert "not committed yet (the group's committed offset is 0)" in ahead.output


def test_backfill_plan_follows_the_committed_ranges_and_stops_at_the_committed_offset(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 999)  # 1000 records
    group = group_name()
    definitions = write_definitions(tmp_path, group, kafka_bootstrap, topic)
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=300)
    shard = f"{topic}:0"
    assert commit_ranges(resource, "reader", runs=3) == [(shard, 0, 300), (shard, 300, 600), (shard, 600, 900)]
    runner = CliRunner()

    plan = runner.invoke(main, [*cli_args(group, definitions, shard), "--from", "350", "--to", "1000"])
    assert plan.exit_code == 0, plan.output
    assert plan.stdout.splitlines() == [f"{shard} [300, 600)", f"{shard} [600, 900)"]
    assert "past the group's committed offset 900: the backfill stops there" in plan.stderr
    assert "the backfill covers [300, 900), whole ranges" in plan.stderr
    assert (
        f"plan: {shard} [300, 900): 2 committed range(s), 600 records, 2 wave(s) of at most 300 records" in plan.stderr
    )

    pieces = runner.invoke(
        main, [*cli_args(group, definitions, shard), "--from", "100", "--to", "450", "--chunk", "200", "--no-align"]
    )
    assert pieces.exit_code == 0, pieces.output
    assert pieces.stdout.splitlines() == [f"{shard} [100, 300)", f"{shard} [300, 450)"]

    launch = runner.invoke(
        main,
        [*cli_args(group, definitions, shard)[:-1], "--from", "0", "--to", "10", "--dagster-url", "http://127.0.0.1:1"],
    )
    assert launch.exit_code == 2 and "cannot reach the Dagster webserver" in launch.output, launch.output


def test_index_ranges_records_the_history_committed_before_the_index(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """The upgrade step: ranges committed by an earlier version are only in Dagster's materializations."""
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 999)
    group = group_name()
    definitions = write_definitions(tmp_path, group, kafka_bootstrap, topic)
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=300)
    shard = f"{topic}:0"
    committed = commit_ranges(resource, "reader", runs=3, record=False)
    runner = CliRunner()
    args = [*cli_args(group, definitions, shard), "--from", "0", "--to", "900", "--chunk", "1000"]
    before = runner.invoke(main, args)
    assert before.stdout.splitlines() == [f"{shard} [0, 900)"] and "no committed range is recorded" in before.stderr
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(sgt.partitions_def_name(group), [shard])
        for _, start, end in committed:  # as the earlier version's runs recorded them, beside a backfill of theirs
            meta = {"start": start, "end": end, "committed": end, "records": end - start}
            instance.report_runless_asset_event(dg.AssetMaterialization("events", partition=shard, metadata=meta))
        old_backfill = {"start": 100, "end": 700, "backfill": True}
        instance.report_runless_asset_event(dg.AssetMaterialization("events", partition=shard, metadata=old_backfill))
        indexed = runner.invoke(main, ["index-ranges", "--group", group, "--definitions", str(definitions)])
    assert indexed.exit_code == 0, indexed.output
    assert indexed.stdout.splitlines() == [f"{shard}: 3 committed range(s) recorded"]
    after = runner.invoke(main, args)
    assert after.stdout.splitlines() == [f"{shard} [0, 300)", f"{shard} [300, 600)", f"{shard} [600, 900)"]


def test_backfill_by_time_uses_offset_for_time(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topics(partitions=1)
    marks = []
    for values in ([b"a", b"b"], [b"c", b"d"], [b"e"]):
        marks.append(int(time.time() * 1000))  # the local broker looks times up by write time: space them out
        produce_records(kafka_bootstrap, topic, 0, values)
        time.sleep(1.2)
    group = group_name()
    definitions = write_definitions(tmp_path, group, kafka_bootstrap, topic)
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=300)
    assert commit_ranges(resource, "reader", runs=1) == [(f"{topic}:0", 0, 5)]
    since = str(marks[1])
    until = dt.datetime.fromtimestamp(marks[2] / 1000, dt.UTC).isoformat()
    args = [*cli_args(group, definitions, f"{topic}:0"), "--since", since, "--until", until]
    plan = CliRunner().invoke(main, [*args, "--no-align"])
    assert plan.exit_code == 0, plan.output
    assert plan.stdout.splitlines() == [f"{topic}:0 [2, 4)"]
    aligned = CliRunner().invoke(main, args)
    assert aligned.stdout.splitlines() == [f"{topic}:0 [0, 5)"], "[2, 4) lies in the committed range [0, 5)"
    future = dt.datetime.fromtimestamp(time.time() + 3600, dt.UTC).isoformat()
    later = CliRunner().invoke(main, [*args[:-2], "--until", future])
    assert later.exit_code == 2 and "is in the future" in later.output, later.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--group", "nope", "--shard", "x:0", "--from", "0", "--to", "1"], "no group 'nope'"),
        (["--shard", "x:0", "--from", "5", "--to", "1"], "--from/--to"),
        (["--shard", "x:0", "--from", "5"], "--to OFFSET or --until TIME"),
        (["--shard", "x:0", "--since", "yesterday", "--to", "3"], "neither epoch milliseconds nor an ISO 8601"),
        (["--shard", "x:0", "--from", "0", "--to", "3"], "--shard: x:0 is not a shard of the stream"),
        (["--shard", "{topic}:0", "--from", "0", "--to", "500"], "--to: the range ends at offset 500, past the end"),
        (["--shard", "{topic}:0", "--from", "0", "--to", "5", "--chunk", "0"], "must be >= 1, got 0"),
        (["--shard", "{topic}:0", "--from", "0", "--to", "5"], "the group has committed nothing of"),
    ],
)
def test_backfill_errors_name_the_option(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, args: list[str], message: str
) -> None:
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 100)
    group = group_name()
    definitions = write_definitions(tmp_path, group, kafka_bootstrap, topic)
    base = ["backfill", "--definitions", str(definitions), "--dry-run"]
    if "--group" not in args:
        base += ["--group", group]
    result = CliRunner().invoke(main, base + [arg.format(topic=topic) for arg in args])
    assert result.exit_code != 0
    assert message in result.output


def test_stream_errors_end_the_command_with_their_message(tmp_path: Path) -> None:
    """No traceback: the stream's error already says what failed."""
    group = group_name()
    definitions = write_definitions(tmp_path, group, "127.0.0.1:1", "clicks")
    result = CliRunner().invoke(
        main,
        [
            "backfill",
            "--group",
            group,
            "--definitions",
            str(definitions),
            "--shard",
            "clicks:0",
            "--from",
            "0",
            "--to",
            "5",
            "--dry-run",
        ],
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith("Error: "), result.output


def test_definitions_import_the_packages_beside_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As with `dagster dev -f`, a project's definitions file may import its own packages from its directory,
    wherever the CLI is started."""
    package = tmp_path / "project_helpers_for_cli"
    package.mkdir()
    (package / "__init__.py").write_text("GROUP = 'beside'\n")
    definitions = tmp_path / "definitions.py"
    definitions.write_text("import dagster as dg\nimport project_helpers_for_cli\ndefs = dg.Definitions()\n")
    monkeypatch.chdir("/")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    result = CliRunner().invoke(main, ["status", "--group", "beside", "--definitions", str(definitions)])
    assert "no group 'beside' in these definitions" in result.output, result.output


def test_reset_moves_the_group_through_its_state_fences_the_run_in_flight_and_restores_kafkas_offsets(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """``streamgroup reset`` is the supported way to move a group: through the group state (an event per shard, the
    run in flight refused as ``reset``), then Kafka's group offsets. A reset made with Kafka's own tool is shown
    by ``status`` as a warning, and refused and restored by the next member tick."""

    topic = kafka_topics(partitions=2)
    ends = produce_sample(kafka_bootstrap, topic, 2, 1000)
    group = group_name()
    definitions = write_definitions(tmp_path, group, kafka_bootstrap, topic)
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    member = resource.member("m0")
    member.tick()
    state = member.load()
    assert state is not None
    first = protocol.inflight_launches(state, "m0")
    assert member.commit_run([protocol.report_of(x) for x in first]).accepted
    member.tick()
    state = member.load()
    assert state is not None
    in_flight = protocol.inflight_launches(state, "m0")
    committed = {x.shard: x.start for x in in_flight}
    runner = CliRunner()

    def reset(*args: str) -> Any:
        return runner.invoke(main, ["reset", "--group", group, "--definitions", str(definitions), *args])

    plan = reset("--to-earliest", "--dry-run")
    assert plan.exit_code == 0, plan.output
    for shard, at in committed.items():
        assert f"{shard}: {at} -> 0 ([0, {at}) read again; the log holds [0, {ends[int(shard[-1])]}))" in plan.output
    assert "dry run: 2 shard(s) would move; nothing was changed" in plan.output
    assert member.load() == state, "a dry run writes nothing"

    moved = reset("--shard", f"{topic}:0=400", "--shard", f"{topic}:1", "--to-latest")
    assert moved.exit_code == 0, moved.output
    assert f"{topic}:0: {committed[f'{topic}:0']} -> 400 ([{committed[f'{topic}:0']}, 400) skipped" in moved.output
    assert f"{topic}:1: {committed[f'{topic}:1']} -> {ends[1]} (" in moved.output
    after = member.load()
    assert after is not None
    assert {s: after.shards[s].committed for s in committed} == {f"{topic}:0": 400, f"{topic}:1": ends[1]}
    events = [e for e in after.events if e.kind == "reset"]
    assert sorted((str(e.shard), e.start, e.end) for e in events) == [
        (f"{topic}:0", committed[f"{topic}:0"], 400),
        (f"{topic}:1", committed[f"{topic}:1"], ends[1]),
    ]
    assert all("fenced" in e.detail for e in events)
    refused = member.commit_run([protocol.report_of(x) for x in in_flight])
    assert not refused.accepted and {o.refusal for o in refused.refusals.values()} == {"reset"}
    backend = resource.backend()
    assert backend.committed(group, list(committed)) == {f"{topic}:0": 400, f"{topic}:1": ends[1]}

    each = reset("--shard", f"{topic}:0=400", "--shard", f"{topic}:1={ends[1]}")
    assert each.exit_code == 0 and each.output.count("(unchanged;") == 2, each.output

    back = reset("--shard", f"{topic}:1", "--to-offset", "10")
    assert back.exit_code == 0 and f"[10, {ends[1]}) read again" in back.output
    since = reset("--shard", f"{topic}:1", "--to-datetime", "1970-01-01T00:00:00")
    assert since.exit_code == 0 and f"{topic}:1: 10 -> 0 ([0, 10) read again" in since.output

    past = reset("--shard", f"{topic}:0", "--to-offset", "999999")
    assert past.exit_code == 2 and f"offset 999999 of {topic}:0 is past its end ({ends[0]})" in past.output
    unnamed = reset("--to-offset", "5")
    assert unnamed.exit_code == 2 and "name them" in unnamed.output
    unknown = reset("--shard", "nope:0=1")
    assert unknown.exit_code == 2 and "nope:0 not a shard of group" in unknown.output

    reset_with_kafkas_tool(kafka_bootstrap, group, topic, "--to-offset", "7")
    status = runner.invoke(main, ["status", "--group", group, "--definitions", str(definitions)])
    assert status.exit_code == 0, status.output
    assert "WARNING" in status.output and "streamgroup reset" in status.output
    report = member.tick()
    assert {e.shard for e in report.new_events if e.kind == "reset_refused"} == {f"{topic}:0", f"{topic}:1"}
    assert backend.committed(group, list(committed)) == {f"{topic}:0": 400, f"{topic}:1": 0}
    quiet = runner.invoke(main, ["status", "--group", group, "--definitions", str(definitions)])
    assert "WARNING" not in quiet.output
