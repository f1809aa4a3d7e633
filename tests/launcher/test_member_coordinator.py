"""MemberRunCoordinator with a real instance, code server and fork launcher, and no daemon: a run the coordinator
queues stays QUEUED, so a run that starts was launched at submit."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dagster_streamgroup import patches
from dagster_streamgroup.coordinator import MemberRunCoordinator
from dagster_streamgroup.dagster import tags as sgt
from tests.launcher.helpers import FINISHED, Deployment, copy_location, instance_yaml, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

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


def test_a_member_run_queues_on_a_full_instance_and_behind_a_queued_run(deployment: Deployment, tmp_path: Path) -> None:
    holding = deployment.launch("wait_job", member_tags(tmp_path / "release-a", **{sgt.TAG_SHARD: "t:0"}))
    wait_until("the holding run's step to start", Path(f"{tmp_path / 'release-a'}.started").exists, 60)
    other_shard = deployment.launch("wait_job", member_tags(tmp_path / "release-b", **{sgt.TAG_SHARD: "t:1"}))
    assert deployment.run(other_shard).status != dg.DagsterRunStatus.QUEUED
    wait_until("the second run's step to start", Path(f"{tmp_path / 'release-b'}.started").exists, 60)
    full = deployment.launch("quick_job", {sgt.TAG_MEMBER: "reader@test"})
    assert deployment.run(full).status == dg.DagsterRunStatus.QUEUED, "max_concurrent_runs 2 are in progress"
    for name in ("release-a", "release-b"):
        (tmp_path / name).touch()
    for run_id in (holding, other_shard):
        assert deployment.wait(run_id, FINISHED).status == dg.DagsterRunStatus.SUCCESS
    behind = deployment.launch("quick_job", {sgt.TAG_MEMBER: "reader@test"})
    assert deployment.run(behind).status == dg.DagsterRunStatus.QUEUED, "room again, but a run is queued ahead"
    for run_id in (full, behind):  # no daemon here to launch them
        deployment.instance.delete_run(run_id)
    after = deployment.launch("quick_job", {sgt.TAG_MEMBER: "reader@test"})
    assert deployment.run(after).status != dg.DagsterRunStatus.QUEUED, "room and nothing queued: launched at submit"
    assert deployment.wait(after, FINISHED).status == dg.DagsterRunStatus.SUCCESS


def new_deployment(tmp_path: Path, **settings: Any) -> Deployment:
    return Deployment(tmp_path / "home", copy_location(tmp_path / "location"), instance_yaml(**settings))


PLAIN = {"module": "dagster_streamgroup.coordinator", "class": "MemberRunCoordinator"}
"""The coordinator with no limits of its own: the instance's ``concurrency:`` block sets them."""


def test_the_instance_concurrency_block_holds_member_runs(tmp_path: Path) -> None:
    """``concurrency: runs: max_concurrent_runs: 0`` is Dagster's way to stop every launch: member runs too."""
    stopped = new_deployment(
        tmp_path / "a", coordinator=PLAIN, extra={"concurrency": {"runs": {"max_concurrent_runs": 0}}}
    )
    try:
        member = stopped.launch("quick_job", {sgt.TAG_MEMBER: "reader@test"})
        assert stopped.run(member).status == dg.DagsterRunStatus.QUEUED
    finally:
        stopped.close()

    limits = {"concurrency": {"runs": {"max_concurrent_runs": 5, "tag_concurrency_limits": LIMITS}}}
    limited = new_deployment(tmp_path / "b", coordinator=PLAIN, extra=limits)
    try:
        holding = limited.launch("wait_job", member_tags(tmp_path / "release", **{sgt.TAG_SHARD: "t:0"}))
        assert limited.run(holding).status != dg.DagsterRunStatus.QUEUED
        same_shard = limited.launch("quick_job", {sgt.TAG_MEMBER: "reader@test", sgt.TAG_SHARD: "t:0"})
        assert limited.run(same_shard).status == dg.DagsterRunStatus.QUEUED, "the per-shard limit of concurrency:"
        # A queued run goes first: with one QUEUED, a member run that no limit holds back queues behind it.
        behind = limited.launch("quick_job", {sgt.TAG_MEMBER: "reader@test", sgt.TAG_SHARD: "t:1"})
        assert limited.run(behind).status == dg.DagsterRunStatus.QUEUED, "never overtakes the queue"
        (tmp_path / "release").touch()
        assert limited.wait(holding, FINISHED).status == dg.DagsterRunStatus.SUCCESS
    finally:
        limited.close()


