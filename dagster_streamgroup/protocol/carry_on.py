"""A run that carries on: its commit and its shards' next ranges in one state write.

A new run for every wave pays a run's fixed costs (Dagster creating and launching it, a process, a Spark
session) again and again while its shards keep the same owner. A run that committed may instead take the next
ranges of the shards it still holds, under its own run key, in the same write as the commit: no tick sees the
shards idle in between (a tick waiting for the run to end would plan them at once), and the orchestrator's run
for that key exists already, so no tick requests it again.

It is the tick's own planning, limited to the run's shards: the commit is the safe point where a member above
its fair share releases shards (``rebalance``), so a member that joined gets its share while runs carry on; while
fewer than ``min_backlog`` records wait, nothing is planned and the run asks again (``carry_on``, a write of its
own: a tick that plans the shards first wins the compare-and-set) until ``max_wait_s`` has passed, as a tick
would wait; a member that left or is about to be evicted carries nothing on.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from dagster_streamgroup.protocol.assignment import rebalance
from dagster_streamgroup.protocol.completion import RangeReport, RunCommitOutcome, commit_run
from dagster_streamgroup.protocol.planning import Launch, Watermark, inflight_launches, plan
from dagster_streamgroup.protocol.policy import GroupPolicy
from dagster_streamgroup.protocol.state import GroupState, InFlight, evolve


def commit_and_carry_on(
    state: GroupState,
    reports: Sequence[RangeReport],
    now: float,
    watermarks: Mapping[str, Watermark],
    policy: GroupPolicy,
    identities: Mapping[str, str] | None = None,
) -> tuple[GroupState, RunCommitOutcome, list[Launch]]:
    """Commit ``reports`` (all or none, as ``commit_run``), then plan the next range of each of their shards
    (``carry_on``). ``watermarks``: the shards' watermarks, read after the run's records were processed;
    ``identities``: their logs' identities now (see ``commit``)."""
    state, outcome = commit_run(state, reports, identities)
    if not outcome.accepted or not reports:
        return state, outcome, []
    carried = _already_carried(state, reports)
    if carried:
        # This commit was written before (a write whose answer was lost, retried): so were its next ranges.
        return state, outcome, carried
    shards = {r.shard for r in reports}
    state, launches = carry_on(state, reports[0].member_id, reports[0].run_key, shards, now, watermarks, policy)
    return state, outcome, launches


def carry_on(
    state: GroupState,
    member_id: str,
    run_key: str,
    shards: Collection[str],
    now: float,
    watermarks: Mapping[str, Watermark],
    policy: GroupPolicy,
) -> tuple[GroupState, list[Launch]]:
    """The next ranges of ``shards`` for the run ``run_key`` of ``member_id``, which committed their ranges, planned
    as the member's tick would plan them and recorded in flight under ``run_key``. ``watermarks``: the shards'
    watermarks, read after the run's records were processed (a shard missing from them is left to the ticks). A
    shard another run holds by now, or that moved, is not planned; a member that left, or has not heartbeated for
    a session timeout less a heartbeat, plans nothing. Changes nothing (the same object) when nothing is to be
    done."""
    state = _forget_recorded_waves(state, run_key)
    member = state.members.get(member_id)
    if member is None or now - member.heartbeat > policy.session_timeout_s - policy.heartbeat_interval_s:
        return state, []
    state = rebalance(state, member_id, now, policy)
    state, launches = plan(state, member_id, now, {s: m for s, m in watermarks.items() if s in shards}, policy)
    return _under_key(state, launches, run_key), [x.model_copy(update={"run_key": run_key}) for x in launches]


def _forget_recorded_waves(state: GroupState, run_key: str) -> GroupState:
    """The run's unrecorded entry keeps each shard's last two ranges, no earlier ones: a run records a wave's
    materializations before it commits the next, so what came before the wave before is recorded, and the entry of
    a run that carries on for hours stays two waves long."""
    entry = state.unrecorded_runs.get(run_key)
    if entry is None:
        return state
    last: dict[str, tuple[int, int]] = {}
    for shard, start, end in entry.ranges:
        if end > last.get(shard, (-1, -1))[1]:
            last[shard] = (start, end)
    kept = tuple(r for r in entry.ranges if r[2] in (last[r[0]][0], last[r[0]][1]))
    if kept == entry.ranges:
        return state
    return state.model_copy(update={"unrecorded_runs": {**state.unrecorded_runs, run_key: evolve(entry, ranges=kept)}})


def _already_carried(state: GroupState, reports: Sequence[RangeReport]) -> list[Launch]:
    """The ranges in flight under the run's key that start where its reports end: taken by an earlier write."""
    ends = {(r.shard, r.run_key): r.end for r in reports}
    return [x for x in inflight_launches(state, reports[0].member_id) if ends.get((x.shard, x.run_key)) == x.start]


def _under_key(state: GroupState, launches: Sequence[Launch], run_key: str) -> GroupState:
    """The planned ranges in flight under the carrying run's key."""
    if not launches:
        return state
    shards = dict(state.shards)
    for launch in launches:
        shard = shards[launch.shard]
        inflight = shard.inflight
        assert isinstance(inflight, InFlight)
        shards[launch.shard] = evolve(shard, inflight=evolve(inflight, run_key=run_key))
    return state.model_copy(update={"shards": shards})
