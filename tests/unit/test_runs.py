"""Runs over several ranges: one run per member tick, sized by the backlog, committed all or nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagster_streamgroup import protocol
from dagster_streamgroup.dagster.liveness import run_beat_interval_s
from dagster_streamgroup.protocol import EventKind, FailOutcome, GroupPolicy, GroupState, Refusal, Watermark, delta
from dagster_streamgroup.protocol.membership import add_events
from dagster_streamgroup.protocol.state import evolve
from dagster_streamgroup.simulation import Simulation, random_scenario
from tests.unit.protocol_helpers import balanced_start, policy_with, report

MEMBER = policy_with(heartbeat_interval_s=5, session_timeout_s=20, max_records_per_run=1000)


def four_shards(policy: protocol.GroupPolicy = MEMBER) -> GroupState:
    return balanced_start(4, ("a",), policy)


def backlog(state: GroupState, highs: dict[str, int]) -> dict[str, Watermark]:
    return {sid: Watermark(low=0, high=highs.get(sid, 0)) for sid in state.shards}


def test_one_run_over_every_ready_shard_sized_by_backlog() -> None:
    state, launches = protocol.plan(
        four_shards(), "a", 5.0, backlog(four_shards(), {"s0": 10, "s1": 20, "s3": 5}), MEMBER
    )
    assert [(x.shard, x.start, x.end) for x in launches] == [("s0", 0, 10), ("s1", 0, 20), ("s3", 0, 5)]
    assert len({x.run_key for x in launches}) == 1
    key = launches[0].run_key
    assert key.startswith("g:a:3r:")
    assert all(state.shards[x.shard].inflight is not None for x in launches)
    assert state.shards["s2"].inflight is None
    # the same plan on the same state gives the same key: a re-requested run is deduplicated
    _, again = protocol.plan(four_shards(), "a", 5.0, backlog(four_shards(), {"s0": 10, "s1": 20, "s3": 5}), MEMBER)
    assert again[0].run_key == key
    assert list(protocol.runs_of(protocol.inflight_launches(state, "a"))) == [key]


def test_the_budget_is_split_in_proportion_to_the_backlog() -> None:
    highs = {"s0": 3000, "s1": 1000, "s2": 0, "s3": 0}
    _, launches = protocol.plan(four_shards(), "a", 5.0, backlog(four_shards(), highs), MEMBER)
    assert {x.shard: x.records for x in launches} == {"s0": 750, "s1": 250}


@given(
    backlogs=st.dictionaries(st.sampled_from([f"s{i}" for i in range(12)]), st.integers(0, 10**7), max_size=12),
    budget=st.integers(1, 10**7),
)
def test_split_budget_never_exceeds_the_budget_nor_a_backlog(backlogs: dict[str, int], budget: int) -> None:
    shares = protocol.split_budget(backlogs, budget)
    assert shares.keys() == backlogs.keys()
    assert all(0 <= shares[s] <= backlogs[s] for s in backlogs)
    total = sum(backlogs.values())
    assert sum(shares.values()) == min(total, budget)


def test_a_quiet_stream_waits_for_min_backlog_or_max_wait() -> None:
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, min_backlog=100, max_wait_s=15)
    state = four_shards(policy)
    state, launches = protocol.plan(state, "a", 5.0, backlog(state, {"s0": 30, "s1": 30}), policy)
    assert launches == [] and state.shards["s0"].backlog_since == 5.0
    state, launches = protocol.plan(state, "a", 12.0, backlog(state, {"s0": 40, "s1": 40, "s2": 5}), policy)
    assert launches == [], "85 records wait, for 7 s: neither bound reached"
    state, launches = protocol.plan(state, "a", 20.0, backlog(state, {"s0": 40, "s1": 40, "s2": 5}), policy)
    assert {x.shard for x in launches} == {"s0", "s1", "s2"}, "s0 has waited 15 s: every ready shard goes"
    assert all(state.shards[s].backlog_since is None for s in ("s0", "s1", "s2"))
    fresh = four_shards(policy)
    _, launches = protocol.plan(fresh, "a", 5.0, backlog(fresh, {"s0": 60, "s1": 40}), policy)
    assert len(launches) == 2, "100 records across the shards reach min_backlog at once"


def test_shard_mode_keeps_one_run_per_range() -> None:
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, run_mode="shard", max_records_per_run=15)
    state = four_shards(policy)
    _, launches = protocol.plan(state, "a", 5.0, backlog(state, {"s0": 10, "s1": 20}), policy)
    assert [(x.shard, x.end, x.run_key) for x in launches] == [
        ("s0", 10, f"g:s0:0-10:a0:e{launches[0].epoch}"),
        ("s1", 15, f"g:s1:0-15:a0:e{launches[1].epoch}"),
    ]


def test_a_run_commits_all_its_ranges_in_one_write_or_none() -> None:
    state, launches = protocol.plan(four_shards(), "a", 5.0, backlog(four_shards(), {"s0": 10, "s1": 20}), MEMBER)
    reports = [report(x) for x in launches]
    done, outcome = protocol.commit_run(state, reports)
    assert outcome.accepted and set(outcome.outcomes) == {"s0", "s1"}
    assert (done.shards["s0"].committed, done.shards["s1"].committed) == (10, 20)
    assert done.shards["s0"].inflight is None and done.shards["s1"].inflight is None
    replay, again = protocol.commit_run(done, reports)
    assert replay is done and again.accepted and all(o.already_committed for o in again.outcomes.values())
    # one range moved to another member meanwhile: nothing of the run is committed, the refusal names the shard
    moved = state.model_copy(
        update={"shards": {**state.shards, "s1": protocol.state.handed_over(state.shards["s1"], "b")}}
    )
    same, refused = protocol.commit_run(moved, reports)
    assert same is moved and not refused.accepted
    assert set(refused.refusals) == {"s1"} and refused.refusals["s1"].refusal is Refusal.OWNERSHIP_MOVED
    assert "owned by b" in refused.message
    with pytest.raises(ValueError, match="one range per shard"):
        protocol.commit_run(state, [reports[0], reports[0]])


def test_a_committed_run_stays_unrecorded_until_its_member_confirms_whatever_commits_follow() -> None:
    """A run can die between its commit and Dagster's record of it, while its member is stopped and another
    member carries the shards on: the entry that lets the launching member record the range outlives later
    commits on the same shards, and only that member can clear it."""
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, max_records_per_run=1000)
    state = balanced_start(2, ("a",), policy)
    state, launches = protocol.plan(
        state, "a", 5.0, {"s0": Watermark(low=0, high=10), "s1": Watermark(low=0, high=20)}, policy
    )
    state, outcome = protocol.commit_run(state, [report(x) for x in launches])
    assert outcome.accepted
    key = launches[0].run_key
    assert state.unrecorded_runs[key].member_id == "a"
    assert state.unrecorded_runs[key].ranges == (("s0", 0, 10), ("s1", 0, 20))
    replayed, _ = protocol.commit_run(state, [report(x) for x in launches])
    assert replayed is state, "a replayed commit adds nothing"

    state = protocol.leave(state, "a", 6.0)
    state = protocol.membership_step(state, "b", 6.0, policy)
    state = protocol.membership_step(state, "b", 6.0 + policy.grace_s, policy)
    state, later = protocol.plan(
        state, "b", 6.0 + policy.grace_s, {"s0": Watermark(low=0, high=15), "s1": Watermark(low=0, high=25)}, policy
    )
    assert {x.member_id for x in later} == {"b"} and later
    state, outcome = protocol.commit_run(state, [report(x) for x in later])
    assert outcome.accepted and state.shards["s0"].last_run_key == later[0].run_key
    assert state.unrecorded_runs[key].ranges == (("s0", 0, 10), ("s1", 0, 20)), "a's entry outlives b's commits"

    assert protocol.confirm_recorded(state, "b", [key]) is state, "b names no deployment: it cannot see a's runs"
    assert protocol.confirm_recorded(state, "a", [key]) is state, "a left: it checks once it is a member again"
    state = protocol.membership_step(state, "a", 7.0 + policy.grace_s, policy)
    confirmed = protocol.confirm_recorded(state, "a", [key, "no-such-run"])
    assert set(confirmed.unrecorded_runs) == {later[0].run_key}
    assert delta.apply(state, delta.diff(state, confirmed)) == confirmed
    back = delta.apply(confirmed, delta.diff(confirmed, state))
    assert back == state


def test_a_failed_run_retries_each_range_alone_so_one_poison_range_parks_only_its_shard() -> None:
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, max_records_per_run=1000, max_attempts=2)
    state = four_shards(policy)
    state, launches = protocol.plan(state, "a", 5.0, backlog(state, {"s0": 10, "s1": 20, "s2": 30}), policy)
    state, outcomes = protocol.fail_run(state, [report(x) for x in launches], "boom", 6.0, policy)
    assert set(outcomes.values()) == {FailOutcome.RETRY}
    state, retries = protocol.plan(state, "a", 7.0, backlog(state, {"s0": 99, "s1": 99, "s2": 99, "s3": 7}), policy)
    runs = protocol.runs_of(retries)
    solo = [ranges for ranges in runs.values() if ranges[0].attempt == 1]
    assert sorted((r[0].shard, r[0].start, r[0].end) for r in solo) == [("s0", 0, 10), ("s1", 0, 20), ("s2", 0, 30)]
    assert all(len(r) == 1 for r in solo), "every retry in a run of its own"
    fresh = [ranges for ranges in runs.values() if ranges[0].attempt == 0]
    assert [(x.shard, x.end) for ranges in fresh for x in ranges] == [("s3", 7)]
    by_shard = {x.shard: x for x in retries}
    state, _ = protocol.commit_run(state, [report(by_shard["s0"])])
    state, _ = protocol.commit_run(state, [report(by_shard["s1"])])
    state, outcomes = protocol.fail_run(state, [report(by_shard["s2"])], "poison", 8.0, policy)
    assert outcomes == {"s2": FailOutcome.PARKED}
    assert state.shards["s2"].parked is not None
    assert state.shards["s0"].parked is None and state.shards["s0"].committed == 10


def test_dead_letters_stay_until_an_operator_resolves_them() -> None:
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, max_attempts=1, after_max_attempts="dead_letter")
    state = four_shards(policy)
    state, launches = protocol.plan(state, "a", 5.0, backlog(state, {"s0": 10}), policy)
    state, outcomes = protocol.fail_run(state, [report(x) for x in launches], "bad record", 6.0, policy)
    assert outcomes == {"s0": FailOutcome.DEAD_LETTERED}
    assert [(d.shard, d.start, d.end) for d in state.dead_letters] == [("s0", 0, 10)]
    assert "bad record" in state.dead_letters[0].reason
    for _ in range(protocol.state.MAX_EVENTS + 1):  # the bounded event list rolls over; dead letters stay
        state = add_events(state, protocol.GroupEvent(kind=protocol.EventKind.EVICTED, at=7.0, member_id="x"))
    assert len(state.dead_letters) == 1
    state, resolved = protocol.resolve_dead_letters(state, "s0")
    assert [d.shard for d in resolved] == ["s0"] and state.dead_letters == ()


def test_a_zombie_is_refused_even_when_its_successor_committed_the_same_range_under_the_same_key() -> None:
    """A run fenced out by a drain expiry presents its commit after the range was relaunched and committed by
    another member: only the run that made a commit may be told ``already_committed``."""
    state, (launch,) = protocol.plan(
        balanced_start(1, ("a",), MEMBER), "a", 5.0, {"s0": Watermark(low=0, high=10)}, MEMBER
    )
    zombie = report(launch)
    shard = state.shards["s0"]
    successor = evolve(
        protocol.state.handed_over(shard, "b"),
        committed=launch.end,
        inflight=None,
        last_run_key=launch.run_key,  # the relaunch kept the key, as a key without the epoch did
        last_commit_member="b",
        last_commit_epoch=shard.epoch + 1,
    )
    after = state.model_copy(update={"shards": {"s0": successor}})
    same, outcome = protocol.commit(after, zombie)
    assert same is after and not outcome.accepted and not outcome.already_committed
    assert outcome.refusal is Refusal.OWNERSHIP_MOVED and "owned by b" in outcome.message
    # the run that made the commit is told so
    own = zombie.model_copy(update={"member_id": "b", "epoch": shard.epoch + 1})
    _, outcome = protocol.commit(after, own)
    assert outcome.accepted and outcome.already_committed


def test_the_simulator_catches_a_zombie_told_already_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the commit check of before (a matching run key and offset were enough) and run keys without the
    epoch, zombies relaunched under the same key are told ``already_committed``: the simulator's oracle,
    which keeps its own record of which run committed what, must report it."""
    from dagster_streamgroup.protocol import completion, planning

    fenced = completion.commit
    keyed = planning.run_key

    def old_commit(
        state: GroupState, presented: protocol.RangeReport, identity: str | None = None
    ) -> tuple[GroupState, protocol.CommitOutcome]:
        shard = state.shards.get(presented.shard)
        if (
            shard is not None
            and shard.last_run_key == presented.run_key
            and shard.committed is not None
            and shard.committed >= presented.end
        ):
            return state, protocol.CommitOutcome(accepted=True, already_committed=True, committed=shard.committed)
        return fenced(state, presented, identity)

    def key_without_epoch(group: str, shard: str, start: int, end: int, attempt: int, epoch: int | None = None) -> str:
        return keyed(group, shard, start, end, attempt)

    monkeypatch.setattr(completion, "commit", old_commit)
    monkeypatch.setattr(planning, "run_key", key_without_epoch)
    found = []
    for seed in range(100):
        config = random_scenario(seed)
        config.p_run_straggle, config.run_s, config.produce_per_s = 0.5, (1.0, 2.0), 50.0
        config.policy = config.policy.model_copy(
            update={"run_mode": "shard", "drain_timeout_s": 10.0, "max_records_per_run": 50}
        )
        found += [v for v in Simulation(config).run().violations if "already_committed" in v]
        if found:
            break
    assert found, "a zombie told already_committed must be reported"


