"""The lifecycle run over a v3io stream in its short setting: a group of three members drains 4,000 records while
the stream is deleted and created again (with one shard fewer and one more), shards are added, the group's state
loses its base row and one of its log rows (the second refused by the store, then the operator's documented
recovery), and a shard's committed-sequence attribute is set by hand (Nuclio's replay), one operation of each kind.
Every record of each stream version must be read exactly once by a committed run, or named by an event; the replay
must be refused and the attribute restored; the backlog must drain.

``python -m bench.lifecycle --backend v3io`` is the long setting (50,000 records, 10 operations)."""

from __future__ import annotations

import json

import pytest

from bench.lifecycle.v3io import SQLITE_KINDS, parse, plan, run_lifecycle

pytestmark = [pytest.mark.slow, pytest.mark.v3io, pytest.mark.timeout(300)]

COMMAND = "python -m bench.lifecycle --backend v3io --records 4000 --operations 6 --rate 400 --timeout 120"
"""The short setting as docs/reliability.md shows it."""
SHORT = parse(COMMAND.split()[5:])


def test_the_short_setting_reads_every_record_of_every_stream_version_once_or_names_it() -> None:
    assert SHORT.kinds == SQLITE_KINDS and SHORT.operations == len(SQLITE_KINDS)
    assert set(plan(SHORT.operations, SHORT.seed, SHORT.kinds)) == set(SQLITE_KINDS), "one of each kind"
    result = run_lifecycle(SHORT)
    print(json.dumps(result))
    assert result["failures"] == [], result
    assert result["passed"] is True and result["backend"] == "v3io" and result["store"] == "sqlite"
    assert result["operations_by_kind"] == dict.fromkeys(sorted(SQLITE_KINDS), 1)
    assert result["records"] == SHORT.records == result["acknowledged"]
    assert result["lost"] == 0 and result["duplicates"] == 0 and result["payload_mismatches"] == 0
    assert result["read"] + sum(result["reported_unread"].values()) == result["acknowledged"]
    assert result["stream_versions"] == 3
    assert result["events"].get("recreated", 0) >= 2, "two recreations, each named per shard"
    assert result["attribute_resets"] == {"refused": 1} and result["events"].get("reset_refused", 0) >= 1
    assert result["state_deletes"] == {"base_lost": 1, "log_refused": 1}


V3IO_STORE = (
    "python -m bench.lifecycle --backend v3io --store v3io --kinds "
    "state_delete_base,state_delete_head,state_delete_log,attribute_reset --records 3000 --operations 4 --rate 400 "
    "--timeout 120"
)
"""The state in v3io items, each kind of item deleted once (and a replay), as docs/reliability.md shows it: no
recreation, which that store does not survive (its items live in the stream's directory)."""


def test_the_v3io_store_refuses_or_loses_each_deleted_item_and_the_documented_recovery_reads_everything_once() -> None:
    options = parse(V3IO_STORE.split()[5:])
    assert set(plan(options.operations, options.seed, options.kinds)) == set(options.kinds) and len(options.kinds) == 4
    result = run_lifecycle(options)
    print(json.dumps(result))
    assert result["failures"] == [], result
    assert result["store"] == "v3io" and result["stream_versions"] == 1
    assert result["state_deletes"] == {"base_lost": 1, "head_refused": 1, "log_refused": 1}
    assert result["attribute_resets"] == {"refused": 1}
    assert result["read"] == result["acknowledged"] == options.records, "nothing unread, nothing named"
    assert result["lost"] == 0 and result["duplicates"] == 0 and result["payload_mismatches"] == 0
