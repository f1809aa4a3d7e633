"""Array attributes through the real client: lists and ``array.array`` values travel as ``B`` blobs in
v3io-py's ``kv_array`` layout, and expressions index, slice, assign and create them (the platform's
documented array operator ``a[i]`` / ``a[i..j]``, ``init_array``, ``length``, ``min``/``max``)."""

from __future__ import annotations

import array
from typing import Any

import pytest

from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io_server.helpers import CONTAINER, NEVER, error_of

pytestmark = pytest.mark.v3io


@pytest.fixture
def table() -> str:
    return unique_v3io_name("table")


def test_array_element_assignment_as_in_v3io_py_live_test(v3io_client: Any, table: str) -> None:
    """v3io-py's ``TestKv.test_kv_array``, which runs against a real platform."""
    item = {"list_with_ints": [1, 2, 3], "list_with_floats": [10.25, 20.25, 30.25]}
    v3io_client.kv.put(CONTAINER, table, "item_with_arrays", item)
    for name in item:
        v3io_client.kv.update(CONTAINER, table, "item_with_arrays", expression=f"{name}[1]={name}[1]*2")
    got = v3io_client.kv.get(CONTAINER, table, "item_with_arrays").output.item
    assert got == {"list_with_ints": [1, 4, 3], "list_with_floats": [10.25, 40.5, 30.25]}
    assert all(type(v) is int for v in got["list_with_ints"])
    assert all(type(v) is float for v in got["list_with_floats"])


def test_array_elements_in_update_expressions(v3io_client: Any, table: str) -> None:
    v3io_client.kv.put(CONTAINER, table, "item", {"i": 1, "doubles": array.array("d", [0.5, 1.5])})
    v3io_client.kv.update(
        CONTAINER,
        table,
        "item",
        expression=(
            "SET fib = init_array(5, 'int'); fib[1] = 1; fib[2] = fib[0] + fib[1]; fib[3] = fib[1] + fib[2]; "
            "fib[i + 3] = fib[i + 2] + fib[i + 1]; doubles[i] = doubles[i] + 1; zeros = init_array(2, 'double'); "
            "mid = fib[1..3]; n = length(fib); top = max(fib); low = min(fib[2..4]); first = fib[0]"
        ),
    )
    got = v3io_client.kv.get(CONTAINER, table, "item").output.item
    assert got == {
        "i": 1,
        "doubles": [0.5, 2.5],
        "fib": [0, 1, 1, 2, 3],
        "zeros": [0.0, 0.0],
        "mid": [1, 1, 2],
        "n": 5,
        "top": 3,
        "low": 1,
        "first": 0,
    }
    # An integral double fits an integer array; an untouched array keeps its exact bytes.
    v3io_client.kv.update(CONTAINER, table, "item", expression="fib[0] = 7 / 1.0; i = i + 1")
    got = v3io_client.kv.get(CONTAINER, table, "item").output.item
    assert got["fib"] == [7, 1, 1, 2, 3] and got["doubles"] == [0.5, 2.5] and got["i"] == 2


def test_array_elements_in_conditions_and_filters(v3io_client: Any, table: str) -> None:
    for key, values in {"a": [1, 5], "b": [2, 9], "c": [3, 1]}.items():
        v3io_client.kv.put(CONTAINER, table, key, {"v": values})
    hit = v3io_client.kv.update(CONTAINER, table, "a", attributes={"seen": True}, condition="v[1] == 5 and v[0] < 2")
    assert hit.status_code == 200
    miss = v3io_client.kv.update(
        CONTAINER, table, "a", attributes={"seen": False}, condition="v[1] > 5", raise_for_status=NEVER
    )
    assert miss.status_code == 400 and "16777244" in miss.body.decode()
    assert v3io_client.kv.get(CONTAINER, table, "a").output.item["seen"] is True

    items = v3io_client.kv.new_cursor(
        CONTAINER, table + "/", attribute_names=["__name"], filter_expression="v[1] > v[0]"
    ).all()
    assert sorted(item["__name"] for item in items) == ["a", "b"]


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("ints[3] = 1", "outside"),
        ("ints[0 - 1] = 1", "outside"),
        ("s[0] = 1", "not an array"),
        ("nope[0] = 1", "init_array"),
        ("ints[0] = 1.5", "not an integer"),
        ("ints[0] = 's'", "must be a number"),
        ("ints[0] = 9223372036854775807 + 1", "64-bit"),
        ("ints['x'] = 1", "integer"),
        ("ints[0..1] = 1", "slice"),
        ("x = ints[2..1]", "ends before"),
        ("x = init_array(2, 'text')", "'int' or 'double'"),
        ("x = max(s)", "needs an array"),
    ],
)
def test_bad_array_updates_are_400_and_change_nothing(
    v3io_client: Any, table: str, expression: str, reason: str
) -> None:
    v3io_client.kv.put(CONTAINER, table, "item", {"ints": [1, 2, 3], "s": "text"})
    response = v3io_client.kv.update(CONTAINER, table, "item", expression=expression, raise_for_status=NEVER)
    assert response.status_code == 400, response.body
    assert reason in error_of(response)["ErrorMessage"]
    assert v3io_client.kv.get(CONTAINER, table, "item").output.item == {"ints": [1, 2, 3], "s": "text"}


@pytest.mark.parametrize("condition", ["ints[7] == 1", "s * 2 == 1"])
def test_a_condition_that_cannot_be_evaluated_is_400_not_500(v3io_client: Any, table: str, condition: str) -> None:
    v3io_client.kv.put(CONTAINER, table, "item", {"ints": [1, 2, 3], "s": "text"})
    response = v3io_client.kv.update(
        CONTAINER, table, "item", attributes={"x": 1}, condition=condition, raise_for_status=NEVER
    )
    assert response.status_code == 400 and "ConditionExpression" in error_of(response)["ErrorMessage"]
    scan = v3io_client.kv.scan(CONTAINER, table + "/", filter_expression=condition, raise_for_status=NEVER)
    assert scan.status_code == 400 and "FilterExpression" in error_of(scan)["ErrorMessage"]
    assert v3io_client.kv.get(CONTAINER, table, "item").output.item == {"ints": [1, 2, 3], "s": "text"}
