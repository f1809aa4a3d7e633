"""The topic-lifecycle run in its short setting: a group of three members drains 20,000 records while its topics are
deleted and recreated (with fewer and more partitions, and missing for longer than a session timeout), a topic is
added to and removed from the members' lists one member after another, records are deleted, Kafka's own
consumer-groups tool resets the group's offsets and the state store is lost, one operation of each kind. Every
record each topic version held must be read exactly once by a committed run, or named by an event; the tool's reset
must be refused and Kafka's offsets restored; the backlog must drain.

``python -m bench.lifecycle`` is the long setting (200,000 records, 20 operations)."""

from __future__ import annotations

import json

import pytest

from bench.lifecycle.run import KINDS, parse, plan, run_lifecycle

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(900)]

COMMAND = "python -m bench.lifecycle --records 20000 --operations 8 --rate 500 --timeout 600"
"""The short setting as docs/reliability.md shows it."""
SHORT = parse(COMMAND.split()[3:])


def test_the_short_setting_reads_every_record_of_every_topic_version_once_or_names_it() -> None:
    assert SHORT.operations == len(KINDS) and set(plan(SHORT.operations, SHORT.seed)) == set(KINDS), "one of each kind"
    result = run_lifecycle(SHORT)
    print(json.dumps(result))
    assert result["failures"] == [], result
    assert result["passed"] is True
    assert result["operations_by_kind"] == dict.fromkeys(sorted(KINDS), 1)
    assert result["records"] >= 0.95 * SHORT.records and result["acknowledged"] == result["records"]
    assert result["lost"] == 0 and result["duplicates"] == 0 and result["payload_mismatches"] == 0
    assert result["read"] + sum(result["reported_unread"].values()) == result["acknowledged"]
    assert result["tool_resets"].get("unrefused", 0) == 0 and sum(result["tool_resets"].values()) == 1
    assert result["events"].get("recreated", 0) >= 3, "three recreations, each named per shard"
    assert result["events"].get("removed", 0) >= 1 and result["events"].get("missing", 0) >= 1
