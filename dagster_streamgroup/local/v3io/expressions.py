"""Condition, filter and update expressions of the v3io KV API (a documented subset).

Conditions and filters: ``== != < <= > >=``, ``AND``/``OR``/``NOT`` (any case), parentheses,
``IN (...)``, ``exists(a)``, ``starts(a, 's')``, ``ends``, ``contains``, ``length``, ``min``, ``max``,
``if_not_exists(a, v)``, numbers, single- or double-quoted strings, ``true``/``false``, backtick-quoted
names, ``+ - * /``. A comparison that reads a missing attribute is false (so is every comparison on an
item that does not exist); comparing values of different types is false; an empty condition is true.

Array attributes (see :class:`~dagster_streamgroup.local.v3io.attributes.Array`): ``a[i]`` reads an element
(``i`` is any expression that evaluates to an integer), ``a[i..j]`` a slice (``j`` included, as the platform
documents), ``init_array(n, 'int'|'double')`` makes an array of ``n`` zeros, ``length(a)`` counts elements
and ``min(a)``/``max(a)`` (one argument) reduce an array or a slice. An index outside the array, or ``[]`` on
an attribute that is not an array, is an error.

Update expressions: ``;``-separated clauses of ``SET a = e [, b = e]``, bare ``a = e``, element
assignment ``a[i] = e`` (on an existing array; an integer array takes integral numbers only),
``REMOVE a [, b]`` and ``delete(a)``. Clauses apply in order, each seeing the previous ones' results.

Everything here is pure: parsing raises :class:`ExpressionError`, evaluation takes a mapping of decoded
values (user and system attributes) and never touches storage.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from dagster_streamgroup.local.v3io.attributes import (
    INT64_MAX,
    INT64_MIN,
    MAX_ARRAY_LENGTH,
    Array,
    ArrayKind,
    Timestamp,
    Value,
)

MAX_EXPRESSION_LENGTH = 64 * 1024
MAX_DEPTH = 64


class ExpressionError(ValueError):
    """A malformed expression or an update that cannot be applied; the message says where and why."""


class _Missing:
    """The value of an attribute the item does not have: poisons every comparison it meets."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()
Result: TypeAlias = Value | _Missing


