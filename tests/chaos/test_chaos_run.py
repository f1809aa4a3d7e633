"""The chaos run in its short setting: the real deployment (``dagster dev`` with its daemon and webserver, the
local broker on durable storage, PostgreSQL, Spark Connect, and two groups in one code location) consumes 50,000
records over 8 partitions while 12 seeded faults hit it (run processes killed before and after their commit,
restarts of the daemon, PostgreSQL and the broker, a stopped sensor, a zombie, poison parked and unparked, a
launcher outage, a state write held while the store folds past it, a member removed for good, a burst into the
second group). Every planned fault must land, without an error of the driver. What the stream function recorded
(offsets and payload hashes, tied to the run that committed each range), what the producer was acknowledged,
Dagster's materializations and runs and the sampled offsets must show, for both groups, nothing lost, nothing
committed twice, overlapping or unread, no offset going back, no park without poison or for a refused launch, no
committed run left unconfirmed, the zombie's commit refused, and Kafka's group offsets never behind the state's
for longer than their bound plus its margin. The main group's runs also commit their records into a Delta table
and a Kafka topic (``--sinks``), before their state commit: each must hold every record once.

``python -m bench.chaos --sinks`` is the long setting (1,000,000 records, 16 partitions, 30 faults)."""

from __future__ import annotations

import json

import pytest

from bench.chaos.faults import plan
from bench.chaos.run import ChaosOptions, run_chaos
from dagster_streamgroup.local.postgres import PostgresNotFoundError, find_server_binaries
from tests.fixtures.required import missing

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.postgres, pytest.mark.timeout(1500)]

SHORT = ChaosOptions(
    messages=50_000, partitions=8, faults=12, seed=70, timeout_s=1000.0, max_records_per_run=50_000, sinks=True
)
"""Seed 70 draws 12 of the 16 kinds, among them every one named below."""


def test_the_short_plan_holds_the_run_kills_poison_a_zombie_and_the_new_kinds() -> None:
    kinds = set(plan(SHORT.faults, SHORT.seed, SHORT.kinds))
    assert {"run_kill_before_commit", "run_kill_after_commit", "poison", "run_pause_zombie", "daemon_restart"} <= kinds
    assert {"launcher_outage", "store_writer_pause", "member_removed", "two_groups"} <= kinds


def test_chaos_short_setting_loses_nothing_and_commits_nothing_twice() -> None:
    try:
        find_server_binaries()
    except PostgresNotFoundError as exc:
        missing("postgres", f"PostgreSQL server binaries not found (Debian's postgresql package): {exc}")
    result = run_chaos(SHORT)
    print(json.dumps(result))
    assert result.get("error") is None, result
    assert result["messages"] >= SHORT.messages
    # Every planned fault landed: a fault that found nothing to act on, or whose action raised, is a failure.
    assert sum(result["faults"].values()) == SHORT.faults, (result["faults"], result["faults_missed"])
    assert result["faults_missed"] == {} and result["faults_skipped_out_of_time"] == {}, result["errors"]
    assert result["errors"] == []
    assert result["drain_s"] is not None
    assert result["lost"] == 0, result["details"]
    assert result["unattributed_commits"] == 0, result["details"]
    assert result["unacknowledged_seen"] == 0, result["details"]
    assert result["broker_lost_acknowledged"] == 0
    assert result["overlapping_commits"] == 0, result["details"]
    assert result["duplicate_materializations"] == 0, result["details"]
    assert result["backwards"] == 0, result["details"]
    assert result["unexplained_parks"] == 0, result["details"]
    assert result["refused_launch_parks"] == 0, result["details"]
    assert result["unrecorded_runs_left"] == 0, result["details"]
    assert result["processed_records"] >= result["messages"]
    second = result["second_group"]  # the second group of the code location, by the same rules
    assert second["messages"] > 0 and second["processed_records"] >= second["messages"], second
    for count in ("lost", "overlapping_commits", "duplicate_materializations", "backwards"):
        assert second[count] == 0, second
    assert second["unrecorded_runs_left"] == 0 and second["unexplained_parks"] == 0, second
    if result["faults"].get("launcher_outage"):  # refused launches were relaunched, not counted as attempts
        assert result["launches_refused"] >= 1
        assert result["failed_runs_by_cause"].get("launch_refused", 0) >= 1, result["failed_runs_by_cause"]
    if result["faults"].get("member_removed"):
        assert len(result["members_removed"]) == 1
    if result["faults"].get("run_pause_zombie"):  # the zombie's commit, after its shards moved on, was refused
        assert len(result["zombies"]) == result["faults"]["run_pause_zombie"]
        assert all(z["status"] == "FAILURE" and z["cause"] == "commit_refused" for z in result["zombies"]), result
    if result["faults"].get("run_kill_after_commit"):  # committed, killed before Dagster recorded it: repaired
        assert result["repaired_materializations"] >= 1
    for sink in ("delta", "kafka"):  # the runs' records in the Delta table and the output topic: each once
        found = result["sinks"][sink]
        assert (found["lost"], found["doubled"], found["extra"]) == (0, 0, 0), (sink, found)
        assert found["entries"] == found["records"] > 0, (sink, found)
    if result["faults"].get("poison"):  # retried, parked, then resumed by `streamgroup unpark` and committed
        assert result["parked_resolved"] >= 1  # a producer retry after a broker restart may repeat one
        assert result["parks"] >= 1
    assert result["kafka_behind_state_max_s"] <= result["kafka_behind_state_limit_s"]
    assert result["failures"] == [] and result["passed"]
