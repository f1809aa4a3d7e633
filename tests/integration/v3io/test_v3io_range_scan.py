"""GetItems range scans on the project's v3io server, through the real client: the items of one sharding key
(the part of the name left of its leftmost period) whose sorting key lies in [start, end), in order, paged by
markers. The v3io state store lists its log this way."""

from __future__ import annotations

from typing import Any

import pytest
from v3io.dataplane import RaiseForStatus

from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io.conftest import CONTAINER

pytestmark = pytest.mark.v3io


def test_a_range_scan_returns_one_sharding_key_in_sorting_key_order(v3io_client: Any) -> None:
    table = unique_v3io_name("ranges")
    names = ["a", "a.1", "a.2", "a.3.x", "a.30", "a-b.1", "ab.1", "b.2", "a.b.c"]
    for name in names:
        v3io_client.kv.put(CONTAINER, table, name, {"n": 1})

    def scan(**kwargs: Any) -> list[str]:
        cursor = v3io_client.kv.new_cursor(CONTAINER, table + "/", attribute_names=["__name"], limit=None, **kwargs)
        return [item["__name"] for item in cursor.all()]

    assert scan(sharding_key="a") == ["a", "a.1", "a.2", "a.3.x", "a.30", "a.b.c"]
    assert scan(sharding_key="a", sort_key_range_start="2") == ["a.2", "a.3.x", "a.30", "a.b.c"]
    assert scan(sharding_key="a", sort_key_range_start="2", sort_key_range_end="30") == ["a.2", "a.3.x"]
    assert scan(sharding_key="b") == ["b.2"]
    assert scan(sharding_key="zz") == []


def test_a_range_scan_pages_with_markers(v3io_client: Any) -> None:
    table = unique_v3io_name("pages")
    for i in range(25):
        v3io_client.kv.put(CONTAINER, table, f"k.{i:04d}", {"n": i})
    v3io_client.kv.put(CONTAINER, table, "l.0000", {"n": -1})
    first = v3io_client.kv.scan(CONTAINER, table + "/", attribute_names=["__name", "n"], sharding_key="k",
                                sort_key_range_start="0005", limit=10).output  # fmt: skip
    assert [i["n"] for i in first.items] == list(range(5, 15)) and not first.last
    rest = v3io_client.kv.scan(CONTAINER, table + "/", attribute_names=["n"], sharding_key="k",
                               sort_key_range_start="0005", marker=first.next_marker, limit=100).output  # fmt: skip
    assert [i["n"] for i in rest.items] == list(range(15, 25)) and rest.last


def test_a_range_scan_refuses_what_the_platform_refuses(v3io_client: Any) -> None:
    table = unique_v3io_name("refused")
    v3io_client.kv.put(CONTAINER, table, "k.1", {"n": 1})
    never = RaiseForStatus.never
    without_key = v3io_client.kv.scan(CONTAINER, table + "/", sort_key_range_start="1", raise_for_status=never)
    assert without_key.status_code == 400 and b"ShardingKey" in without_key.body
    with_segments = v3io_client.kv.scan(CONTAINER, table + "/", sharding_key="k", segment=0, total_segments=2,
                                        raise_for_status=never)  # fmt: skip
    assert with_segments.status_code == 400 and b"cannot be combined" in with_segments.body