# --- tokens -------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<num>(?:[0-9]+(?:\.(?!\.)[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<bq>`[^`]+`)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<>|<=|>=|<|>|=|\(|\)|\[|\]|\.\.|,|;|\+|-|\*|/)
    """,
    re.VERBOSE,
)
_ESCAPE_RE = re.compile(r"\\(.)")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "num" | "str" | "name" | "op" | "end"
    text: str
    value: object
    pos: int


def tokenize(text: str) -> list[Token]:
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(f"expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            raise ExpressionError(f"unexpected character {text[pos]!r} at position {pos}")
        kind = match.lastgroup or ""
        raw = match.group()
        if kind == "num":
            number: int | float = float(raw) if any(c in raw for c in ".eE") else int(raw)
            tokens.append(Token("num", raw, number, pos))
        elif kind == "str":
            tokens.append(Token("str", raw, _ESCAPE_RE.sub(r"\1", raw[1:-1]), pos))
        elif kind == "bq":
            tokens.append(Token("name", raw, raw[1:-1], pos))
        elif kind == "name":
            tokens.append(Token("name", raw, raw, pos))
        elif kind == "op":
            tokens.append(Token("op", "!=" if raw == "<>" else raw, raw, pos))
        pos = match.end()
    tokens.append(Token("end", "", None, len(text)))
    return tokens


# --- syntax tree --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Literal:
    value: Value


@dataclass(frozen=True, slots=True)
class Attr:
    name: str


@dataclass(frozen=True, slots=True)
class Element:
    """``a[i]``: one element of an array attribute."""

    name: str
    index: Node


@dataclass(frozen=True, slots=True)
class Slice:
    """``a[i..j]``: elements ``i`` to ``j`` of an array attribute, both included."""

    name: str
    start: Node
    end: Node


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # "not" | "-"
    operand: Node


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # "and" | "or" | comparison | arithmetic
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class In:
    operand: Node
    choices: tuple[Node, ...]


Node: TypeAlias = Literal | Attr | Element | Slice | Call | Unary | Binary | In


@dataclass(frozen=True, slots=True)
class Assign:
    name: str
    value: Node


@dataclass(frozen=True, slots=True)
class AssignElement:
    """``a[i] = e``: replace one element of an existing array attribute."""

    name: str
    index: Node
    value: Node


@dataclass(frozen=True, slots=True)
class Remove:
    name: str


Action: TypeAlias = Assign | AssignElement | Remove

_COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">="})
_FUNCTIONS: dict[str, tuple[int, ...]] = {
    "exists": (1,),
    "if_not_exists": (2,),
    "starts": (2,),
    "ends": (2,),
    "contains": (2,),
    "length": (1,),
    "min": (1, 2),
    "max": (1, 2),
    "init_array": (2,),
}
_ARRAY_KINDS: dict[str, ArrayKind] = {"int": "int", "double": "double"}


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    # helpers
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def error(self, message: str) -> ExpressionError:
        tok = self.tok
        found = "end of expression" if tok.kind == "end" else repr(tok.text)
        return ExpressionError(f"{message} at position {tok.pos} (found {found}) in {self.text[:200]!r}")

    def keyword(self, *words: str) -> str | None:
        tok = self.tok
        if tok.kind == "name" and tok.text.lower() in words and tok.text == tok.value:
            self.i += 1
            return tok.text.lower()
        return None

    def op(self, *ops: str) -> str | None:
        tok = self.tok
        if tok.kind == "op" and tok.text in ops:
            self.i += 1
            return tok.text
        return None

    def expect(self, op: str) -> None:
        if self.op(op) is None:
            raise self.error(f"expected {op!r}")

    def name(self) -> str:
        tok = self.tok
        if tok.kind != "name":
            raise self.error("expected an attribute name")
        self.i += 1
        return str(tok.value)

    def nested(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"expression nests deeper than {MAX_DEPTH} levels")

    def end(self) -> None:
        if self.tok.kind != "end":
            raise self.error("unexpected text")

    # grammar
    def expression(self) -> Node:
        self.nested()
        left = self.conjunction()
        while self.keyword("or"):
            left = Binary("or", left, self.conjunction())
        self.depth -= 1
        return left

    def conjunction(self) -> Node:
        left = self.negation()
        while self.keyword("and"):
            left = Binary("and", left, self.negation())
        return left

    def negation(self) -> Node:
        if self.keyword("not"):
            self.nested()
            node = Unary("not", self.negation())
            self.depth -= 1
            return node
        return self.comparison()

    def comparison(self) -> Node:
        left = self.additive()
        op = self.op(*_COMPARISONS)
        if op is not None:
            return Binary(op, left, self.additive())
        if self.keyword("in"):
            self.expect("(")
            choices = [self.additive()]
            while self.op(","):
                choices.append(self.additive())
            self.expect(")")
            return In(left, tuple(choices))
        return left

    def additive(self) -> Node:
        left = self.multiplicative()
        while (op := self.op("+", "-")) is not None:
            left = Binary(op, left, self.multiplicative())
        return left

    def multiplicative(self) -> Node:
        left = self.unary()
        while (op := self.op("*", "/")) is not None:
            left = Binary(op, left, self.unary())
        return left

    def unary(self) -> Node:
        if self.op("-"):
            self.nested()
            node = Unary("-", self.unary())
            self.depth -= 1
            return node
        return self.primary()

    def primary(self) -> Node:
        tok = self.tok
        if tok.kind == "num":
            self.i += 1
            assert isinstance(tok.value, int | float)
            return Literal(tok.value)
        if tok.kind == "str":
            self.i += 1
            return Literal(str(tok.value))
        if self.op("("):
            node = self.expression()
            self.expect(")")
            return node
        if tok.kind == "name":
            lowered = tok.text.lower()
            quoted = tok.text != tok.value
            if not quoted and lowered in ("true", "false"):
                self.i += 1
                return Literal(lowered == "true")
            self.i += 1
            if not quoted and self.tok.kind == "op" and self.tok.text == "(":
                return self.call(lowered)
            if self.op("["):
                return self.subscript(str(tok.value))
            return Attr(str(tok.value))
        raise self.error("expected a value, an attribute or '('")

    def subscript(self, name: str) -> Element | Slice:
        """After ``name[``: ``i]`` or ``i..j]``."""
        self.nested()
        start = self.expression()
        node: Element | Slice = Slice(name, start, self.expression()) if self.op("..") else Element(name, start)
        self.expect("]")
        self.depth -= 1
        return node

    def call(self, name: str) -> Node:
        arity = _FUNCTIONS.get(name)
        if arity is None:
            raise self.error(f"unknown function {name!r}")
        self.expect("(")
        args: list[Node] = []
        if self.tok.kind != "op" or self.tok.text != ")":
            args.append(self.expression())
            while self.op(","):
                args.append(self.expression())
        self.expect(")")
        if len(args) not in arity:
            expected = " or ".join(str(n) for n in arity)
            raise ExpressionError(f"function {name}() takes {expected} argument(s), got {len(args)}")
        if name in ("exists", "if_not_exists") and not isinstance(args[0], Attr):
            raise ExpressionError(f"the first argument of {name}() must be an attribute name")
        return Call(name, tuple(args))

    def actions(self) -> list[Action]:
        actions: list[Action] = []
        while self.tok.kind != "end":
            if self.op(";"):
                continue
            if self.keyword("set"):
                actions.append(self.assignment())
                while self.op(","):
                    actions.append(self.assignment())
            elif self.keyword("remove"):
                actions.append(Remove(self.name()))
                while self.op(","):
                    actions.append(Remove(self.name()))
            elif self.tok.kind == "name" and self.tok.text.lower() == "delete" and self._next_is("("):
                self.i += 1
                self.expect("(")
                actions.append(Remove(self.name()))
                self.expect(")")
            else:
                actions.append(self.assignment())
            if self.tok.kind != "end":
                self.expect(";")
        return actions

    def _next_is(self, op: str) -> bool:
        nxt = self.tokens[self.i + 1]
        return nxt.kind == "op" and nxt.text == op

    def assignment(self) -> Assign | AssignElement:
        name = self.name()
        if self.op("["):
            target = self.subscript(name)
            if isinstance(target, Slice):
                raise self.error("assigning to an array slice is not supported (assign elements one by one)")
            self.expect("=")
            return AssignElement(name, target.index, self.expression())
        self.expect("=")
        return Assign(name, self.expression())


def parse_condition(text: str) -> Node | None:
    """Parse a condition or filter; ``None`` for an empty one (which is true)."""
    if not text.strip():
        return None
    parser = _Parser(text)
    node = parser.expression()
    parser.end()
    return node


def parse_update(text: str) -> list[Action]:
    parser = _Parser(text)
    actions = parser.actions()
    if not actions:
        raise ExpressionError("the update expression has no clause")
    return actions


# --- evaluation ---------------------------------------------------------------------------------------

Attributes = Mapping[str, Value]


def _kind(value: Value) -> type:
    if isinstance(value, bool):
        return bool
    if isinstance(value, int | float):
        return float
    return type(value)


_ORDER: dict[str, Callable[[object, object], bool]] = {
    "<": lambda a, b: a < b,  # type: ignore[operator]
    "<=": lambda a, b: a <= b,  # type: ignore[operator]
    ">": lambda a, b: a > b,  # type: ignore[operator]
    ">=": lambda a, b: a >= b,  # type: ignore[operator]
}


def _compare(op: str, left: Result, right: Result) -> bool:
    if isinstance(left, _Missing) or isinstance(right, _Missing):
        return False
    if _kind(left) is not _kind(right):
        return False
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    if isinstance(left, bool | Array):
        return False
    return _ORDER[op](left, right)


def _arith(op: str, left: Result, right: Result) -> Result:
    if isinstance(left, _Missing) or isinstance(right, _Missing):
        return MISSING
    if op == "+" and isinstance(left, str) and isinstance(right, str):
        return left + right
    if not _is_number(left) or not _is_number(right):
        raise ExpressionError(f"operator {op!r} needs numbers, got {_type_name(left)} and {_type_name(right)}")
    assert isinstance(left, int | float) and isinstance(right, int | float)
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        raise ExpressionError("division by zero")
    quotient = left / right
    if isinstance(left, int) and isinstance(right, int) and left % right == 0:
        return left // right
    return quotient


def _is_number(value: Result) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _type_name(value: Result) -> str:
    if isinstance(value, _Missing):
        return "a missing attribute"
    if isinstance(value, bool):
        return "a boolean"
    if _is_number(value):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Timestamp):
        return "a timestamp"
    if isinstance(value, Array):
        return "an array"
    return "a blob"


def evaluate(node: Node, attrs: Attributes) -> Result:
    if isinstance(node, Literal):
        return node.value
    if isinstance(node, Attr):
        return attrs.get(node.name, MISSING)
    if isinstance(node, Element):
        array = _array(node.name, attrs)
        if isinstance(array, _Missing):
            return MISSING
        index = _index(node.index, attrs, array, node.name)
        return MISSING if isinstance(index, _Missing) else array.values[index]
    if isinstance(node, Slice):
        return _slice(node, attrs)
    if isinstance(node, Binary):
        if node.op == "and":
            return truth(node.left, attrs) and truth(node.right, attrs)
        if node.op == "or":
            return truth(node.left, attrs) or truth(node.right, attrs)
        left = evaluate(node.left, attrs)
        right = evaluate(node.right, attrs)
        if node.op in _COMPARISONS:
            return _compare(node.op, left, right)
        return _arith(node.op, left, right)
    if isinstance(node, Unary):
        if node.op == "not":
            return not truth(node.operand, attrs)
        value = evaluate(node.operand, attrs)
        if isinstance(value, _Missing):
            return MISSING
        if not _is_number(value):
            raise ExpressionError(f"unary '-' needs a number, got {_type_name(value)}")
        assert isinstance(value, int | float)
        return -value
    if isinstance(node, In):
        value = evaluate(node.operand, attrs)
        return any(_compare("==", value, evaluate(choice, attrs)) for choice in node.choices)
    return _call(node, attrs)


def _array(name: str, attrs: Attributes) -> Array | _Missing:
    value = attrs.get(name, MISSING)
    if isinstance(value, _Missing | Array):
        return value
    raise ExpressionError(f"{name!r} is {_type_name(value)}, not an array attribute")


def _integer(value: Result, what: str) -> int | _Missing:
    if isinstance(value, _Missing):
        return MISSING
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ExpressionError(f"{what} must be an integer, got {_type_name(value)}")
    return value


def _index(node: Node, attrs: Attributes, array: Array, name: str) -> int | _Missing:
    index = _integer(evaluate(node, attrs), f"an index of {name!r}")
    if isinstance(index, int) and not 0 <= index < len(array.values):
        raise ExpressionError(f"index {index} is outside {name!r}, an array of {len(array.values)} elements")
    return index


def _slice(node: Slice, attrs: Attributes) -> Array | _Missing:
    array = _array(node.name, attrs)
    if isinstance(array, _Missing):
        return MISSING
    start = _index(node.start, attrs, array, node.name)
    end = _index(node.end, attrs, array, node.name)
    if isinstance(start, _Missing) or isinstance(end, _Missing):
        return MISSING
    if start > end:
        raise ExpressionError(f"the slice {node.name}[{start}..{end}] ends before it starts")
    return Array(array.kind, array.values[start : end + 1])


def _init_array(size: Result, kind: Result) -> Array:
    count = _integer(size, "the size of init_array()")
    assert not isinstance(count, _Missing)
    if not 0 <= count <= MAX_ARRAY_LENGTH:
        raise ExpressionError(f"init_array() size {count} is outside 0..{MAX_ARRAY_LENGTH}")
    array_kind = _ARRAY_KINDS.get(kind.lower()) if isinstance(kind, str) else None
    if array_kind is None:
        raise ExpressionError(f"the type of init_array() must be 'int' or 'double', got {kind!r}")
    zero: int | float = 0 if array_kind == "int" else 0.0
    return Array(array_kind, (zero,) * count)


def _element(array: Array, value: Result, name: str) -> int | float:
    """``value`` as an element of ``array``: an integer array takes integral numbers, a double array any number."""
    if isinstance(value, _Missing):
        raise ExpressionError(f"the value assigned to an element of {name!r} reads an attribute the item does not have")
    if not _is_number(value):
        raise ExpressionError(f"an element of {name!r} must be a number, got {_type_name(value)}")
    assert isinstance(value, int | float)
    if array.kind == "double":
        try:
            element = float(value)
        except OverflowError:
            element = math.inf
        if not math.isfinite(element):
            raise ExpressionError(f"{value!r} is not a finite double for an element of {name!r}")
        return element
    if isinstance(value, float):
        if not value.is_integer():
            raise ExpressionError(f"{name!r} is an integer array: {value!r} is not an integer")
        value = int(value)
    if not INT64_MIN <= value <= INT64_MAX:
        raise ExpressionError(f"{value} does not fit in a 64-bit element of {name!r}")
    return value


def _call(node: Call, attrs: Attributes) -> Result:
    if node.name == "exists":
        assert isinstance(node.args[0], Attr)
        return node.args[0].name in attrs
    if node.name == "if_not_exists":
        first = evaluate(node.args[0], attrs)
        return evaluate(node.args[1], attrs) if isinstance(first, _Missing) else first
    values = [evaluate(arg, attrs) for arg in node.args]
    if any(isinstance(value, _Missing) for value in values):
        return MISSING
    if node.name == "length":
        (value,) = values
        if isinstance(value, str | bytes):
            return len(value)
        if isinstance(value, Array):
            return len(value.values)
        raise ExpressionError(f"length() needs a string, a blob or an array, got {_type_name(value)}")
    if node.name == "init_array":
        return _init_array(*values)
    if len(values) == 1:  # min(array) / max(array)
        (array,) = values
        if not isinstance(array, Array):
            raise ExpressionError(f"{node.name}() with one argument needs an array, got {_type_name(array)}")
        if not array.values:
            raise ExpressionError(f"{node.name}() of an empty array")
        return min(array.values) if node.name == "min" else max(array.values)
    left, right = values
    if node.name in ("min", "max"):
        if not (_is_number(left) and _is_number(right)):
            raise ExpressionError(f"{node.name}() needs numbers")
        assert isinstance(left, int | float) and isinstance(right, int | float)
        return min(left, right) if node.name == "min" else max(left, right)
    if not (isinstance(left, str) and isinstance(right, str)):
        return False
    if node.name == "starts":
        return left.startswith(right)
    if node.name == "ends":
        return left.endswith(right)
    return right in left


def truth(node: Node | None, attrs: Attributes) -> bool:
    """A condition's verdict: only a boolean ``true`` passes; missing attributes and non-booleans fail."""
    if node is None:
        return True
    return evaluate(node, attrs) is True


