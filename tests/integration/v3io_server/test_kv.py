"""KV items through the real client: typed attributes, system attributes, update modes, update and condition
expressions, GetItems with filters, attribute lists, limits, segments and the cursor."""

from __future__ import annotations

import array
import datetime
from typing import Any

import pytest

from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io_server.helpers import CONTAINER, NEVER, error_of

pytestmark = pytest.mark.v3io

CONDITION_FALSE = "16777244"


@pytest.fixture
def table() -> str:
    return unique_v3io_name("table")


def _is_condition_false(response: Any) -> bool:
    """storey's and frames' check: 400, ``ErrorCode`` exactly once, and ``16777244`` in the body."""
    body = response.body.decode()
    return response.status_code == 400 and body.count("ErrorCode") == 1 and CONDITION_FALSE in body


def test_typed_attributes_round_trip(v3io_client: Any, table: str) -> None:
    when = datetime.datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=datetime.UTC)
    attributes = {
        "s": "text",
        "i": 42,
        "big": 2**62,
        "f": 3.5,
        "t": True,
        "bytes": b"\x00\xff",
        "ints": [1, 2, 3],
        "floats": array.array("d", [1.5, 2.5]),
        "when": when,
    }
    v3io_client.kv.put(CONTAINER, table, "item1", attributes)
    item = v3io_client.kv.get(CONTAINER, table, "item1").output.item
    assert item == {**attributes, "floats": [1.5, 2.5]}
    assert type(item["t"]) is bool and type(item["i"]) is int


def test_system_attributes_and_selection(v3io_client: Any, table: str) -> None:
    v3io_client.kv.put(CONTAINER, table, "item", {"a": 1, "__hidden": 2})
    assert v3io_client.kv.get(CONTAINER, table, "item").output.item == {"a": 1}
    everything = v3io_client.kv.get(CONTAINER, table, "item", attribute_names=["**"]).output.item
    assert everything["__hidden"] == 2 and everything["__name"] == "item"
    assert everything["__size"] == 0 and everything["__obj_type"] == 1
    picked = v3io_client.kv.get(CONTAINER, table, "item", attribute_names=["__mtime_secs", "a", "missing"])
    assert set(picked.output.item) == {"__mtime_secs", "a"}

    refused = v3io_client.kv.put(CONTAINER, table, "item", {"__name": "x"}, raise_for_status=NEVER)
    assert refused.status_code == 400 and "__name" in error_of(refused)["ErrorMessage"]


def test_missing_item_is_no_such_file(v3io_client: Any, table: str) -> None:
    response = v3io_client.kv.get(CONTAINER, table, "missing", raise_for_status=NEVER)
    assert response.status_code == 404
    assert error_of(response) == {"ErrorCode": -2, "ErrorMessage": "No such file or directory"}


def test_transaction_verifier_and_strictly_increasing_mtime(v3io_client: Any, table: str) -> None:
    seen: list[tuple[int, int]] = []
    for i in range(30):
        response = v3io_client.kv.put(CONTAINER, table, "item", {"n": i})
        verifier = response.headers["X-v3io-transaction-verifier"]
        got = v3io_client.kv.get(CONTAINER, table, "item", attribute_names=["__mtime_secs", "__mtime_nsecs"])
        secs, nsecs = got.output.item["__mtime_secs"], got.output.item["__mtime_nsecs"]
        assert verifier == f"__mtime_secs=={secs} and __mtime_nsecs=={nsecs}"
        assert got.headers["X-v3io-transaction-verifier"] == verifier
        seen.append((secs, nsecs))
    assert seen == sorted(set(seen))


def test_update_modes(v3io_client: Any, table: str) -> None:
    v3io_client.kv.put(CONTAINER, table, "item", {"a": 1, "b": 2})
    v3io_client.kv.update(CONTAINER, table, "item", attributes={"b": 3, "c": 4})
    assert v3io_client.kv.get(CONTAINER, table, "item").output.item == {"a": 1, "b": 3, "c": 4}

    v3io_client.kv.update(CONTAINER, table, "item", attributes={"z": 0}, update_mode="OverWriteAttributes")
    assert v3io_client.kv.get(CONTAINER, table, "item").output.item == {"z": 0}

    v3io_client.kv.put(CONTAINER, table, "item", {"only": True})  # PutItem without a mode replaces
    assert v3io_client.kv.get(CONTAINER, table, "item").output.item == {"only": True}

    exists = v3io_client.kv.update(
        CONTAINER, table, "item", attributes={"x": 1}, update_mode="CreateNewItemOnly", raise_for_status=NEVER
    )
    body = exists.body.decode()
    assert exists.status_code == 400 and "369098809" in body and body.count("ErrorCode") == 2
    v3io_client.kv.update(CONTAINER, table, "new", attributes={"x": 1}, update_mode="CreateNewItemOnly")
    assert v3io_client.kv.get(CONTAINER, table, "new").output.item == {"x": 1}

    bogus = v3io_client.kv.update(
        CONTAINER, table, "item", attributes={"x": 1}, update_mode="Bogus", raise_for_status=NEVER
    )
    assert bogus.status_code == 400 and "UpdateMode" in error_of(bogus)["ErrorMessage"]


