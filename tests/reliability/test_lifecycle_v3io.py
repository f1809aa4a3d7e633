"""A v3io stream over the group's whole life, against the local v3io server with the real ``v3io`` client: the
stream deleted and created again at its path (below and past the committed offset, under a range in flight), and
the state store lost after a ``seek="latest"`` start.

The same cases as ``test_lifecycle.py`` for Kafka, through the same protocol hooks: the backend gives each shard's
log an identity (a marker attribute on the shard object, see ``streams/v3io.py``), so a re-created stream is a
``recreated`` event and follows ``on_recreated``, never a skip.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dagster_streamgroup import protocol
from dagster_streamgroup.member import update_state
from dagster_streamgroup.protocol import GroupState, Launch
from dagster_streamgroup.stores.base import StateStore
from dagster_streamgroup.stores.sql import SqlStateStore
from dagster_streamgroup.stores.v3io import V3ioStateStore
from dagster_streamgroup.streams.v3io import IDENTITY_ATTRIBUTE, V3ioBackend, committed_attribute
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io.conftest import CONTAINER, NewStream, put
from tests.reliability.conftest import commit_in_flight, member_of

pytestmark = pytest.mark.v3io


def spans(launches: list[Launch]) -> list[tuple[str, int, int]]:
    return sorted((x.shard, x.start, x.end) for x in launches)


def recreate(client: Any, backend: V3ioBackend, shards: int) -> None:
    """The stream deleted and created again at the same path (its shards' sequence numbers from 1 again)."""
    client.stream.delete(CONTAINER, backend.config.stream_path)
    client.stream.create(CONTAINER, backend.config.stream_path, shard_count=shards)


def unpark(member: Any, shard: str) -> None:
    def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, None]:
        assert current is not None
        return protocol.unpark(current, shard, now), None

    update_state(member.store, member.key, transition)


def test_each_shard_log_has_an_identity_that_a_recreated_stream_changes(
    new_stream: NewStream, v3io_client: Any
) -> None:
    """A shard object gets its marker once (any reader may write it, the first one wins); an empty shard has no
    object, so no identity yet; the stream created again at the path gives its shards new ones."""
    backend = new_stream(2)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"a"])
    first = backend.listing().identities
    assert set(first) == {"0"}, "an empty shard has no object to carry an identity"
    assert backend.identities(["0", "1"]) == first == backend.listing().identities, "stable while the log lives"
    stored = v3io_client.kv.get(CONTAINER, path, "0", attribute_names=[IDENTITY_ATTRIBUTE]).output.item
    assert stored == {IDENTITY_ATTRIBUTE: first["0"]}
    recreate(v3io_client, backend, 2)
    put(v3io_client, path, 0, [b"b"])
    assert backend.identities(["0"])["0"] != first["0"]


def test_members_listing_a_shard_at_once_agree_on_its_identity(new_stream: NewStream, v3io_client: Any) -> None:
    """The marker is written conditionally on its absence: of members racing to mark a shard, one wins and every
    one of them reads that id (a member whose write lost reads the winner's)."""
    backend = new_stream(3)
    path = backend.config.stream_path
    for shard in range(3):
        put(v3io_client, path, shard, [b"a"])
    seen: list[dict[str, str]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def lister() -> None:
        other = V3ioBackend(backend.config)
        try:
            start.wait()
            seen.append(other.identities(["0", "1", "2"]))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            other.close()

    threads = [threading.Thread(target=lister) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and len(seen) == 6
    assert all(ids == seen[0] for ids in seen) and len(set(seen[0].values())) == 3, seen


@pytest.mark.parametrize("new_records", [5, 30], ids=["below the committed offset", "past the committed offset"])
@pytest.mark.parametrize("on_recreated", ["park", "earliest"])
def test_a_recreated_stream_is_an_event_and_follows_on_recreated(
    new_stream: NewStream, v3io_client: Any, sqlite_url: str, on_recreated: str, new_records: int
) -> None:
    """Issue 52 case 1: committed at 21, the stream deleted and created again with 5 (or 30) records. The old
    backend listed no identity, so the group waited for the offset (5) or read ``[21, 31)`` (30): records 1-20 of
    the new stream never read, no event."""
    backend = new_stream(1)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"old"] * 20)
    overrides = {} if on_recreated == "park" else {"on_recreated": on_recreated}
    member = member_of(SqlStateStore(sqlite_url), backend, unique_v3io_name("g"), **overrides)
    assert spans(member.tick().new_launches) == [("0", 1, 21)]
    commit_in_flight(member)
    recreate(v3io_client, backend, 1)
    put(v3io_client, path, 0, [b"new"] * new_records)
    report = member.tick()
    [event] = [e for e in report.new_events if e.kind == "recreated"]
    assert event.shard == "0" and event.start == 21, event
    if on_recreated == "park":
        assert report.new_launches == [], "nothing of the new stream is read past an offset of the old one"
        parked = report.state.shards["0"].parked
        assert parked is not None and "recreated" in parked.reason
        unpark(member, "0")
        report = member.tick()
    assert spans(report.new_launches) == [("0", 1, new_records + 1)], "the new stream is read from its first record"
    commit_in_flight(member)
    attribute = committed_attribute(member.group)
    stored = v3io_client.kv.get(CONTAINER, path, "0", attribute_names=[attribute]).output.item
    assert stored == {attribute: new_records}, "the mirror counts in the new stream"