def apply_update(actions: list[Action], attrs: dict[str, Value]) -> dict[str, Value]:
    """Run an update on a copy of ``attrs`` (user attributes plus readable system ones)."""
    result = dict(attrs)
    for action in actions:
        if isinstance(action, Remove):
            result.pop(action.name, None)
            continue
        if isinstance(action, AssignElement):
            result[action.name] = _assign_element(action, result)
            continue
        value = evaluate(action.value, result)
        if isinstance(value, _Missing):
            raise ExpressionError(
                f"the value assigned to {action.name!r} reads an attribute the item does not have "
                "(use if_not_exists(attr, default))"
            )
        result[action.name] = value
    return result


def _assign_element(action: AssignElement, attrs: dict[str, Value]) -> Array:
    array = _array(action.name, attrs)
    if isinstance(array, _Missing):
        raise ExpressionError(
            f"{action.name!r} does not exist: create the array first, e.g. {action.name} = init_array(n, 'int')"
        )
    index = _index(action.index, attrs, array, action.name)
    if isinstance(index, _Missing):
        raise ExpressionError(f"the index of {action.name!r} reads an attribute the item does not have")
    element = _element(array, evaluate(action.value, attrs), action.name)
    values = list(array.values)
    values[index] = element
    return Array(array.kind, tuple(values))


def assigned_names(actions: list[Action]) -> set[str]:
    return {action.name for action in actions}
