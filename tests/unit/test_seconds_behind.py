"""Seconds behind and the lag check over records and seconds: pure functions, no stream."""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg
from hypothesis import given
from hypothesis import strategies as st

from dagster_streamgroup.dagster.checks import lag_check_result
from dagster_streamgroup.streams.base import Watermarks, seconds_behind, seconds_behind_at

KEY = dg.AssetKey("clicks")


class _Times:
    """A backend that only answers record times (the one call ``seconds_behind`` makes), recording the asks."""

    def __init__(self, times: Mapping[str, int | None]) -> None:
        self.times = dict(times)
        self.asked: list[dict[str, int]] = []

    def record_times(self, offsets: Mapping[str, int]) -> dict[str, int | None]:
        self.asked.append(dict(offsets))
        return {s: self.times.get(s) for s in offsets}


@given(
    now=st.integers(0, 2**42),
    committed=st.integers(0, 10**9),
    extra=st.integers(-5, 10**6),
    stamp=st.one_of(st.none(), st.integers(0, 2**42)),
)
def test_seconds_behind_is_never_negative_and_zero_when_caught_up(
    now: int, committed: int, extra: int, stamp: int | None
) -> None:
    end = committed + extra
    value = seconds_behind_at(now, committed, end, stamp)
    assert value >= 0.0
    if extra <= 0 or stamp is None:
        assert value == 0.0
    else:
        assert value == max(0.0, (now - stamp) / 1000)


def test_record_times_are_asked_only_for_the_shards_that_lag() -> None:
    backend = _Times({"a": 1_000, "b": 5_000})
    marks = {"a": Watermarks(0, 10), "b": Watermarks(0, 7), "c": Watermarks(0, 3)}
    out = seconds_behind(backend, {"a": 4, "b": 7, "c": None, "gone": 2}, marks, now_ms=11_000)  # type: ignore[arg-type]
    assert out == {"a": 10.0, "b": 0.0}
    assert backend.asked == [{"a": 4}]
    caught_up = _Times({})
    assert seconds_behind(caught_up, {"b": 7}, marks, now_ms=1) == {"b": 0.0}  # type: ignore[arg-type]
    assert caught_up.asked == []


def test_an_open_transactions_records_count_as_lag_from_their_time() -> None:
    """Records an open transaction holds are written, so lag counts them; their time is the record's own."""
    backend = _Times({"a": 2_000})
    marks = {"a": Watermarks(0, 5, uncommitted_high=9)}
    assert seconds_behind(backend, {"a": 5}, marks, now_ms=4_000) == {"a": 2.0}  # type: ignore[arg-type]


def test_the_lag_check_fails_by_records_by_seconds_or_by_both() -> None:
    lags, seconds = {"a": 10, "b": 500}, {"a": 120.0, "b": 1.0}
    by_records = lag_check_result(KEY, lags, 100, seconds, None)
    assert not by_records.passed and by_records.description == "b is 500 records behind (limit 100)"
    by_seconds = lag_check_result(KEY, lags, None, seconds, 60.0)
    assert not by_seconds.passed and by_seconds.description == "a is 120.0 s behind (limit 60 s)"
    both = lag_check_result(KEY, lags, 100, seconds, 60.0)
    assert both.description == "a is 120.0 s behind (limit 60 s); b is 500 records behind (limit 100)"
    assert lag_check_result(KEY, lags, 1_000, seconds, 600.0).passed
    assert both.metadata["seconds_behind a"] == dg.MetadataValue.float(120.0)
    assert both.metadata["max_seconds_behind"] == dg.MetadataValue.float(120.0)
    assert both.metadata["limit_seconds"] == dg.MetadataValue.float(60.0)
    assert both.metadata["lag b"] == dg.MetadataValue.int(500)
