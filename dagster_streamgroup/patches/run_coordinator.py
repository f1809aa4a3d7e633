"""A run coordinator that launches member runs when their sensor submits them instead of a dequeue loop later.

Dagster's ``QueuedRunCoordinator`` leaves every run QUEUED until its daemon's next dequeue pass, which runs
once a second at the fastest (``dequeue_interval_seconds`` is an integer) and shares the daemon process with
the sensors: measured, a member run waited a median 1.2 s there before its launch, longer than the launch
itself. A member run needs no queue for its own safety: the group protocol already keeps at most one range per
shard in flight, and the run was planned in the tick that submits it. So a member run (tagged
``streamgroup/member``) is launched at once when the queue would launch it now; otherwise, and for every other
run (backfills, the Launchpad, other jobs), the run is queued exactly as the ``QueuedRunCoordinator`` queues it,
and its daemon launches it. The configuration is the ``QueuedRunCoordinator``'s, so switching between the two is
one line of ``dagster.yaml``.

"Would launch it now" is the queue daemon's own admission, read where the daemon reads it: the instance's
``get_concurrency_config()`` (``concurrency: runs:`` overrides this coordinator's block, so
``max_concurrent_runs: 0`` stops member runs too), the run limit, the tag limits, and the pools when op
concurrency blocks runs. And only when no run is QUEUED: a queued run goes first whatever held it (a limit, its
``dagster/priority``, its code location paused after a user-code failure, a retry of that failure), so a member
run never overtakes the queue.

The decision and the launch's first write (the run's STARTING status) happen under one lock that every
submission of the instance takes, member run or not. The daemon can only launch a run that a submission queued;
a run queued after a member run's check is queued after that run is STARTING, so the daemon counts it, and a
run queued before the check makes the member run queue too. The limits therefore hold whatever starts the runs.
The lock is a file in the instance's directory (``.streamgroup/submit.lock``), shared by the processes of one
host that use the instance (the daemon with its sensors, the webserver, ``dagster dev``); a deployment whose
webserver and daemon run on different hosts shares no lock, and there two submissions in the same instant can
still exceed a limit by the runs submitted in that instant.

A launch that raises at submit (the run launcher's error: an API refusing, a fork failing under load) leaves
the run FAILURE once, with the launcher's error as its engine event, tagged ``streamgroup/launch_failed``:
the member's next tick relaunches its ranges without counting an attempt (see ``protocol.launch_failed``).

The admission reads private parts of Dagster (the active run statuses, its tag-limit and pool counters), so it
runs only where the guard (``dagster_streamgroup.patches.enabled``) allows it; on any other Dagster every run is
queued, exactly as by the ``QueuedRunCoordinator``. The class is built only on Dagster's public names, so
``dagster.yaml`` loads it on any release. ``dagster.yaml`` names it by its configuration path,
``dagster_streamgroup.coordinator``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dagster import DagsterRun, DagsterRunStatus, QueuedRunCoordinator, RunsFilter, SubmitRunContext
from filelock import FileLock

from dagster_streamgroup import patches
from dagster_streamgroup.patches import migrations, run_databases, schema_checks, sqlite_engines
from dagster_streamgroup.run_tags import TAG_LAUNCH_FAILED, TAG_MEMBER

log = logging.getLogger(__name__)

LOCK_FILE = Path(".streamgroup") / "submit.lock"
"""Under the instance's directory: the lock of every submission on this host."""

_thread_lock = threading.Lock()
"""The file lock is taken per open file, so threads of one process (the sensor daemon's pool) also take this."""


class MemberRunCoordinator(QueuedRunCoordinator):
    """Dagster's ``QueuedRunCoordinator``, except that member runs launch at submit when the queue would
    launch them now."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The daemon builds this coordinator when it starts, and it is the process that keeps the member
        # sensors' tick rows and states: on a SQLite instance one engine per database file (statements
        # compiled once), and the schema checks of each of those writes answered once. It also creates each
        # run's event database on SQLite: copied from an empty one of the same schema, checked with the
        # migration scripts parsed once.
        sqlite_engines.install()
        schema_checks.install()
        migrations.install()
        run_databases.install()

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        run = context.dagster_run
        if run.status != DagsterRunStatus.NOT_STARTED or not patches.enabled():
            submitted: DagsterRun = super().submit_run(context)
            return submitted
        with self._submission_lock():
            if TAG_MEMBER not in run.tags or not self._may_start_now(run):
                queued: DagsterRun = super().submit_run(context)
                return queued
            return self._launch(run, context)

    def _launch(self, run: DagsterRun, context: SubmitRunContext) -> DagsterRun:
        try:
            self._instance.launch_run(run.run_id, context.workspace)
        except Exception as exc:
            # ``launch_run`` has recorded the launcher's error and failed the run; raising on would have
            # Dagster's ``submit_run`` fail it a second time (two failure events, two alerts).
            self._instance.add_run_tags(run.run_id, {TAG_LAUNCH_FAILED: type(exc).__name__})
            log.warning("member run %s could not be launched: %s", run.run_id, type(exc).__name__)
        launched = self._instance.get_run_by_id(run.run_id)
        if launched is None:
            raise RuntimeError(f"run {run.run_id} vanished while it was launched")
        return launched

    @contextmanager
    def _submission_lock(self) -> Iterator[None]:
        path = Path(self._instance.root_directory) / LOCK_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with _thread_lock, FileLock(str(path), timeout=60):
            yield

    def _may_start_now(self, run: DagsterRun) -> bool:
        """The queue daemon's admission (``QueuedRunCoordinatorDaemon``) against the runs in progress now, and
        an empty queue."""
        from dagster._core.op_concurrency_limits_counter import GlobalOpConcurrencyLimitsCounter
        from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES
        from dagster._utils.tags import TagConcurrencyLimitsCounter

        concurrency = self._instance.get_concurrency_config()
        config = concurrency.run_queue_config
        if config is None:
            return False
        if self._instance.get_runs_count(RunsFilter(statuses=[DagsterRunStatus.QUEUED])) > 0:
            return False
        records = self._instance.get_run_records(RunsFilter(statuses=ACTIVE_RUN_STATUSES))
        active = [r.dagster_run for r in records]
        if config.max_concurrent_runs != -1 and len(active) >= config.max_concurrent_runs:
            return False
        if TagConcurrencyLimitsCounter(list(config.tag_concurrency_limits or []), active).is_blocked(run):
            return False
        if config.should_block_op_concurrency_limited_runs:
            storage = self._instance.event_log_storage
            pools = GlobalOpConcurrencyLimitsCounter(
                self._instance,
                [run],
                records,
                concurrency_keys=storage.get_concurrency_keys(),
                pool_limits=storage.get_pool_limits(),
                slot_count_offset=config.op_concurrency_slot_buffer,
                pool_granularity=concurrency.pool_config.pool_granularity,
            )
            if pools.is_blocked(run):
                return False
        return True