def test_a_departed_members_run_that_stopped_saying_it_is_alive_is_relaunched_before_the_drain_timeout() -> None:
    """A deployment lost whole cannot report its runs' deaths: a run that said it was alive, then stopped for a
    session timeout, is dead; one that keeps saying so keeps its drain (it may still commit)."""
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, drain_timeout_s=600)
    state = balanced_start(2, ("a",), policy)
    state, launches = protocol.plan(state, "a", 5.0, backlog(state, {"s0": 10, "s1": 10}), policy)
    reports = [report(x) for x in launches]
    state = protocol.touch(state, reports, 6.0)
    state = protocol.leave(state, "a", 7.0)  # the member is gone; its run drains
    alive = protocol.touch(state, [r for r in reports if r.shard == "s1"], 30.0)
    expired = protocol.expire_drains(alive, 30.0, policy.drain_timeout_s, policy.session_timeout_s)
    assert expired.shards["s0"].inflight is None and expired.shards["s0"].owner is None, "silent for 24 s: dead"
    assert expired.shards["s0"].epoch > state.shards["s0"].epoch, "a new epoch fences the run, should it wake"
    assert expired.shards["s1"].inflight is not None, "said it is alive 0 s ago: still draining"
    assert (
        expired.events[-1].kind is EventKind.DRAIN_EXPIRED and "stopped saying it is alive" in expired.events[-1].detail
    )
    # a run that never started (never said anything) waits for the drain timeout, as before
    quiet, _ = protocol.plan(balanced_start(1, ("b",), policy), "b", 5.0, {"s0": Watermark(low=0, high=5)}, policy)
    quiet = protocol.leave(quiet, "b", 6.0)
    assert protocol.expire_drains(quiet, 500.0, policy.drain_timeout_s, policy.session_timeout_s).shards["s0"].inflight
    assert (
        protocol.expire_drains(quiet, 606.0, policy.drain_timeout_s, policy.session_timeout_s).shards["s0"].inflight
        is None
    )