def v3io_store_url(backend: V3ioBackend, directory: str = "") -> str:
    config = backend.config
    return f"v3io://{config.endpoint.split('://', 1)[1]}/{config.container}{'/' + directory if directory else ''}"


@pytest.mark.parametrize("directory", ["", "streamgroup"], ids=["beside the stream", "in a directory of its own"])
def test_a_v3io_state_outlives_a_recreated_stream_only_in_a_directory_of_its_own(
    new_stream: NewStream, v3io_client: Any, v3io_server: Any, monkeypatch: pytest.MonkeyPatch, directory: str
) -> None:
    """Deleting a stream deletes every item of its directory, the state items beside its shards included: that
    state is lost with the stream (the group starts the new stream from its seek policy, and the old stream's
    unread records are named by no event). A store URL that names a directory keeps the state out of the stream's,
    so the re-created stream is a ``recreated`` event as with a SQL store."""
    monkeypatch.setenv("V3IO_ACCESS_KEY", v3io_server.access_key.get_secret_value())
    backend = new_stream(1)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"old"] * 20)
    store: StateStore = V3ioStateStore.from_url(v3io_store_url(backend, directory))
    group = unique_v3io_name("g")
    member = member_of(store, backend, group)
    assert spans(member.tick().new_launches) == [("0", 1, 21)]
    commit_in_flight(member)
    put(v3io_client, path, 0, [b"unread"] * 4)
    recreate(v3io_client, backend, 1)
    put(v3io_client, path, 0, [b"new"] * 30)
    report = member.tick()
    recreated = [e for e in report.new_events if e.kind == "recreated"]
    if directory:
        assert [(e.shard, e.start) for e in recreated] == [("0", 21)], recreated
        assert report.new_launches == [] and report.state.shards["0"].parked is not None
    else:
        assert recreated == [] and report.state.shards["0"].identity is not None, "a new group: nothing to compare"
        assert spans(report.new_launches) == [("0", 1, 31)], "the new stream from its seek policy (earliest)"


def test_a_range_in_flight_when_its_stream_is_recreated_is_refused(
    new_stream: NewStream, v3io_client: Any, sqlite_url: str
) -> None:
    """A run that read the old stream and commits after it was re-created (and grew past the range) is refused:
    its offsets count in a log that is gone, and nothing is mirrored onto the new one."""
    backend = new_stream(1)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"old"] * 10)
    member = member_of(SqlStateStore(sqlite_url), backend, unique_v3io_name("g"))
    assert spans(member.tick().new_launches) == [("0", 1, 11)]
    recreate(v3io_client, backend, 1)
    put(v3io_client, path, 0, [b"new"] * 15)
    [outcome] = commit_in_flight(member).values()
    assert not outcome.accepted and outcome.refusal is not None, outcome
    attribute = committed_attribute(member.group)
    stored = v3io_client.kv.get(CONTAINER, path, "0", attribute_names=[attribute]).output.item
    assert attribute not in stored, "no offset of the old stream lands on the new one"


def test_a_lost_state_resumes_where_seek_latest_first_put_the_shards(
    new_stream: NewStream, v3io_client: Any, tmp_path: Path
) -> None:
    """Issue 52 case 2: a shard positioned by ``seek="latest"`` is mirrored into its committed-sequence attribute
    at once, so a state lost before the first commit resumes there, not from the seek policy again."""
    backend = new_stream(2)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"x"] * 4)
    put(v3io_client, path, 1, [b"y"] * 5)
    group = unique_v3io_name("g")
    lost = member_of(SqlStateStore(f"sqlite:///{tmp_path / 'lost.db'}"), backend, group, seek="latest")
    assert lost.tick().new_launches == []
    assert backend.committed(group, ["0", "1"]) == {"0": 5, "1": 6}, "mirrored at once"
    put(v3io_client, path, 0, [b"w"] * 3)
    put(v3io_client, path, 1, [b"w"] * 2)
    fresh = member_of(SqlStateStore(f"sqlite:///{tmp_path / 'fresh.db'}"), backend, group, seek="latest")
    assert spans(fresh.tick().new_launches) == [("0", 5, 8), ("1", 6, 8)]


