import json

import pytest

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import ForeignStateError, NewerSchemaError, codec, decode_state, encode_state
from tests.unit.protocol_helpers import POLICY, balanced_start, marks


def test_round_trip_keeps_every_field() -> None:
    state = balanced_start(3, ("a", "b"))
    state, _ = protocol.plan(state, "a", 5.0, marks(state), POLICY)
    state = protocol.sync_shards(state, ["late"], 6.0)
    assert decode_state(encode_state(state), where="t") == state


@pytest.mark.parametrize(
    ("text", "error", "words"),
    [
        (json.dumps({"schema_version": "0.0.1", "session_states": []}), ForeignStateError, "v3io-go/Nuclio"),
        (json.dumps({"kind": "something-else", "schema_version": 1}), ForeignStateError, "not a dagster-streamgroup"),
        ("not json", ForeignStateError, "not JSON"),
        ("[1, 2]", ForeignStateError, "JSON list"),
        (
            json.dumps({"kind": "dagster-streamgroup/group-state", "schema_version": 99}),
            NewerSchemaError,
            "newer dagster-streamgroup",
        ),
        (json.dumps({"kind": "dagster-streamgroup/group-state", "schema_version": 1}), ForeignStateError, "validate"),
    ],
)
def test_foreign_or_newer_states_are_refused(text: str, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        decode_state(text, where="store:key")


def test_older_states_read_and_are_written_back_at_the_current_version() -> None:
    """Version 2 added ``retry_end`` and ``ahead_since``; version 3 the last committer's member and epoch, the
    dead letters and the unrecorded runs, and dropped successor gating. An older state has none of the new
    fields (and may carry the dropped one); version 4 the relaunch count of a range in flight
    (test_launch_failures.py); version 5 a backfill's lease on a shard (test_lease.py). Once written back at the
    current version, a member of an older version refuses it instead of dropping fields."""
    state = balanced_start(2, ("a",))
    for version, removed, added in [
        (
            1,
            ("retry_end", "ahead_since", "last_commit_member", "last_commit_epoch", "lease"),
            {"pending_predecessors": []},
        ),
        (2, ("last_commit_member", "last_commit_epoch", "lease"), {"pending_predecessors": []}),
        (4, ("lease",), {}),
    ]:
        raw = json.loads(encode_state(state))
        raw["schema_version"] = version
        del raw["dead_letters"], raw["unrecorded_runs"]
        for shard in raw["shards"].values():
            for name in removed:
                del shard[name]
            shard.update(added)
        old = decode_state(json.dumps(raw), where="t")
        assert old.schema_version == protocol.state.SCHEMA_VERSION == 5
        assert old.shards == state.shards and old.dead_letters == () and old.unrecorded_runs == {}


def test_a_version_4_state_reads_with_no_identity_no_scope_and_untyped_parks() -> None:
    """Version 5 added the stream's life: each shard's log identity, the repositioning that fences ranges, when its
    log went missing and whether its part was removed, the cause of a park, the parts each member consumes, and the
    key a state moved to. A version-4 state has none: its shards adopt their log's identity at the next tick (there
    is nothing to compare with), its members consume the whole stream, and its parks keep their reason."""
    state = balanced_start(2, ("a", "b"))
    shard = state.shards["s0"]
    parked = protocol.Parked(start=3, end=5, reason="run failed 3 time(s)", at=1.0)
    state = state.model_copy(update={"shards": {**state.shards, "s0": protocol.state.evolve(shard, parked=parked)}})
    raw = json.loads(encode_state(state))
    raw["schema_version"] = 4
    del raw["moved_to"]
    for member in raw["members"].values():
        del member["scope"]
    for one in raw["shards"].values():
        for name in ("identity", "repositioned", "missing_since", "removed"):
            del one[name]
        if one["parked"] is not None:
            del one["parked"]["cause"]
    old = decode_state(json.dumps(raw), where="t")
    assert old.schema_version == 5 and old.moved_to is None
    assert old == state, "every field of version 4 reads as it was, the new ones at their defaults"
    assert all(m.scope is None for m in old.members.values())
    assert old.shards["s0"].parked == parked and parked.cause == ""
    assert all(s.identity is None and s.repositioned is None and not s.removed for s in old.shards.values())
    view = protocol.StreamView(shards=("s0", "s1"), identities={"": "log-1"})
    adopted = protocol.sync_log(old, view, "a", 10.0, POLICY)
    assert [e.kind for e in adopted.events] == [], "a state that kept no identity adopts the current one silently"
    assert {s.identity for s in adopted.shards.values()} == {"log-1"}
    committed = {sid: s.committed for sid, s in old.shards.items()}
    assert {sid: s.committed for sid, s in adopted.shards.items()} == committed


def test_the_same_stored_text_is_decoded_once() -> None:
    state = balanced_start(3, ("a", "b"))
    text = encode_state(state)
    first = decode_state(text, where="t")
    again = decode_state("".join(list(text)), where="t")  # an equal text, another object: as a store loads it
    assert again is first and first == state
    later = decode_state(encode_state(state.model_copy(update={"revision": 7})), where="t")
    assert later.revision == 7 and later is not first


def test_a_text_that_fails_to_decode_raises_every_time_and_the_kept_texts_are_bounded() -> None:
    for _ in range(2):
        with pytest.raises(ForeignStateError, match="not JSON"):
            decode_state("not json", where="t")
    state = balanced_start(2, ("a",))
    for revision in range(codec.DECODED_KEPT + 4):
        decode_state(encode_state(state.model_copy(update={"revision": revision})), where="t")
    assert codec._decode.cache_info().currsize == codec.DECODED_KEPT
