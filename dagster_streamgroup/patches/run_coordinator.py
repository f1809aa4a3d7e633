"""A run coordinator that launches member runs when their sensor submits them instead of a dequeue loop later.

Dagster's ``QueuedRunCoordinator`` leaves every run QUEUED until its daemon's next dequeue pass, which runs
once a second at the fastest (``dequeue_interval_seconds`` is an integer) and shares the daemon process with
the sensors: measured, a member run waited a median 1.2 s there before its launch, longer than the launch
itself. A member run needs no queue for its own safety: the group protocol already keeps at most one range per
shard in flight, and the run was planned in the tick that submits it. So a member run (tagged
``streamgroup/member``) is launched at once when the instance's limits let it start now: fewer runs in progress
than ``max_concurrent_runs`` and no tag concurrency limit reached (a backfill of one of its shards in progress
holds a single-shard run back). Otherwise, and for every other run (backfills, the Launchpad, other jobs), the
run is queued exactly as the ``QueuedRunCoordinator`` queues it, and its daemon launches it. The configuration
is the ``QueuedRunCoordinator``'s, so switching between the two is one line of ``dagster.yaml``.

A queued run blocked by a tag limit is not waited for: a member run it does not block may start before it, as
the daemon's own pass would start it. Two submissions deciding at the same moment can both see room for one
more run; the limits are then exceeded by the runs submitted in that instant. Per-shard order does not depend
on it: member runs are fenced by the group state, and backfills commit nothing.

The queue's test reads private parts of Dagster (the active run statuses, its tag-limit counter, the
coordinator's instance), so it runs only where the guard (``dagster_streamgroup.patches.enabled``) allows it;
on any other Dagster every run is queued, exactly as by the ``QueuedRunCoordinator``. The class is built only
on Dagster's public names, so ``dagster.yaml`` loads it on any release. ``dagster.yaml`` names it by its
configuration path, ``dagster_streamgroup.coordinator``.
"""

from __future__ import annotations

from dagster import DagsterRun, DagsterRunStatus, QueuedRunCoordinator, RunsFilter, SubmitRunContext

from dagster_streamgroup import patches
from dagster_streamgroup.dagster.tags import TAG_MEMBER


class MemberRunCoordinator(QueuedRunCoordinator):
    """Dagster's ``QueuedRunCoordinator``, except that member runs launch at submit when the limits allow."""

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        run = context.dagster_run
        if (
            run.status != DagsterRunStatus.NOT_STARTED
            or TAG_MEMBER not in run.tags
            or not patches.enabled()
            or not self._may_start_now(run)
        ):
            submitted: DagsterRun = super().submit_run(context)
            return submitted
        self._instance.launch_run(run.run_id, context.workspace)
        launched = self._instance.get_run_by_id(run.run_id)
        if launched is None:
            raise RuntimeError(f"run {run.run_id} vanished while it was launched")
        return launched

    def _may_start_now(self, run: DagsterRun) -> bool:
        """The queue's own test (``QueuedRunCoordinatorDaemon``) against the runs in progress right now."""
        from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES
        from dagster._utils.tags import TagConcurrencyLimitsCounter

        config = self.get_run_queue_config()
        active = [r.dagster_run for r in self._instance.get_run_records(RunsFilter(statuses=ACTIVE_RUN_STATUSES))]
        if config.max_concurrent_runs != -1 and len(active) >= config.max_concurrent_runs:
            return False
        counter = TagConcurrencyLimitsCounter(list(config.tag_concurrency_limits or []), active)
        return not counter.is_blocked(run)
