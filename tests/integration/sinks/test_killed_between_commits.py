"""A run killed between its sink commit and its state commit, with the real group member (SQLite state, the local
broker's watermarks) and a real process killed with SIGKILL at that point.

The run's process commits its rows into the sink, says so, and waits; the test kills it there. The group state
still holds the ranges in flight, uncommitted, so the member retries them with the same offsets (reported
failed, as the member reports a dead run's ranges), and the retry's sink commit must leave the output as one run
would have: the Delta table holds each record's row once (the retry's), and the Kafka topic each output record
once (the retry produces nothing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from dagster_streamgroup.dagster.resources import KafkaStreamGroup
from dagster_streamgroup.local.kafka_data import produce_sample
from dagster_streamgroup.protocol import Launch, report_of
from dagster_streamgroup.sinks import DeltaSink, KafkaTopicSink, SinkRun
from tests.dagster.helpers import group_name, group_resource
from tests.fixtures.kafka import TopicFactory
from tests.integration.sinks.test_kafka_sink import read_all

pytestmark = pytest.mark.kafka

CHILD = r"""
import json, sys, time
import pyarrow as pa
from dagster_streamgroup.sinks import DeltaSink, KafkaTopicSink, SinkRun
spec = json.loads(sys.argv[1])
sink = (DeltaSink if spec["kind"] == "delta" else KafkaTopicSink).model_validate(spec["sink"])
ranges = [type("R", (), r)() for r in spec["ranges"]]
result = sink.write(pa.Table.from_pylist(spec["rows"]), ranges, SinkRun(**spec["run"]))
print("sink committed", result.rows, flush=True)
time.sleep(600)  # the state commit would come here: the test kills the process first
"""


def rows_of(launches: list[Launch], tag: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for x in launches:
        topic, _, partition = x.shard.rpartition(":")
        out += [
            {"topic": topic, "partition": int(partition), "offset": o, "value": f"{tag}{o}".encode(), "attempt": tag}
            for o in range(x.start, x.end)
        ]
    return out


def kill_after_sink_commit(kind: str, sink: DeltaSink | KafkaTopicSink, launches: list[Launch], run: SinkRun) -> None:
    """The run's process: its sink commit, then SIGKILL before it could commit its ranges."""
    spec = {
        "kind": kind,
        "sink": sink.model_dump(mode="json"),
        "ranges": [{"shard": x.shard, "start": x.start, "end": x.end} for x in launches],
        "rows": [{**r, "value": r["value"].decode()} for r in rows_of(launches, "killed")],  # type: ignore[attr-defined]
        "run": {"group": run.group, "member": run.member, "run_key": run.run_key},
    }
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(spec)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    ) as child:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("sink committed"), line
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL


def retried_after_the_kill(resource: KafkaStreamGroup, member_id: str, launches: list[Launch]) -> list[Launch]:
    """The member reports the dead run's ranges failed and plans them again: the same offsets, a new attempt, each
    range in a run of its own."""
    member = resource.member(member_id)
    state = member.load()
    assert state is not None
    assert {s: state.shards[s].committed for s in (x.shard for x in launches)} == {x.shard: 0 for x in launches}, (
        "the killed run committed nothing into the group"
    )
    member.fail_run([report_of(x) for x in launches], "the run's process was killed (SIGKILL)")
    again = member.tick().inflight
    assert sorted((x.shard, x.start, x.end) for x in again) == sorted((x.shard, x.start, x.end) for x in launches)
    assert all(x.attempt == 1 for x in again)
    return again


def commit_state(resource: KafkaStreamGroup, member_id: str, launches: list[Launch]) -> None:
    outcome, _ = resource.member(member_id).commit_run_state_only([report_of(x) for x in launches])
    assert outcome.accepted


@pytest.mark.parametrize("kind", ["delta", "kafka"])
def test_a_run_killed_between_its_sink_commit_and_its_state_commit_leaves_the_output_as_one_run(
    kind: str, kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 60)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    member_id = "m1@test"
    launches = resource.member(member_id).tick().new_launches
    assert {x.shard for x in launches} == {f"{topic}:0", f"{topic}:1"}
    run = SinkRun(group=group, member=member_id, run_key=launches[0].run_key)
    sink: DeltaSink | KafkaTopicSink
    if kind == "delta":
        sink = DeltaSink(table=str(tmp_path / "table"))
    else:
        output = kafka_topics(partitions=2, prefix="out")
        sink = KafkaTopicSink(
            topic=output, bootstrap_servers=kafka_bootstrap, marker_group=f"{group}.out", key_column=None
        )
    kill_after_sink_commit(kind, sink, launches, run)
    again = retried_after_the_kill(resource, member_id, launches)
    retried = []
    for x in again:  # a failed range is retried in a run of its own
        retried.append(
            sink.write(pa.Table.from_pylist(rows_of([x], "retry")), [x], SinkRun(group, member_id, x.run_key))
        )
        commit_state(resource, member_id, [x])
    records = sum(x.end - x.start for x in launches)
    if isinstance(sink, DeltaSink):
        table = DeltaTable(sink.table).to_pyarrow_table()
        assert table.num_rows == records, "each record's row once"
        assert set(table.column("attempt").to_pylist()) == {"retry"}, "the retry replaced the killed run's rows"
        assert sink.table_offsets([x.shard for x in launches]) == {x.shard: x.end for x in launches}
    else:
        assert [(r.rows, r.skipped_ranges) for r in retried] == [(0, 1), (0, 1)], "the retries found the output out"
        got = read_all(kafka_bootstrap, sink.topic, 2)
        assert Counter(h for h, _ in got) == Counter(f"{x.shard}:{o}" for x in launches for o in range(x.start, x.end))
    state = resource.member(member_id).load()
    assert state is not None and all(state.shards[x.shard].committed == x.end for x in launches)
