"""What every logged store does when any one of its items or rows is deleted or damaged by hand.

For each store (SQLite, PostgreSQL, the v3io KV store through the real client) a state is written through a
few folds and a few appends, so that it has a base, a log and (on v3io) a head. Then, one at a time, each
stored thing is deleted, or its body overwritten with text that is not a state, and the store is asked again,
by a host that never saw the key and by the writer that holds the newest version. The rules checked:

- a reader never gets an older state than the newest one written (no roll-back), except where the store has
  no record of the newest write to compare with (``UNDETECTABLE`` below: the documented case, which the
  protocol's mirror check covers);
- it gets the newest state, or ``StateDamagedError`` naming the damaged thing and saying what to do, or no
  state at all only when the base itself is gone (a lost state: the group resumes from the offsets the stream
  records);
- after a lost base, a new state can be created and written on (nothing left behind blocks it);
- a writer holding the newest version never builds a second history beside another writer's: whatever it
  writes, a fresh reader afterwards reads one consistent state or refuses.

docs/stores.md has the table of what a user sees in each case.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import pytest
from sqlalchemy import create_engine, delete, select, update

from dagster_streamgroup import protocol
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.member import update_state
from dagster_streamgroup.protocol import GroupPolicy, GroupState, Watermark
from dagster_streamgroup.protocol.codec import StateFormatError
from dagster_streamgroup.stores.base import StateDamagedError, StateStore, state_key
from dagster_streamgroup.stores.sql import DEFAULT_TABLE, state_table
from dagster_streamgroup.stores.sql_log import LoggedSqlStateStore, log_table
from dagster_streamgroup.stores.v3io import STATE, V3ioStateStore
from dagster_streamgroup.stores.v3io_log import parse_log_item
from dagster_streamgroup.streams.v3io_config import V3ioConnection
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io.conftest import CONTAINER

POLICY = GroupPolicy(heartbeat_interval_s=5, session_timeout_s=20, min_backlog=1, join_grace_s=0)
SHARDS = [f"s{i}" for i in range(6)]
GARBAGE = "not a state {"

Action = Literal["delete", "corrupt"]


class Layout(Protocol):
    """The stored things of one key, as an operator with direct access sees and damages them."""

    def things(self) -> list[str]: ...

    def damage(self, thing: str, action: Action) -> None: ...

    def store(self, *, fold_always: bool = False) -> StateStore: ...


def tick(store: StateStore, key: str, member: str, now: float, high: int) -> GroupState:
    """One member tick that plans and commits: every write changes heartbeats and offsets."""

    def transition(current: GroupState | None, at: float) -> tuple[GroupState, list[protocol.Launch]]:
        base = current or protocol.new_group(key.split("|", maxsplit=1)[0], "g", at)
        state = protocol.membership_step(base, member, now, POLICY, SHARDS)
        marks = {sid: Watermark(low=0, high=high) for sid in protocol.owned_idle_shards(state, member)}
        return protocol.plan(state, member, now, marks, POLICY)

    launches, stats = update_state(store, key, transition, sleep=lambda _s: None)
    if launches:
        reports = [protocol.report_of(x) for x in launches]
        _, stats = update_state(store, key, lambda s, _at: protocol.commit_run(s, reports) if s else (s, None))
    assert stats.state is not None
    return stats.state


@dataclass
class Written:
    layout: Layout
    writer: StateStore
    """The store instance that wrote the newest version (it holds it)."""
    latest: GroupState


def write_history(layout: Layout, key: str) -> Written:
    """Three writes folded at once (a base past version 1, log entries the last fold left), then three that
    only append (a log after the base)."""
    folding = layout.store(fold_always=True)
    now, high = 0.0, 10
    try:
        for _ in range(3):
            now, high = now + 1, high + 10
            tick(folding, key, "a", now, high)
    finally:
        folding.close()
    writer = layout.store()
    latest = None
    for _ in range(3):
        now, high = now + 1, high + 10
        latest = tick(writer, key, "a", now, high)
    assert latest is not None
    return Written(layout, writer, latest)


# -- the stores' layouts ----------------------------------------------------------------------------------------


class SqlLayout:
    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        self.base, self.log = state_table(DEFAULT_TABLE), log_table(f"{DEFAULT_TABLE}_log")

    def store(self, *, fold_always: bool = False) -> StateStore:
        if fold_always:
            return LoggedSqlStateStore(self.url, min_fold_bytes=0, fold_fraction=0.0)
        return LoggedSqlStateStore(self.url)

    def things(self) -> list[str]:
        with self.engine.connect() as conn:
            versions = conn.execute(select(self.log.c.version).where(self.log.c.key == self.key)).scalars().all()
        newest = max(versions)
        return ["base"] + [f"log {v}" + (" (newest)" if v == newest else "") for v in sorted(versions)]

    def damage(self, thing: str, action: Action) -> None:
        with self.engine.begin() as conn:
            if thing == "base":
                where = self.base.c.key == self.key
                stmt = delete(self.base) if action == "delete" else update(self.base).values(body=GARBAGE)
                conn.execute(stmt.where(where))
                return
            version = int(thing.split()[1])
            where = (self.log.c.key == self.key) & (self.log.c.version == version)
            stmt = delete(self.log) if action == "delete" else update(self.log).values(body=GARBAGE)
            conn.execute(stmt.where(where))


class V3ioLayout:
    def __init__(self, server: V3ioServerInfo, client: Any, path: str) -> None:
        self.server, self.client, self.path = server, client, path

    def store(self, *, fold_always: bool = False) -> StateStore:
        connection = V3ioConnection(
            endpoint=self.server.endpoint, container=CONTAINER, access_key=self.server.access_key
        )
        if fold_always:
            return V3ioStateStore(connection, min_fold_bytes=0, fold_fraction=0.0)
        return V3ioStateStore(connection)

    def _names(self) -> list[str]:
        items = self.client.kv.new_cursor(CONTAINER, self.path + "/", attribute_names=["__name"]).all()
        return sorted(str(i["__name"]) for i in items if str(i["__name"]).startswith("g-state.json"))

    def things(self) -> list[str]:
        named = []
        logs = [(p.version, n) for n in self._names() if (p := parse_log_item("g-state.json", n)) and not p.is_head]
        newest = max(v for v, _ in logs)
        for name in self._names():
            parsed = parse_log_item("g-state.json", name)
            if parsed is None:
                named.append(f"base {name}")
            elif parsed.is_head:
                named.append(f"head {name}")
            else:
                named.append(f"log {name}" + (" (newest)" if parsed.version == newest else ""))
        return named

    def damage(self, thing: str, action: Action) -> None:
        kind, name = thing.split()[:2]
        if action == "delete":
            self.client.kv.delete(CONTAINER, self.path, name)
        elif kind == "head":
            self.client.kv.update(CONTAINER, self.path, name, attributes={"state_head": "x"})
        else:
            self.client.kv.update(CONTAINER, self.path, name, attributes={STATE: GARBAGE, "state_encoding": "json"})


LayoutFactory = Callable[[str], tuple[Layout, str]]


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("v3io", marks=pytest.mark.v3io),
    ]
)
def new_layout(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LayoutFactory]:
    kind = request.param
    if kind == "v3io":
        server = request.getfixturevalue("v3io_server")
        client = request.getfixturevalue("v3io_client")

        def make_v3io(_tag: str) -> tuple[Layout, str]:
            path = unique_v3io_name("damage")
            return V3ioLayout(server, client, path), state_key(f"v3io://127.0.0.1/{CONTAINER}/{path}", "g")

        yield make_v3io
        return
    url = f"sqlite:///{tmp_path / 'state.db'}" if kind == "sqlite" else str(request.getfixturevalue("postgres_url"))

    def make_sql(_tag: str) -> tuple[Layout, str]:
        key = f"stream|g-{uuid.uuid4().hex[:8]}"
        return SqlLayout(url, key), key

    yield make_sql


UNDETECTABLE = {("sql", "delete", "log (newest)")}
"""A SQL log keeps no record of its newest row apart from the row itself: deleting it is a lost write (the
state reads as one write earlier), which the group's mirror check reports; see docs/stores.md."""


