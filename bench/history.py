"""A long history of committed ranges, written in seconds through the code path members commit with (for
``bench.backfill`` and tests/e2e/test_backfill.py).

Days of a group's ranges cannot be made by running them (each is a Dagster run and a Spark job). The protocol's own
transitions make them: a member joins, plans each range as its tick plans it, commits it as its run does, and
confirms it recorded as its next tick would, in memory, and the state is saved once under compare-and-set; the
ranges' bounds go to the store's index through the function runs record them with. Then the member leaves, handing
the shard back at its committed offset, which is mirrored into the stream as a run's commit mirrors it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from dagster_streamgroup import protocol
from dagster_streamgroup.dagster import StreamGroupResource
from dagster_streamgroup.dagster.range_index import record_committed_ranges
from dagster_streamgroup.member import update_state
from dagster_streamgroup.protocol import GroupState, Watermark

MEMBER = "history@seed"


def commit_history(resource: StreamGroupResource, shard: str, bounds: Sequence[int]) -> list[tuple[int, int]]:
    """The ranges ``[bounds[i], bounds[i + 1])`` of ``shard`` committed by a member that then leaves (the shard's
    offset starts at ``bounds[0]``); the other shards are left alone. Returns the ranges."""
    policy = resource.policy().model_copy(update={"join_grace_s": 0.0, "min_backlog": 1})
    ranges = list(itertools.pairwise(bounds))
    shards = resource.backend().shards()

    def transition(current: GroupState | None, now: float) -> tuple[GroupState, None]:
        state = current or protocol.new_group(resource.backend().stream_id, resource.group, now)
        state = protocol.membership_step(state, MEMBER, now, policy, shards)
        for start, end in ranges:
            marks = {shard: Watermark(low=bounds[0], high=end, group_committed=bounds[0])}
            state, launches = protocol.plan(state, MEMBER, now, marks, policy)
            assert [(x.shard, x.start, x.end) for x in launches] == [(shard, start, end)], launches
            state, outcome = protocol.commit_run(state, [protocol.report_of(x) for x in launches])
            assert outcome.accepted, outcome
            state = protocol.confirm_recorded(state, MEMBER, [launches[0].run_key])
        return protocol.leave(state, MEMBER, now), None

    update_state(resource.store(), resource.state_key(), transition)
    record_committed_ranges(resource, [(shard, start, end) for start, end in ranges])
    resource.backend().commit(resource.group, {shard: bounds[-1]})
    return ranges