def test_a_member_back_under_its_id_keeps_live_runs_and_relaunches_dead_ones() -> None:
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, drain_timeout_s=600)
    state = balanced_start(2, ("a",), policy)
    state, launches = protocol.plan(state, "a", 5.0, backlog(state, {"s0": 10, "s1": 10}), policy)
    reports = {x.shard: report(x) for x in launches}
    state = protocol.touch(state, list(reports.values()), 6.0)
    state = protocol.evict_stale(state, 40.0, policy.session_timeout_s)  # the deployment restarts
    state = protocol.touch(state, [reports["s1"]], 45.0)  # s1's run survived the restart
    back = protocol.heartbeat(state, "a", 50.0, policy.session_timeout_s)
    assert back.shards["s1"].inflight is not None and back.shards["s1"].inflight.orphaned_at is None
    assert back.shards["s0"].inflight is None and back.shards["s0"].owner is None, "its run died 44 s ago"
    assert back.shards["s0"].committed == 0, "nothing skipped: the range is launched again"


def test_a_new_group_can_start_at_a_timestamp() -> None:
    """Like Spark's startingTimestamp: a shard the group has never seen starts at the first offset at or after
    the time; until the member has looked that offset up, the shard waits; the stream's own group offset and a
    shard found later (from its earliest offset) still come first."""
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, seek="timestamp", seek_timestamp_ms=1_000)
    state = balanced_start(3, ("a",), policy)
    marks = {
        "s0": Watermark(low=0, high=100, at_timestamp=40),
        "s1": Watermark(low=0, high=100),  # not looked up yet
        "s2": Watermark(low=0, high=100, at_timestamp=40, group_committed=70),
    }
    state, launches = protocol.plan(state, "a", 5.0, marks, policy)
    assert {x.shard: x.start for x in launches} == {"s0": 40, "s2": 70}
    assert state.shards["s1"].committed is None
    with pytest.raises(ValueError, match="seek_timestamp_ms: required"):
        GroupPolicy(seek="timestamp")
    with pytest.raises(ValueError, match="only used with seek='timestamp'"):
        GroupPolicy(seek_timestamp_ms=5)


