"""The condition/filter evaluator and the update-expression subset, as pure functions (no server needed)."""

from __future__ import annotations

import base64
import contextlib

import pytest
import v3io.dataplane.kv_array
from hypothesis import given
from hypothesis import strategies as st

from dagster_streamgroup.local.v3io.attributes import Array, Value, decode, encode
from dagster_streamgroup.local.v3io.expressions import (
    ExpressionError,
    apply_update,
    evaluate,
    parse_condition,
    parse_update,
    tokenize,
    truth,
)

ITEM: dict[str, Value] = {"a": 5, "f": 2.5, "s": "hello", "t": True, "__mtime_secs": 17, "__mtime_nsecs": 42}


def holds(condition: str, item: dict[str, Value] | None = None) -> bool:
    return truth(parse_condition(condition), ITEM if item is None else item)


@pytest.mark.parametrize(
    "condition",
    [
        "",
        "a == 5",
        "a > 4.5 AND f <= 2.5",
        "a == 1 or s == 'hello'",
        "NOT a == 1",
        "not(exists(missing))",
        "(__mtime_nsecs == 42) AND (__mtime_secs == 17)",
        "__mtime_secs==17 and __mtime_nsecs==42",
        "s IN ('x', 'hello')",
        "starts(s, 'he') and ends(s, 'lo') and contains(s, 'ell')",
        "length(s) == 5",
        "t == true",
        "t",
        "a + 1 == 6 and a * 2 - 1 == 9 and a / 2 == 2.5",
        "`a` != 6",
        "s != 'x' AND a <> 4",
    ],
)
def test_true_conditions(condition: str) -> None:
    assert holds(condition)


@pytest.mark.parametrize(
    "condition",
    [
        "a == '5'",  # incompatible types
        "missing == 1",
        "missing != 1",  # a missing attribute makes any comparison false
        "exists(missing)",
        "not(exists(a))",
        "(__mtime_nsecs == 41) AND (__mtime_secs == 17)",
        "t == 1",
        "s > 1",
        "a",  # not a boolean
        "t < true",
    ],
)
def test_false_conditions(condition: str) -> None:
    assert not holds(condition)


def test_every_comparison_on_a_missing_item_is_false_but_not_exists_is_true() -> None:
    assert not holds("__obj_type == 3", {})
    assert not holds("(__mtime_nsecs == 0) AND (__mtime_secs == 0)", {})
    assert holds("not(exists(state))", {})


@pytest.mark.parametrize(
    "bad",
    ["a ==", "((a == 1)", "a == 1 extra", "unknown_fn(a)", "exists(1)", "'open", "a[1 == 2", "a[] == 2", "a ! b"],
)
def test_malformed_conditions_name_the_position(bad: str) -> None:
    with pytest.raises(ExpressionError):
        parse_condition(bad)


def test_deep_nesting_is_refused_not_a_crash() -> None:
    with pytest.raises(ExpressionError, match="deeper"):
        parse_condition("(" * 500 + "a == 1" + ")" * 500)
    with pytest.raises(ExpressionError, match="deeper"):
        parse_condition("not " * 500 + "true")


def test_update_clauses_apply_in_order() -> None:
    actions = parse_update("SET a = a + 1, b = if_not_exists(b, 10); c = a * b; REMOVE s; delete(f);")
    assert apply_update(actions, dict(ITEM)) == {
        "a": 6,
        "b": 10,
        "c": 60,
        "t": True,
        "__mtime_secs": 17,
        "__mtime_nsecs": 42,
    }


def test_update_errors() -> None:
    with pytest.raises(ExpressionError, match="if_not_exists"):
        apply_update(parse_update("a = missing + 1"), dict(ITEM))
    with pytest.raises(ExpressionError, match="division by zero"):
        apply_update(parse_update("a = a / 0"), dict(ITEM))
    with pytest.raises(ExpressionError, match="numbers"):
        apply_update(parse_update("a = s * 2"), dict(ITEM))
    with pytest.raises(ExpressionError):
        parse_update(";;")
    with pytest.raises(ExpressionError, match="slice"):
        parse_update("a[0..1] = 2")


@given(st.text(max_size=80))
def test_any_text_parses_or_raises_expression_error(text: str) -> None:
    for parse in (parse_condition, parse_update):
        with contextlib.suppress(ExpressionError):
            parse(text)


