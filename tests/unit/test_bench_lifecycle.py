"""The topic-lifecycle bench's check, on fabricated evidence: each way of losing or doubling a record is reported,
and each event kind names exactly the records it may."""

from __future__ import annotations

import pytest

from bench.lifecycle import v3io
from bench.lifecycle.check import Event, Evidence, ReadRange, Version, check, payload, summary
from bench.lifecycle.run import KINDS, main, plan

V0 = Version("t", 0, "ID0", 1, 0.0)
V1 = Version("t", 1, "ID1", 1, 100.0)


def acked(version: Version, offsets: range) -> dict[tuple[str, int, int], dict[int, bytes]]:
    return {(version.topic, version.number, 0): {o: payload(version.topic, version.number, 0, o) for o in offsets}}


def read(version: Version, start: int, end: int, offsets: range | None = None) -> ReadRange:
    got = range(start, end) if offsets is None else offsets
    records = tuple((o, payload(version.topic, version.number, 0, o)) for o in got)
    return ReadRange("t:0", version.topic_id, start, end, records)


def evidence(reads: list[ReadRange], events: list[Event] | None = None, final: set[str] | None = None) -> Evidence:
    return Evidence(
        versions=[V0, V1],
        acked={**acked(V0, range(10)), **acked(V1, range(5))},
        reads=reads,
        events=events or [],
        final_topics={"t"} if final is None else final,
    )


def recreated(start: int, at: float = 100.0) -> Event:
    return Event("recreated", "t:0", start, None, "... (identity ID0 -> ID1): offsets ... not read", at)


def test_every_record_read_once_passes() -> None:
    verdict = check(evidence([read(V0, 0, 10), read(V1, 0, 5)]))
    assert verdict.failures == [] and verdict.read == 15 == verdict.acknowledged


def test_an_unread_record_no_event_names_is_lost() -> None:
    verdict = check(evidence([read(V0, 0, 8), read(V1, 0, 5)]))
    assert verdict.lost == 2 and verdict.failures == ["lost 2"]


def test_a_recreated_event_names_the_old_versions_unread_records_only() -> None:
    verdict = check(evidence([read(V0, 0, 8), read(V1, 0, 5)], [recreated(8)]))
    assert verdict.failures == [] and verdict.reported == {"recreated": 2}
    new_unread = check(evidence([read(V0, 0, 8), read(V1, 0, 3)], [recreated(8)]))
    assert new_unread.lost == 2, "the event names the old version, not the new one"
    too_late = check(evidence([read(V0, 0, 8), read(V1, 0, 5)], [recreated(9)]))
    assert too_late.lost == 1, "offset 8 is below what the event names"


def test_a_data_loss_event_is_given_to_the_version_the_group_held_then() -> None:
    loss_old = Event("data_loss", "t:0", 8, 10, "offsets [8, 10) fell out of retention", 50.0)
    verdict = check(evidence([read(V0, 0, 8), read(V1, 0, 5)], [loss_old, recreated(10)]))
    assert verdict.failures == [] and verdict.reported == {"data_loss": 2}
    loss_new = Event("data_loss", "t:0", 0, 2, "offsets [0, 2) fell out of retention", 150.0)
    after = check(evidence([read(V0, 0, 10), read(V1, 2, 5)], [recreated(10), loss_new]))
    assert after.failures == [] and after.reported == {"data_loss": 2}
    wrong = check(evidence([read(V0, 0, 8), read(V1, 0, 5)], [recreated(8, at=10.0), loss_old]))
    assert wrong.reported == {"recreated": 2}, "an event after the switch names the new version's offsets"


def test_a_removed_event_counts_only_for_a_topic_off_the_list_at_the_end() -> None:
    removed = Event("removed", "t:0", 8, None, "'t' is on no member's list any more", 50.0)
    off = check(evidence([read(V0, 0, 8), read(V1, 0, 5)], [removed], final=set()))
    assert off.failures == [] and off.reported == {"removed": 2}
    back = check(evidence([read(V0, 0, 8), read(V1, 0, 5)], [removed], final={"t"}))
    assert back.lost == 2, "a topic put back on the list must be read to its end"


