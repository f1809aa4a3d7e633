"""The chaos deployment's launcher (``bench.chaos.launcher``) with a real instance, code server and the project's
member-run coordinator: while the outage file exists a member run's launch raises, the run fails once, marked
``streamgroup/launch_failed`` with the outage's error (what the member reads to relaunch without counting an
attempt), and the refusal is logged with the run's identity; once the file is gone, runs fork and succeed."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from bench.chaos.launcher import OutageRunLauncher, read_refused
from dagster_streamgroup.dagster import tags as sgt
from tests.launcher.helpers import Deployment, copy_location, instance_yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
COORDINATOR = {"module": "dagster_streamgroup.coordinator", "class": "MemberRunCoordinator",
               "config": {"max_concurrent_runs": 2}}  # fmt: skip


def test_launches_raise_during_the_outage_and_fork_after_it(tmp_path: Path) -> None:
    outage = tmp_path / "faults" / "launcher-outage"
    outage.parent.mkdir()
    outage.touch()
    launcher = {"module": "bench.chaos.launcher", "class": "OutageRunLauncher"}
    yaml_text = instance_yaml(coordinator=COORDINATOR, launcher=launcher, launcher_config={"outage_file": str(outage)})
    deployment = Deployment(tmp_path / "home", copy_location(tmp_path / "location"), yaml_text)
    try:
        assert isinstance(deployment.instance.run_launcher, OutageRunLauncher)
        tags = {sgt.TAG_MEMBER: "reader@test", sgt.TAG_GROUP: "g", sgt.TAG_RUN_KEY: "k"}
        refused = deployment.launch("quick_job", tags)
        run = deployment.run(refused)
        assert run.status == dg.DagsterRunStatus.FAILURE
        assert run.tags[sgt.TAG_LAUNCH_FAILED] == "LauncherOutageError"
        assert any("launcher outage refused run" in m for m in deployment.messages(refused))
        logged = read_refused(outage.parent)
        assert [(r.run_id, r.group, r.member, r.run_key) for r in logged] == [(refused, "g", "reader@test", "k")]
        outage.unlink()
        launched = deployment.launch("quick_job", tags)
        assert deployment.wait(launched, FINISHED).status == dg.DagsterRunStatus.SUCCESS
        assert sgt.TAG_LAUNCH_FAILED not in deployment.run(launched).tags
        assert len(read_refused(outage.parent)) == 1
    finally:
        deployment.close()