def test_a_member_run_whose_pool_has_no_free_slot_queues(tmp_path: Path) -> None:
    """Pools blocking at run granularity (``concurrency: pools: granularity: run``): a member run whose op's pool
    has its one slot taken by a run in progress queues, as the queue daemon would keep it."""
    settings = {"concurrency": {"pools": {"granularity": "run"}, "runs": {"max_concurrent_runs": 5}}}
    deployment = new_deployment(tmp_path, coordinator=PLAIN, extra=settings)
    try:
        deployment.instance.event_log_storage.set_concurrency_slots("streamgroup-test-pool", 1)
        holding = deployment.launch("pooled_wait_job", member_tags(tmp_path / "release"))
        assert deployment.run(holding).status != dg.DagsterRunStatus.QUEUED, "the pool's slot was free"
        wait_until("the holding run's step to start", Path(f"{tmp_path / 'release'}.started").exists, 60)
        blocked = deployment.launch("pooled_quick_job", {sgt.TAG_MEMBER: "reader@test"})
        assert deployment.run(blocked).status == dg.DagsterRunStatus.QUEUED, "the pool's one slot is taken"
        (tmp_path / "release").touch()
        assert deployment.wait(holding, FINISHED).status == dg.DagsterRunStatus.SUCCESS
        deployment.instance.delete_run(blocked)  # no daemon here to launch it
        free = deployment.launch("pooled_quick_job", {sgt.TAG_MEMBER: "reader@test"})
        assert deployment.run(free).status != dg.DagsterRunStatus.QUEUED, "the slot is free again"
        assert deployment.wait(free, FINISHED).status == dg.DagsterRunStatus.SUCCESS
    finally:
        deployment.close()


def test_submissions_from_many_threads_never_exceed_a_limit_of_one(tmp_path: Path) -> None:
    """The sensor daemon submits from a pool of threads: the check and the launch are one step under the
    submission lock, so of eight member runs submitted at once exactly one starts and the others queue."""
    deployment = new_deployment(tmp_path, coordinator=coordinator(1))
    try:
        releases = [tmp_path / f"release-{i}" for i in range(8)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            run_ids = list(pool.map(lambda r: deployment.launch("wait_job", member_tags(r)), releases))
        statuses = [deployment.run(run_id).status for run_id in run_ids]
        assert statuses.count(dg.DagsterRunStatus.QUEUED) == 7, statuses
        started = next(run_id for run_id, s in zip(run_ids, statuses, strict=True) if s != dg.DagsterRunStatus.QUEUED)
        for release in releases:
            release.touch()
        assert deployment.wait(started, FINISHED).status == dg.DagsterRunStatus.SUCCESS
    finally:
        deployment.close()


def test_a_launch_that_raises_fails_the_run_once_and_marks_it(tmp_path: Path) -> None:
    """The member's next tick reads the mark and relaunches without counting an attempt
    (tests/dagster/test_sensors.py); Dagster's failure sensors see one failure, not two."""
    refuse = tmp_path / "refuse"
    refuse.touch()
    launcher = {"module": "tests.launcher.refusing_launcher", "class": "RefusingRunLauncher"}
    deployment = new_deployment(
        tmp_path, coordinator=coordinator(2), launcher=launcher, launcher_config={"refuse_file": str(refuse)}
    )
    try:
        failed = deployment.launch("quick_job", {sgt.TAG_MEMBER: "reader@test"})
        run = deployment.run(failed)
        assert run.status == dg.DagsterRunStatus.FAILURE
        assert run.tags[sgt.TAG_LAUNCH_FAILED] == "RuntimeError"
        failures = deployment.instance.all_logs(failed, of_type=dg.DagsterEventType.RUN_FAILURE)
        assert len(failures) == 1, [r.dagster_event.message for r in failures if r.dagster_event]
        assert any("refused to create the run's worker" in m for m in deployment.messages(failed))
        refuse.unlink()
        recovered = deployment.launch("quick_job", {sgt.TAG_MEMBER: "reader@test"})
        assert deployment.wait(recovered, FINISHED).status == dg.DagsterRunStatus.SUCCESS
        assert sgt.TAG_LAUNCH_FAILED not in deployment.run(recovered).tags
    finally:
        deployment.close()
