import json

import pytest

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import ForeignStateError, NewerSchemaError, decode_state, encode_state
from tests.unit.protocol_helpers import POLICY, balanced_start, marks


def test_round_trip_keeps_every_field() -> None:
    state = balanced_start(3, ("a", "b"))
    state, _ = protocol.plan(state, "a", 5.0, marks(state), POLICY)
    state = protocol.sync_shards(state, ["late"], 6.0, predecessors={"late": frozenset({"s0"})})
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


def test_a_version_1_state_reads_and_is_written_back_at_the_current_version() -> None:
    """Version 2 added ``retry_end`` and ``ahead_since``: a version-1 state has neither; once written back
    at version 2, a member of the older version refuses it instead of dropping them."""
    state = balanced_start(2, ("a",))
    raw = json.loads(encode_state(state))
    raw["schema_version"] = 1
    for shard in raw["shards"].values():
        del shard["retry_end"], shard["ahead_since"]
    old = decode_state(json.dumps(raw), where="t")
    assert old.schema_version == protocol.state.SCHEMA_VERSION == 2
    assert old.shards == state.shards