def test_records_of_a_version_that_lived_or_ended_off_the_lists_are_not_the_groups() -> None:
    """A topic taken off the lists at 40 (``removed`` names V0 from 8 on), deleted and created again as V1 at 100."""
    removed = Event("removed", "t:0", 8, None, "'t' is on no member's list any more", 50.0)
    base = vars(evidence([read(V0, 0, 8)], [removed], final=set()))
    never_back = check(Evidence(**{**base, "off_list": {"t": [(40.0, None)]}}))
    assert never_back.failures == [] and never_back.reported == {"removed": 2, "unlisted": 5}
    ended_off = [V0, V1, Version("t", 2, "ID2", 1, 150.0)]
    back_later = check(
        Evidence(**{**base, "versions": ended_off, "final_topics": {"t"}, "off_list": {"t": [(40.0, 160.0)]}})
    )
    assert back_later.failures == [] and back_later.reported == {"removed": 2, "unlisted": 5}, (
        "V0 and V1 ended before the topic was back on the lists"
    )
    back_alive = check(Evidence(**{**base, "final_topics": {"t"}, "off_list": {"t": [(40.0, 120.0)]}}))
    assert back_alive.lost == 5 and back_alive.reported == {"removed": 2}, "V1 was alive when put back: read it"
    back_before = check(Evidence(**{**base, "final_topics": {"t"}, "off_list": {"t": [(40.0, 90.0)]}}))
    assert back_before.lost == 7, "V0 was alive when put back: its records must be read"
    removed_before = check(Evidence(**{**base, "off_list": {"t": [(120.0, None)]}}))
    assert removed_before.lost == 7, "created before the removal: V1 is the group's, and the event came too early"


def test_a_record_read_twice_from_another_version_or_not_acknowledged_is_reported() -> None:
    twice = check(evidence([read(V0, 0, 10), read(V0, 5, 10), read(V1, 0, 5)]))
    assert twice.duplicates == 5 and "duplicates 5" in twice.failures
    other = ReadRange("t:0", "ID0", 0, 5, tuple((o, payload("t", 1, 0, o)) for o in range(5)))
    mixed = check(evidence([other, read(V0, 5, 10), read(V1, 0, 5)]))
    assert mixed.payload_mismatches == 5, "the new topic's records under the old topic's range"
    assert mixed.lost == 5
    ghost = check(evidence([read(V0, 0, 12), read(V1, 0, 5)]))
    assert ghost.unacknowledged_seen == 2


def test_the_plan_holds_every_kind_and_the_summary_fails_on_errors() -> None:
    assert set(plan(8, 1)) == set(KINDS) and len(plan(20, 1)) == 20 and plan(20, 1) == plan(20, 1)
    line = summary(check(evidence([read(V0, 0, 10), read(V1, 0, 5)])), {"records": 15}, ["drain timed out"])
    assert line["passed"] is False and line["failures"] == ["error: drain timed out"] and line["records"] == 15


# v3io: one stream, shard ids are bare numbers, and each shard's log has an identity of its own.
S0 = Version("s", 0, "s#0", 2, 0.0)
S1 = Version("s", 1, "s#1", 2, 100.0)
SHARD_IDS = {"a0": ("s", 0), "a1": ("s", 0), "b0": ("s", 1), "b1": ("s", 1)}


def shard_read(version: Version, shard: int, identity: str, start: int, end: int) -> ReadRange:
    records = tuple((o, payload("s", version.number, shard, o)) for o in range(start, end))
    return ReadRange(str(shard), identity, start, end, records)


def per_shard(reads: list[ReadRange], events: list[Event] | None = None) -> Evidence:
    acked_records = {
        ("s", v.number, shard): {o: payload("s", v.number, shard, o) for o in range(1, 6)}
        for v in (S0, S1)
        for shard in (0, 1)
    }
    return Evidence([S0, S1], acked_records, reads, events or [], {"s"}, identities=SHARD_IDS, stream="s")