def test_update_expressions(v3io_client: Any, table: str) -> None:
    v3io_client.kv.update(CONTAINER, table, "item", expression="SET n = if_not_exists(n, 0) + 1; s = 'x'")
    v3io_client.kv.update(CONTAINER, table, "item", expression="n = n * 10 - 2; f = n / 4; s = s + 'y';")
    assert v3io_client.kv.get(CONTAINER, table, "item").output.item == {"n": 8, "f": 2, "s": "xy"}
    v3io_client.kv.update(CONTAINER, table, "item", expression="REMOVE s; delete(f); flag = true")
    assert v3io_client.kv.get(CONTAINER, table, "item").output.item == {"n": 8, "flag": True}

    missing = v3io_client.kv.update(CONTAINER, table, "item", expression="n = nope + 1", raise_for_status=NEVER)
    assert missing.status_code == 400 and "nope" not in ("",) and "if_not_exists" in error_of(missing)["ErrorMessage"]
    syntax = v3io_client.kv.update(CONTAINER, table, "item", expression="n = (1 +", raise_for_status=NEVER)
    assert syntax.status_code == 400 and "position" in error_of(syntax)["ErrorMessage"]
    assert v3io_client.kv.get(CONTAINER, table, "item").output.item == {"n": 8, "flag": True}


def test_conditions(v3io_client: Any, table: str) -> None:
    v3io_client.kv.put(CONTAINER, table, "item", {"age": 20, "name": "ada", "ok": True})
    passing = [
        "age == 20",
        "age > 15 and name == 'ada'",
        "AGE_MISSING == 1 OR ok == true",
        "NOT (age < 18)",
        "name IN ('bob', 'ada')",
        "starts(name, 'ad') AND exists(ok) AND not(exists(nothing))",
        "",
    ]
    for condition in passing:
        response = v3io_client.kv.update(
            CONTAINER, table, "item", attributes={"hit": condition}, condition=condition, raise_for_status=NEVER
        )
        assert response.status_code == 200, (condition, response.body)
    failing = ["age == '20'", "missing > 1", "age != 20", "ok == 1", "length(name) > 3"]
    for condition in failing:
        response = v3io_client.kv.update(
            CONTAINER, table, "item", attributes={"miss": condition}, condition=condition, raise_for_status=NEVER
        )
        assert _is_condition_false(response), (condition, response.body)
    assert "miss" not in v3io_client.kv.get(CONTAINER, table, "item").output.item


def test_update_with_alternate_expression(v3io_client: Any, table: str) -> None:
    for _ in range(3):
        v3io_client.kv.update(
            CONTAINER,
            table,
            "counter",
            expression="a = a + 1",
            alternate_expression="a = 0; is_init = true",
            condition="is_init == true",
        )
    assert v3io_client.kv.get(CONTAINER, table, "counter").output.item == {"a": 2, "is_init": True}


def test_condition_on_missing_item_is_false(v3io_client: Any, table: str) -> None:
    response = v3io_client.kv.update(
        CONTAINER, table, "ghost", expression="a = 1", condition="exists(a)", raise_for_status=NEVER
    )
    assert _is_condition_false(response)
    assert v3io_client.kv.get(CONTAINER, table, "ghost", raise_for_status=NEVER).status_code == 404


def test_get_items_filter_attributes_limit_and_cursor(v3io_client: Any, table: str) -> None:
    for i in range(25):
        v3io_client.kv.put(CONTAINER, table, f"k{i:02d}", {"age": i, "name": f"n{i}"})
    v3io_client.object.put(CONTAINER, f"{table}/subdir/")  # directories are not items

    everything = v3io_client.kv.new_cursor(CONTAINER, table + "/").all()
    assert len(everything) == 25 and everything[0] == {"age": 0, "name": "n0"}

    page = v3io_client.kv.scan(
        CONTAINER, table + "/", attribute_names=["__name", "age"], filter_expression="age >= 10", limit=4
    ).output
    assert [item["__name"] for item in page.items] == ["k10", "k11", "k12", "k13"]
    assert page.last is False and page.next_marker

    limited = v3io_client.kv.new_cursor(
        CONTAINER, table + "/", attribute_names=["age"], filter_expression="age < 20", limit=15
    ).all()
    assert [item["age"] for item in limited] == list(range(15))

    segments = [
        {
            item["__name"]
            for item in v3io_client.kv.new_cursor(
                CONTAINER, table + "/", attribute_names=["__name"], segment=s, total_segments=3
            ).all()
        }
        for s in range(3)
    ]
    assert sum(len(s) for s in segments) == 25 and set.union(*segments) == {f"k{i:02d}" for i in range(25)}

    missing = v3io_client.kv.scan(CONTAINER, unique_v3io_name("nope") + "/", raise_for_status=NEVER)
    assert missing.status_code == 404


def test_delete_item(v3io_client: Any, table: str) -> None:
    v3io_client.kv.put(CONTAINER, table, "item", {"a": 1})
    assert v3io_client.kv.delete(CONTAINER, table, "item").status_code == 204
    assert v3io_client.kv.get(CONTAINER, table, "item", raise_for_status=NEVER).status_code == 404
    assert v3io_client.kv.delete(CONTAINER, table, "item", raise_for_status=NEVER).status_code == 404


def test_bad_attribute_values_name_the_field(v3io_client: Any, table: str) -> None:
    response = v3io_client.kv.put(CONTAINER, table, "item", {"bad-name": 1}, raise_for_status=NEVER)
    assert response.status_code == 400 and "bad-name" in error_of(response)["ErrorMessage"]
