"""The condition/filter evaluator and the update-expression subset, as pure functions (no server needed)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagster_streamgroup.local.v3io.attributes import Value
from dagster_streamgroup.local.v3io.expressions import (
    ExpressionError,
    apply_update,
    parse_condition,
    parse_update,
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
    "bad", ["a ==", "((a == 1)", "a == 1 extra", "unknown_fn(a)", "exists(1)", "'open", "a[1] == 2", "a ! b"]
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
    with pytest.raises(ExpressionError):
        parse_update("a[1] = 2")


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