def _load(layout: Layout, key: str) -> tuple[str, GroupState | None, str]:
    """(outcome, state, error text) of a load by a host that never saw the key."""
    fresh = layout.store()
    try:
        state, _ = fresh.load(key)
    except StateDamagedError as exc:
        return "damaged", None, str(exc)
    except StateFormatError as exc:
        return "refused", None, str(exc)
    finally:
        fresh.close()
    return ("absent" if state is None else "state"), state, ""


def _kind(layout: Layout) -> str:
    return "sql" if isinstance(layout, SqlLayout) else "v3io"


def _shape(thing: str) -> str:
    """A thing's name without the version or item name that differs from run to run."""
    words = thing.split()
    return words[0] + (" (newest)" if thing.endswith("(newest)") else "")


def test_every_item_deleted_or_damaged_is_refused_clearly_or_read_whole(new_layout: LayoutFactory) -> None:
    layout, key = new_layout("probe")
    probe = write_history(layout, key)
    probe.writer.close()
    shapes = layout.things()
    assert any(t.startswith("log") for t in shapes) and any(t.startswith("base") for t in shapes)
    seen: list[str] = []
    problems: list[str] = []
    for index in range(len(shapes)):
        for action in ("delete", "corrupt"):
            layout, key = new_layout(f"{index}-{action}")
            written = write_history(layout, key)
            try:
                thing = layout.things()[index]
                layout.damage(thing, action)
                case = (_kind(layout), action, _shape(thing))
                try:
                    outcome, state, error = _load(layout, key)
                    seen.append(f"{case}: {outcome} {error}")
                    _check_reader(case, thing, outcome, state, error, written.latest)
                    _check_writer_goes_on(layout, key, written, outcome)
                except Exception as exc:
                    problems.append(f"{case} {thing}: {type(exc).__name__}: {exc}")
            finally:
                written.writer.close()
    print("\n".join(seen))
    assert not problems, "\n".join(problems)


