"""A forked worker that runs several runs one after another (``runs_per_worker``), against a real instance and a
real code server: the next run goes to a worker whose run succeeded, with the events, logs and monitoring of a
new process; any other worker exits, as do idle ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from dagster_streamgroup.launcher import process
from tests.launcher.helpers import (
    FINISHED,
    SUCCESS,
    Deployment,
    captured_stdout,
    copy_location,
    event_shape,
    in_other_process,
    instance_yaml,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _deployment(tmp_path: Path, name: str, **launcher_config: float) -> Deployment:
    location = copy_location(tmp_path / f"{name}-location")
    return Deployment(tmp_path / f"{name}-home", location, instance_yaml(launcher_config=launcher_config))


@pytest.fixture
def reusing(tmp_path: Path) -> Iterator[Deployment]:
    deployment = _deployment(tmp_path, "reusing", runs_per_worker=3, worker_idle_seconds=120)
    yield deployment
    deployment.close()


def _gone(worker_pid: int, start_ticks: int) -> bool:
    return process.state(worker_pid, start_ticks) is process.ProcessState.EXITED


def test_a_worker_whose_run_succeeded_runs_the_next_runs_up_to_its_limit(reusing: Deployment) -> None:
    run_ids, workers = [], []
    for _ in range(4):
        run_id = reusing.launch("quick_job")
        assert reusing.wait(run_id, FINISHED).status == dg.DagsterRunStatus.SUCCESS
        run_ids.append(run_id)
        workers.append(reusing.worker(run_id))
    first, second, third, fourth = workers
    assert first.pid == second.pid == third.pid and first.start_ticks == third.start_ticks, "one process"
    assert [w.runs_before for w in workers] == [None, 1, 2, None]
    assert fourth.pid != first.pid, "after its third run the worker exited; the fourth run was forked anew"
    wait_until("the first worker to exit", lambda: _gone(first.pid, first.start_ticks), 30)
    # Durations print as "9.9ms" or "14ms": one shape for both.
    shapes = [[(e, m.replace("N.N", "N")) for e, m in event_shape(reusing, run_id)] for run_id in run_ids]
    assert shapes[1] == shapes[2] == shapes[3], "a reused worker's run has the events of a new process's run"
    assert [e for e, _ in shapes[0]] == [e for e, _ in shapes[1]]
    for run_id, worker in zip(run_ids, workers, strict=True):
        facts = reusing.materialization(run_id)
        assert facts["pid"] == worker.pid and facts["ppid"] == worker.server_pid
        assert captured_stdout(reusing, run_id) == f"quick ran in process {worker.pid}\n", "its own logs, once"
        assert facts["event_log_engines"] == "dagster_streamgroup.patches.sqlite_engines"
    randoms = {reusing.materialization(run_id)["random"] for run_id in run_ids}
    assert len(randoms) == 4


def test_a_reused_workers_run_opens_its_store_anew(reusing: Deployment, tmp_path: Path) -> None:
    """The group resources keep one store client per process; a worker's next run must not find its earlier
    run's, or it would reach the store on connections made with credentials rotated since."""
    tags = {"store_url": f"sqlite:///{tmp_path / 'state.db'}"}
    run_ids = []
    for _ in range(2):
        run_ids.append(reusing.launch("store_job", tags))
        reusing.wait(run_ids[-1], SUCCESS)
    first, second = (reusing.worker(run_id) for run_id in run_ids)
    assert first.pid == second.pid and second.runs_before == 1, "the second run ran in the first one's worker"
    facts = [reusing.materialization(run_id) for run_id in run_ids]
    assert [f["cached_before"] for f in facts] == [0, 0]


def test_a_canceled_run_in_a_reused_worker_ends_it(reusing: Deployment, tmp_path: Path) -> None:
    """A run in a reused worker is checked and stopped from any process as in a new one; a worker whose run
    did not succeed exits instead of taking the next run."""
    warm = reusing.launch("quick_job")
    reusing.wait(warm, SUCCESS)
    release = tmp_path / "release"
    held = reusing.launch("wait_job", {"release": str(release)})
    wait_until("the run's step to start", Path(f"{release}.started").exists, 60)
    worker = reusing.worker(held)
    assert worker.pid == reusing.worker(warm).pid and worker.runs_before == 1
    check = "print(instance.run_launcher.check_run_worker_health(instance.get_run_by_id(sys.argv[1])))"
    assert in_other_process(reusing.home, check, held).startswith("RUNNING")
    assert in_other_process(reusing.home, "print(instance.run_launcher.terminate(sys.argv[1]))", held) == "True"
    assert reusing.wait(held, FINISHED).status == dg.DagsterRunStatus.CANCELED
    wait_until("the worker to exit", lambda: _gone(worker.pid, worker.start_ticks), 30)
    after = reusing.launch("quick_job")
    reusing.wait(after, SUCCESS)
    assert reusing.worker(after).pid != worker.pid and reusing.worker(after).runs_before is None
    assert in_other_process(reusing.home, "print(instance.run_launcher.terminate(sys.argv[1]))", warm) == "False"


def test_an_idle_worker_exits_after_its_idle_limit_and_when_the_launcher_closes(tmp_path: Path) -> None:
    brief = _deployment(tmp_path, "brief", runs_per_worker=5, worker_idle_seconds=1)
    try:
        run_id = brief.launch("quick_job")
        brief.wait(run_id, SUCCESS)
        worker = brief.worker(run_id)
        wait_until("the idle worker to exit", lambda: _gone(worker.pid, worker.start_ticks), 30)
    finally:
        brief.close()
    lasting = _deployment(tmp_path, "lasting", runs_per_worker=5, worker_idle_seconds=600)
    try:
        run_id = lasting.launch("quick_job")
        lasting.wait(run_id, SUCCESS)
        worker = lasting.worker(run_id)
        wait_until("the worker to go idle", lambda: process.state(worker.pid, worker.start_ticks).name, 10)
        assert not _gone(worker.pid, worker.start_ticks), "it waits for another run"
    finally:
        lasting.close()
    wait_until("the idle worker to exit with its server", lambda: _gone(worker.pid, worker.start_ticks), 30)