def test_what_waits_behind_a_members_runs_in_flight_and_which_of_them_still_hold_ranges() -> None:
    """What a tick looks at before it waits for one of its runs to end: the records past the ranges in
    flight (only its own, only shards it has watermarks for), and whether a run still holds any range."""
    state, launches = protocol.plan(four_shards(), "a", 5.0, backlog(four_shards(), {"s0": 1500, "s1": 500}), MEMBER)
    assert {x.shard: x.end for x in launches} == {"s0": 750, "s1": 250}
    key = launches[0].run_key
    later = {"s0": 2000, "s1": 200, "s2": 9000, "s3": 0}
    assert protocol.waiting_behind_inflight(state, "a", later) == 1250, "s0: 2000 - 750; s1 ends past its high; s2 idle"
    assert protocol.waiting_behind_inflight(state, "a", {"s1": 300}) == 50
    assert protocol.waiting_behind_inflight(state, "b", later) == 0, "another member's runs are not its own"
    assert protocol.runs_still_inflight(state, "a", [key, "other"]) == {key}
    committed, outcome = protocol.commit_run(state, [report(x) for x in launches])
    assert outcome.accepted
    assert protocol.runs_still_inflight(committed, "a", [key]) == set()
    assert protocol.runs_still_inflight(None, "a", [key]) == set(), "no state: nothing in flight"