def everything_but(shard0_old_end: int) -> list[ReadRange]:
    return [
        shard_read(S0, 0, "a0", 1, shard0_old_end),
        shard_read(S0, 1, "a1", 1, 6),
        shard_read(S1, 0, "b0", 1, 6),
        shard_read(S1, 1, "b1", 1, 6),
    ]


def test_v3io_shape_per_shard_identities_and_bare_shard_ids() -> None:
    """Each read is placed by its shard's own identity; bare shard ids are shards of ``Evidence.stream``."""
    verdict = check(per_shard(everything_but(6)))
    assert verdict.failures == [] and verdict.read == 20 == verdict.acknowledged
    lost = check(per_shard(everything_but(4)))
    assert lost.lost == 2 and lost.failures == ["lost 2"]


def test_v3io_shape_a_recreated_event_names_the_old_shard_logs_unread_records() -> None:
    event = Event("recreated", "0", 4, None, "the log of shard 0 was deleted and created again (identity a0 -> b0)", 1)
    verdict = check(per_shard(everything_but(4), [event]))
    assert verdict.failures == [] and verdict.reported == {"recreated": 2}
    other_shard = Event("recreated", "1", 4, None, "... (identity a1 -> b1): ...", 1.0)
    assert check(per_shard(everything_but(4), [other_shard])).lost == 2, "shard 1's event names none of shard 0"


def test_v3io_shape_reads_under_an_identity_of_another_version_or_stream_are_caught() -> None:
    swapped = everything_but(6)
    swapped[2] = ReadRange("0", "a0", 1, 6, swapped[2].records)  # the new log's records under the old log's range
    verdict = check(per_shard(swapped))
    assert verdict.payload_mismatches == 5 and verdict.lost == 5
    foreign = everything_but(6)
    foreign[0] = ReadRange("0", "z9", 1, 6, foreign[0].records)
    unknown = check(per_shard(foreign))
    assert unknown.unacknowledged_seen == 5 and unknown.lost == 5
    elsewhere = per_shard([ReadRange("0", "x", 1, 6, everything_but(6)[0].records)])
    elsewhere.identities = {**SHARD_IDS, "x": ("t", 0)}
    assert check(elsewhere).unacknowledged_seen == 5, "an identity of another stream is not this stream's"


def test_the_backend_option_chooses_the_v3io_run_and_its_plan_holds_every_kind_of_its_store() -> None:
    """``python -m bench.lifecycle --backend v3io --help`` is the v3io run's; the SQLite store has no head item."""
    with pytest.raises(SystemExit) as stopped:
        main(["--backend", "v3io", "--help"])
    assert stopped.value.code == 0
    with pytest.raises(SystemExit):
        main(["--backend", "v3io", "--topics", "2"])  # a Kafka option: refused by the v3io run's parser
    assert v3io.parse([]).kinds == v3io.SQLITE_KINDS and "state_delete_head" not in v3io.SQLITE_KINDS
    on_v3io = v3io.parse(["--store", "v3io"])
    assert on_v3io.kinds == v3io.KINDS and set(plan_of(on_v3io)) == set(v3io.KINDS)
    assert v3io.plan(10, 1, v3io.SQLITE_KINDS) == v3io.plan(10, 1, v3io.SQLITE_KINDS) and len(plan_of(on_v3io)) == 10
    chosen = v3io.parse(["--store", "v3io", "--kinds", "state_delete_head,attribute_reset"])
    assert set(plan_of(chosen)) == {"state_delete_head", "attribute_reset"}
    with pytest.raises(SystemExit):
        v3io.parse(["--kinds", "state_delete_head"])  # no head item in the SQLite store: refused, named


def plan_of(options: v3io.Options) -> list[str]:
    return v3io.plan(options.operations, options.seed, options.kinds)
