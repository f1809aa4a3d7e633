"""Protobuf records built into Arrow column by column give what the record-by-record conversion gives, failed
records included (null in their places, with their errors)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from dagster_streamgroup.formats import protobuf
from tests.integration.formats.helpers import proto_class

CLS = proto_class("t.v1", "Order", [("id", 1, "int64"), ("item", 2, "string"), ("price", 3, "double"),
                                    ("ok", 4, "bool"), ("n", 5, "int32")])  # fmt: skip


class _Writer:
    def message_at(self, indexes: list[int]) -> Any:
        return CLS.DESCRIPTOR


orders = st.fixed_dictionaries(
    {
        "id": st.integers(-(2**63), 2**63 - 1),
        "item": st.text(max_size=6),
        "price": st.floats(allow_nan=False),
        "ok": st.booleans(),
        "n": st.integers(-(2**31), 2**31 - 1),
    }
)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(orders, st.none(), st.just("bad")), max_size=15))
def test_columns_equal_records_converted_one_by_one(items: list[Any]) -> None:
    framed: list[bytes | None] = []
    for item in items:
        if item is None:
            framed.append(None)
        elif item == "bad":
            framed.append(b"\0\0\0\0\1\0\xff\xff")
        else:
            framed.append(b"\0\0\0\0\1\0" + CLS(**item).SerializeToString())
    parse = protobuf.message_class(CLS.DESCRIPTOR)
    values, errors = protobuf.decode(framed, _Writer(), CLS.DESCRIPTOR, parse)  # type: ignore[arg-type]
    expected = [
        None if item is None or item == "bad" else protobuf._to_python(parse(f[6:]), CLS.DESCRIPTOR)  # type: ignore[index]
        for item, f in zip(items, framed, strict=True)
    ]
    assert values.to_pylist() == pa.array(expected, protobuf.arrow_type(CLS.DESCRIPTOR)).to_pylist()
    assert [e is not None for e in (errors or [None] * len(items))] == [item == "bad" for item in items]
