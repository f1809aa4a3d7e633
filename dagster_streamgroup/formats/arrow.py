"""Arrow arrays into the exact types a Spark source must hand over (Spark takes ``string``, not ``large_string``;
its timestamps in microseconds; dictionary-encoded columns decoded), field by field and item by item."""

from __future__ import annotations

import pyarrow as pa


def conform(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as ``target``: structs by field name (a field ``array`` lacks is null), lists and maps item by
    item, dictionaries decoded, everything else through Arrow's cast (which refuses a value it would change)."""
    if array.type == target:
        return array
    if pa.types.is_dictionary(array.type):
        return conform(array.dictionary_decode(), target)
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(target):
        if not pa.types.is_struct(array.type):
            raise TypeError(f"cannot read {array.type} as {target}")
        assert isinstance(array, pa.StructArray)
        names = {array.type.field(i).name for i in range(array.type.num_fields)}
        children = [
            conform(array.field(field.name), field.type) if field.name in names else pa.nulls(len(array), field.type)
            for field in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_map(target):
        if not pa.types.is_map(array.type):
            raise TypeError(f"cannot read {array.type} as {target}")
        assert isinstance(array, pa.MapArray)
        keys = conform(array.keys, target.key_type)
        items = conform(array.items, target.item_type)
        return pa.MapArray.from_arrays(array.offsets, keys, items, type=target, mask=mask)
    if pa.types.is_list(target):
        if pa.types.is_large_list(array.type):
            assert isinstance(array, pa.LargeListArray)
            offsets = array.offsets.cast(pa.int32())
        elif pa.types.is_list(array.type):
            assert isinstance(array, pa.ListArray)
            offsets = array.offsets
        else:
            raise TypeError(f"cannot read {array.type} as {target}")
        values = conform(array.values, target.value_type)
        return pa.ListArray.from_arrays(offsets, values, type=target, mask=mask)
    return array.cast(target)
