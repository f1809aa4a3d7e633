"""The chaos run in its short setting: the real deployment (``dagster dev`` with its daemon and webserver, the
local broker on durable storage, PostgreSQL, Spark Connect) consumes 50,000 records over 8 partitions while 10
seeded faults hit it (run processes killed before and after their commit, restarts of the daemon, PostgreSQL,
the broker and the code server, stopped sensors, paused runs and a zombie, poison parked and unparked, CAS
hammering). Every planned fault must land, without an error of the driver. What the stream function recorded
(offsets and payload hashes, tied to the run that committed each range), what the producer was acknowledged,
Dagster's materializations and runs and the sampled offsets must show nothing lost, nothing committed twice,
overlapping or unread, no offset going back, no park without poison, the zombie's commit refused, and Kafka's
group offsets never behind the state's for longer than their bound plus its margin.

``python -m bench.chaos`` is the long setting (1,000,000 records, 16 partitions, 30 faults)."""

from __future__ import annotations

import json

import pytest

from bench.chaos.faults import plan
from bench.chaos.run import ChaosOptions, run_chaos
from dagster_streamgroup.local.postgres import PostgresNotFoundError, find_server_binaries
from tests.fixtures.required import missing

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.postgres, pytest.mark.timeout(1200)]

SHORT = ChaosOptions(messages=50_000, partitions=8, faults=10, seed=4, timeout_s=900.0, max_records_per_run=50_000)


def test_the_short_plan_holds_the_run_kills_poison_and_a_zombie() -> None:
    kinds = set(plan(SHORT.faults, SHORT.seed, SHORT.kinds))
    assert {"run_kill_before_commit", "run_kill_after_commit", "poison", "run_pause_zombie", "daemon_restart"} <= kinds


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
    assert result["processed_records"] >= result["messages"]
    if result["faults"].get("run_pause_zombie"):  # the zombie's commit, after its shards moved on, was refused
        assert len(result["zombies"]) == result["faults"]["run_pause_zombie"]
        assert all(z["status"] == "FAILURE" and z["cause"] == "commit_refused" for z in result["zombies"]), result
    if result["faults"].get("run_kill_after_commit"):  # committed, killed before Dagster recorded it: repaired
        assert result["repaired_materializations"] >= 1
    if result["faults"].get("poison"):  # retried, parked, then resumed by `streamgroup unpark` and committed
        assert result["parked_resolved"] >= 1  # a producer retry after a broker restart may repeat one
        assert result["parks"] >= 1
    assert result["kafka_behind_state_max_s"] <= result["kafka_behind_state_limit_s"]
    assert result["failures"] == [] and result["passed"]