def test_a_member_gone_for_good_has_its_unrecorded_runs_checked_by_one_member_of_its_deployment() -> None:
    """The launching member is evicted and never comes back (members 3 -> 2): the first live member of its
    deployment by id takes over checking its entries; a member of another deployment never does."""
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20)
    state = balanced_start(1, ("a@one",), policy)
    state, launches = protocol.plan(state, "a@one", 5.0, {"s0": Watermark(low=0, high=10)}, policy)
    state, outcome = protocol.commit_run(state, [report(x) for x in launches])
    assert outcome.accepted
    key = launches[0].run_key
    for member in ("c@one", "b@one", "z@two"):
        state = protocol.membership_step(state, member, 6.0, policy)
    entry = state.unrecorded_runs[key]
    assert [m for m in sorted(state.members) if protocol.checks_unrecorded(state, m, entry)] == ["a@one"]
    for member in ("c@one", "z@two", "b@one"):
        state = protocol.membership_step(state, member, 6.0 + policy.session_timeout_s + 1, policy)
    assert set(state.members) == {"b@one", "c@one", "z@two"}, "a@one evicted"
    assert [m for m in sorted(state.members) if protocol.checks_unrecorded(state, m, entry)] == ["b@one"]
    assert protocol.confirm_recorded(state, "c@one", [key]) is state
    assert protocol.confirm_recorded(state, "z@two", [key]) is state
    assert key not in protocol.confirm_recorded(state, "b@one", [key]).unrecorded_runs