def test_a_lost_state_reads_a_shard_that_was_empty_from_its_first_record(
    new_stream: NewStream, v3io_client: Any, tmp_path: Path
) -> None:
    """Issue 52 case 2, the empty shard: ``seek="latest"`` positioned it at 1, but a shard without records has no
    object to hold the committed attribute. The group's marker item beside the shards says the group had
    positioned the stream, so after the state is lost the records written since are read from 1, not skipped by
    the seek policy; a group that never ran still starts at latest."""
    backend = new_stream(2)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"x"] * 4)
    group = unique_v3io_name("g")
    lost = member_of(SqlStateStore(f"sqlite:///{tmp_path / 'lost.db'}"), backend, group, seek="latest")
    assert lost.tick().new_launches == []
    put(v3io_client, path, 1, [b"y"] * 3)
    fresh = member_of(SqlStateStore(f"sqlite:///{tmp_path / 'fresh.db'}"), backend, group, seek="latest")
    assert spans(fresh.tick().new_launches) == [("1", 1, 4)]
    other = member_of(
        SqlStateStore(f"sqlite:///{tmp_path / 'other.db'}"), backend, unique_v3io_name("g"), seek="latest"
    )
    assert other.tick().new_launches == [], "a new group still starts where seek says"


def _set_attribute(client: Any, path: str, shard: int, attribute: str, value: int) -> None:
    """What a Nuclio user does to replay a v3io-stream trigger's group: the attribute set on the shard directly."""
    client.kv.update(CONTAINER, path, str(shard), attributes={attribute: value})


def test_a_replay_set_on_the_committed_attribute_is_refused_visibly_and_the_mirror_restored(
    new_stream: NewStream, v3io_client: Any, sqlite_url: str
) -> None:
    """Issue 52 case 5: Nuclio's way to replay a group (``__<group>_committed_sequence_number`` set on a shard) was
    read as the group's own mirror: ignored by the tick and overwritten at the next commit, with no word. Now it
    is refused like a Kafka tool reset: a ``reset_refused`` event naming ``streamgroup reset``, the group reads on
    from its state, the mirror is restored; forwards over a backlog, nothing is skipped."""
    backend = new_stream(1)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"r"] * 20)
    group = unique_v3io_name("g")
    member = member_of(SqlStateStore(sqlite_url), backend, group)
    member.tick()
    commit_in_flight(member)
    attribute = committed_attribute(group)
    _set_attribute(v3io_client, path, 0, attribute, 4)  # replay from sequence number 5
    report = member.tick()
    [refused] = [e for e in report.new_events if e.kind == "reset_refused"]
    assert refused.shard == "0" and "streamgroup reset" in refused.detail, refused
    assert report.new_launches == [] and report.state.shards["0"].committed == 21
    assert backend.committed(group, ["0"]) == {"0": 21}, "the mirror is restored"

    more = put(v3io_client, path, 0, [b"m"] * 10)
    _set_attribute(v3io_client, path, 0, attribute, more[-1])  # "skip to the end"
    report = member.tick()
    assert len([e for e in report.new_events if e.kind == "reset_refused"]) == 1
    assert spans(report.new_launches) == [("0", 21, more[-1] + 1)], "the backlog is read, not skipped"
    assert backend.committed(group, ["0"]) == {"0": 21}


def test_an_attribute_written_before_the_mirror_marker_is_taken_over_silently(
    new_stream: NewStream, v3io_client: Any, sqlite_url: str
) -> None:
    """A group mirrored by an earlier version has the committed attribute without ``__<group>_streamgroup_mirrored``:
    where it holds the state's offset, the first tick marks it as the members' own, with no event."""
    backend = new_stream(1)
    path = backend.config.stream_path
    put(v3io_client, path, 0, [b"r"] * 8)
    group = unique_v3io_name("g")
    member = member_of(SqlStateStore(sqlite_url), backend, group)
    member.tick()
    commit_in_flight(member)
    mirror = f"__{group}_streamgroup_mirrored"
    v3io_client.kv.update(CONTAINER, path, "0", expression=f"REMOVE {mirror}")
    assert mirror not in v3io_client.kv.get(CONTAINER, path, "0", attribute_names=[mirror]).output.item
    report = member.tick()
    assert [e.kind for e in report.new_events if e.kind in ("reset_refused", "adopted")] == []
    stored = v3io_client.kv.get(CONTAINER, path, "0", attribute_names=[mirror]).output.item
    assert stored == {mirror: 8}
