"""MemberRunCoordinator with a real instance, code server and fork launcher, and no daemon: a run the coordinator
queues stays QUEUED, so a run that starts was launched at submit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from dagster_streamgroup import patches
from dagster_streamgroup.coordinator import MemberRunCoordinator
from dagster_streamgroup.dagster import tags as sgt
from tests.launcher.helpers import Deployment, copy_location, instance_yaml, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
LIMITS = [{"key": sgt.TAG_SHARD, "value": {"applyLimitPerUniqueValue": True}, "limit": 1}]


def coordinator(max_concurrent_runs: int) -> dict[str, object]:
    return {
        "module": "dagster_streamgroup.coordinator",
        "class": "MemberRunCoordinator",
        "config": {"max_concurrent_runs": max_concurrent_runs, "tag_concurrency_limits": LIMITS},
    }


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    location = copy_location(tmp_path / "location")
    deployment = Deployment(tmp_path / "home", location, instance_yaml(coordinator=coordinator(2)))
    yield deployment
    deployment.close()


def member_tags(release: Path, **more: str) -> dict[str, str]:
    return {sgt.TAG_MEMBER: "reader@test", "release": str(release), **more}


def test_member_runs_launch_at_submit_and_others_queue(deployment: Deployment, tmp_path: Path) -> None:
    assert isinstance(deployment.instance.run_coordinator, MemberRunCoordinator)
    member = deployment.launch("quick_job", {sgt.TAG_MEMBER: "reader@test"})
    assert deployment.run(member).status != dg.DagsterRunStatus.QUEUED
    assert deployment.wait(member, FINISHED).status == dg.DagsterRunStatus.SUCCESS
    other = deployment.launch("quick_job")
    assert deployment.run(other).status == dg.DagsterRunStatus.QUEUED, "not a member run: the daemon launches it"


def test_on_a_dagster_release_not_verified_member_runs_queue_like_any_other(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launch at submit reads Dagster's internals: on a release it was not verified on, it stays off and the
    coordinator is Dagster's ``QueuedRunCoordinator``."""
    monkeypatch.setattr(patches, "dagster_version", lambda: "1.13.99")
    monkeypatch.setattr(patches, "_warned", set())
    member = deployment.launch("quick_job", {sgt.TAG_MEMBER: "reader@test"})
    assert deployment.run(member).status == dg.DagsterRunStatus.QUEUED, "the daemon launches it"


def test_a_member_run_queues_behind_a_shard_limit_or_a_full_instance(deployment: Deployment, tmp_path: Path) -> None:
    holding = deployment.launch("wait_job", member_tags(tmp_path / "release-a", **{sgt.TAG_SHARD: "t:0"}))
    wait_until("the holding run's step to start", Path(f"{tmp_path / 'release-a'}.started").exists, 60)
    same_shard = deployment.launch("quick_job", {sgt.TAG_MEMBER: "reader@test", sgt.TAG_SHARD: "t:0"})
    assert deployment.run(same_shard).status == dg.DagsterRunStatus.QUEUED, "a backfill of t:0 holds it back"
    other_shard = deployment.launch("wait_job", member_tags(tmp_path / "release-b", **{sgt.TAG_SHARD: "t:1"}))
    assert deployment.run(other_shard).status != dg.DagsterRunStatus.QUEUED
    wait_until("the second run's step to start", Path(f"{tmp_path / 'release-b'}.started").exists, 60)
    full = deployment.launch("quick_job", {sgt.TAG_MEMBER: "reader@test"})
    assert deployment.run(full).status == dg.DagsterRunStatus.QUEUED, "max_concurrent_runs 2 are in progress"
    for name in ("release-a", "release-b"):
        (tmp_path / name).touch()
    for run_id in (holding, other_shard):
        assert deployment.wait(run_id, FINISHED).status == dg.DagsterRunStatus.SUCCESS
    after = deployment.launch("quick_job", {sgt.TAG_MEMBER: "reader@test"})
    assert deployment.run(after).status != dg.DagsterRunStatus.QUEUED, "room again: launched at submit"
    assert deployment.wait(after, FINISHED).status == dg.DagsterRunStatus.SUCCESS
