"""The SQL store's log: writes append what they changed, readers on other hosts rebuild the same state, the
log is folded into the base row, and a base row of an earlier version is rewritten before anything is
appended to it."""

from __future__ import annotations

from sqlalchemy import create_engine, func, select, update

from dagster_streamgroup import protocol
from dagster_streamgroup.member import update_state
from dagster_streamgroup.protocol import GroupPolicy, GroupState, Watermark
from dagster_streamgroup.stores.sql import DEFAULT_TABLE, state_table
from dagster_streamgroup.stores.sql_log import LoggedSqlStateStore, log_table

POLICY = GroupPolicy(heartbeat_interval_s=5, session_timeout_s=20, min_backlog=1, join_grace_s=0)


def tick(store: LoggedSqlStateStore, key: str, member: str, now: float, high: int) -> list[protocol.Launch]:
    def transition(current: GroupState | None, at: float) -> tuple[GroupState, list[protocol.Launch]]:
        base = current or protocol.new_group("stream", "g", at)
        state = protocol.membership_step(base, member, now, POLICY, [f"s{i}" for i in range(400)])
        marks = {sid: Watermark(low=0, high=high) for sid in protocol.owned_idle_shards(state, member)}
        return protocol.plan(state, member, now, marks, POLICY)

    launches, _ = update_state(store, key, transition, sleep=lambda _s: None)
    return launches


def commit(store: LoggedSqlStateStore, key: str, launches: list[protocol.Launch]) -> None:
    reports = [protocol.report_of(x) for x in launches]
    outcome, _ = update_state(store, key, lambda s, _at: protocol.commit_run(s, reports) if s else (s, None))
    assert outcome is not None and outcome.accepted


def log_rows(url: str, key: str) -> int:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    log = log_table(f"{DEFAULT_TABLE}_log")
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(log).where(log.c.key == key)).scalar_one())


def test_appended_changes_rebuild_the_same_state_on_another_host_and_fold(url: str, key: str) -> None:
    writer, other = LoggedSqlStateStore(url), LoggedSqlStateStore(url)
    try:
        now = 0.0
        for round_ in range(1, 40):
            for member in ("a", "b", "c"):
                now += 1.0
                launches = tick(writer if member != "c" else other, key, member, now, high=round_ * 10)
                if launches:
                    commit(writer, key, launches)
            state, _ = writer.load(key)
            fresh = LoggedSqlStateStore(url)  # a host that never saw this key
            try:
                assert fresh.load(key)[0] == state
                assert other.load(key)[0] == state
            finally:
                fresh.close()
        assert state is not None and sum(1 for s in state.shards.values() if s.committed) == 400
        heartbeat_before = writer.bytes_written
        tick(writer, key, "a", now + 1.0, high=39 * 10)  # nothing new to read: a heartbeat
        assert writer.bytes_written - heartbeat_before < 1_000
        # the log was folded into the base row: rows of the earlier folds are gone
        assert log_rows(url, key) < 3 * 39
    finally:
        writer.close()
        other.close()


def test_two_hosts_holding_the_same_version_write_one_after_the_other(url: str, key: str) -> None:
    first, second = LoggedSqlStateStore(url), LoggedSqlStateStore(url)
    try:
        assert first.save_if(key, protocol.new_group("stream", "g", 1.0), None)
        state_a, token_a = first.load(key)
        state_b, token_b = second.load(key)
        assert token_a == token_b and state_a is not None and state_b is not None
        assert first.save_if(key, protocol.heartbeat(state_a, "a", 2.0), token_a)
        assert not second.save_if(key, protocol.heartbeat(state_b, "b", 2.0), token_b)
        state, token = second.load(key)
        assert state is not None and set(state.members) == {"a"}
        assert second.save_if(key, protocol.heartbeat(state, "b", 3.0), token)
        assert set(first.load(key)[0].members) == {"a", "b"}  # type: ignore[union-attr]
    finally:
        first.close()
        second.close()


def test_a_base_row_of_an_earlier_version_is_rewritten_whole_before_anything_is_appended(url: str, key: str) -> None:
    store = LoggedSqlStateStore(url)
    try:
        assert store.save_if(key, protocol.new_group("stream", "g", 1.0), None)
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        table = state_table(DEFAULT_TABLE)
        with engine.begin() as conn:  # as an earlier member left it: schema 2, no log
            conn.execute(update(table).where(table.c.key == key).values(schema_version=2))
        state, token = LoggedSqlStateStore(url).load(key)
        assert state is not None
        assert store.save_if(key, protocol.heartbeat(state, "a", 2.0), token)
        with engine.connect() as conn:
            row = conn.execute(select(table.c.version, table.c.schema_version).where(table.c.key == key)).one()
        assert (row.version, row.schema_version) == (2, protocol.state.SCHEMA_VERSION)
        assert log_rows(url, key) == 0, "an earlier member would refuse the schema-3 base; nothing was logged over it"
    finally:
        store.close()