def test_a_deployment_gone_longer_than_the_drain_timeout_loses_its_unrecorded_runs_with_an_event() -> None:
    """Nobody is left who can see the runs' records: the entries are dropped (the offsets stay committed),
    once the deployment has had no live member for ``drain_timeout_s``, naming the ranges."""
    policy = policy_with(heartbeat_interval_s=5, session_timeout_s=20, drain_timeout_s=60)
    state = balanced_start(1, ("a@one",), policy)
    state, launches = protocol.plan(state, "a@one", 5.0, {"s0": Watermark(low=0, high=10)}, policy)
    state, outcome = protocol.commit_run(state, [report(x) for x in launches])
    assert outcome.accepted
    key = launches[0].run_key
    state = protocol.leave(state, "a@one", 6.0)
    other = protocol.membership_step(state, "b@two", 10.0, policy)
    assert other.unrecorded_runs[key].orphaned_at == 10.0, "another deployment cannot check it: marked"
    kept = protocol.membership_step(other, "b@two", 69.0, policy)
    assert key in kept.unrecorded_runs
    dropped = protocol.membership_step(kept, "b@two", 71.0, policy)
    assert key not in dropped.unrecorded_runs
    event = dropped.events[-1]
    assert event.kind == protocol.EventKind.UNRECORDED_DROPPED and "s0 [0, 10)" in event.detail

    back = protocol.membership_step(other, "c@one", 30.0, policy)
    assert back.unrecorded_runs[key].orphaned_at is None, "a member of its deployment is back: kept"


def test_a_run_says_it_is_alive_three_times_per_session_timeout_never_faster_than_its_member() -> None:
    # A departed member's run is judged dead after a session timeout without a beat: three beats per timeout
    # leave room for two lost to a store hiccup; each beat is a state write, so none comes faster than the
    # member's own heartbeat.
    assert run_beat_interval_s(5.0, 20.0) == pytest.approx(20.0 / 3)
    assert run_beat_interval_s(5.0, 12.0) == 5.0
    assert run_beat_interval_s(3.0, 300.0) == 100.0