def _check_reader(
    case: tuple[str, str, str], thing: str, outcome: str, state: GroupState | None, error: str, latest: GroupState
) -> None:
    kind, action, shape = case
    if outcome == "state":
        assert state is not None
        if case in UNDETECTABLE:
            assert state.revision == latest.revision - 1, case
        else:
            assert state == latest, (
                f"{case}: an older state read as the newest (revision {state.revision} < {latest.revision})"
            )
        return
    if outcome == "absent":
        assert action == "delete" and shape == "base", f"{case}: a damaged state read as no state at all"
        return
    assert outcome == "damaged", f"{case}: {outcome}: {error}"
    if kind == "v3io":
        named = thing.split()[1]
    else:
        named = f"version {thing.split()[1]}" if shape.startswith("log") else "base row"
    assert named in error, error
    assert "refusing" in error and ("restore" in error or "delete" in error), error


def _check_writer_goes_on(layout: Layout, key: str, written: Written, outcome: str) -> None:
    """A host that never saw the key, then the writer that holds the newest version, each write once (the order
    that would fork the history if the first one read an older state); a fresh reader then reads the last write
    or refuses."""
    if outcome == "absent":  # a lost state: a new one is created and written on
        fresh = layout.store()
        try:
            created = tick(fresh, key, "b", 100.0, 1000)
            created = tick(fresh, key, "b", 101.0, 1010)
            again = layout.store()
            assert again.load(key)[0] == created
            again.close()
        finally:
            fresh.close()
        return
    results: list[GroupState] = []
    for store in (layout.store(), written.writer):
        try:
            results.append(tick(store, key, "a", 50.0 + len(results), 500 + len(results)))
        except (StateDamagedError, StateFormatError):
            pass
        except Exception as exc:  # a conflict under every attempt is a stuck group, not a refusal
            raise AssertionError(f"{type(exc).__name__}: {exc}") from exc
    if not results:
        return
    outcome_after, state, _ = _load(layout, key)
    if outcome_after == "state":
        assert state == results[-1], "a fresh reader reads a state that is not the last write"