@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6))
def test_integer_comparisons_match_python(x: int, y: int) -> None:
    item: dict[str, Value] = {"x": x, "y": y}
    assert holds("x < y", item) == (x < y)
    assert holds("x >= y", item) == (x >= y)
    assert holds("x == y OR x != y", item)


ARRAYS: dict[str, Value] = {"ints": Array("int", (1, 2, 3)), "doubles": Array("double", (0.5, 1.5)), "i": 1, "s": "x"}


def test_array_blobs_use_the_client_layout() -> None:
    client_ints = v3io.dataplane.kv_array.encode_list([1, -2, 3]).decode()
    client_doubles = v3io.dataplane.kv_array.encode_list([0.5, 1.5]).decode()
    assert decode({"B": client_ints}) == Array("int", (1, -2, 3))
    assert decode({"B": client_doubles}) == Array("double", (0.5, 1.5))
    assert encode(Array("int", (1, -2, 3))) == {"B": client_ints}
    assert encode(Array("double", (0.5, 1.5))) == {"B": client_doubles}
    assert v3io.dataplane.kv_array.decode(base64.b64decode(encode(Array("int", ()))["B"])) == []
    # Any other blob stays bytes, also one with the array magic but a size that does not match.
    truncated = base64.b64decode(client_ints)[:-1]
    for raw in (b"\x00\xff", truncated, b""):
        assert decode({"B": base64.b64encode(raw).decode()}) == raw


@pytest.mark.parametrize(
    "condition",
    [
        "ints[1] == 2",
        "ints[i + 1] == 3 and doubles[i] == 1.5",
        "ints[2.0] == 3",
        "length(ints) == 3 and length(ints[1..2]) == 2",
        "max(ints) == 3 and min(ints[1..2]) == 2 and max(doubles) == 1.5",
        "ints[0..1] == ints[0..1] and ints != doubles",
        "not(missing[0] == 1)",
    ],
)
def test_array_conditions(condition: str) -> None:
    assert holds(condition, ARRAYS)


@pytest.mark.parametrize("condition", ["ints > ints", "missing[0] == 1", "ints[missing] == 1", "ints == 1"])
def test_false_array_conditions(condition: str) -> None:
    assert not holds(condition, ARRAYS)


@pytest.mark.parametrize(
    "condition", ["ints[3] == 1", "ints[-1] == 1", "s[0] == 1", "ints[0.5] == 1", "ints[true] == 1", "length(i) == 1"]
)
def test_bad_array_reads_are_errors(condition: str) -> None:
    with pytest.raises(ExpressionError):
        truth(parse_condition(condition), ARRAYS)


def test_array_updates() -> None:
    result = apply_update(
        parse_update("ints[1] = ints[1] * 2; doubles[0] = 2; a = init_array(3, 'DOUBLE'); a[2] = 4.5; b = ints[1..2]"),
        dict(ARRAYS),
    )
    assert result == {
        **ARRAYS,
        "ints": Array("int", (1, 4, 3)),
        "doubles": Array("double", (2.0, 1.5)),
        "a": Array("double", (0.0, 0.0, 4.5)),
        "b": Array("int", (4, 3)),
    }
    assert type(result["doubles"].values[0]) is float  # type: ignore[union-attr]
    with pytest.raises(ExpressionError, match="finite"):
        apply_update(parse_update("doubles[0] = 1e308 * 10"), dict(ARRAYS))
    with pytest.raises(ExpressionError, match="finite"):
        apply_update(parse_update("doubles[0] = " + "10 * " * 400 + "1"), dict(ARRAYS))  # an int beyond any double


def test_init_array_bounds() -> None:
    assert evaluate(parse_condition("init_array(0, 'int')"), {}) == Array("int", ())  # type: ignore[arg-type]
    with pytest.raises(ExpressionError, match="outside"):
        evaluate(parse_condition("init_array(2 * 1024 * 1024, 'int')"), {})  # type: ignore[arg-type]
    with pytest.raises(ExpressionError, match="outside"):
        evaluate(parse_condition("init_array(-1, 'int')"), {})  # type: ignore[arg-type]


def test_slice_dots_are_not_a_decimal_point() -> None:
    assert [t.text for t in tokenize("a[1..2] 1.5 1. .5")] == ["a", "[", "1", "..", "2", "]", "1.5", "1.", ".5", ""]
