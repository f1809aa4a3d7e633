"""KV items: PutItem (with ``UpdateMode``), UpdateItem, GetItem and GetItems (full, parallel and range scans).

A conditional write is a compare-and-set: the condition is evaluated and the write applied inside one
storage transaction while no other request runs, and every write moves the item's
``(__mtime_secs, __mtime_nsecs)`` strictly forward. That is what makes v3io-go's
``(__mtime_nsecs == N) AND (__mtime_secs == S)`` and the create-only ``not(exists(state))`` exact.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from typing import Any

from dagster_streamgroup.local.v3io import attributes, errors, expressions, namespace, paths
from dagster_streamgroup.local.v3io.attributes import TypedAttributes, Value
from dagster_streamgroup.local.v3io.paths import Target
from dagster_streamgroup.local.v3io.protocol import (
    Request,
    Response,
    json_body,
    json_response,
    optional_int,
    optional_str,
)
from dagster_streamgroup.local.v3io.storage import KIND_DIRECTORY, KIND_OBJECT, NodeRow, Storage

MODE_MERGE = "CreateOrReplaceAttributes"
MODE_OVERWRITE = "OverWriteAttributes"
MODE_CREATE_ONLY = "CreateNewItemOnly"
_MODES = (MODE_MERGE, MODE_OVERWRITE, MODE_CREATE_ONLY)
MAX_PAGE = 1000


def _condition(body: dict[str, Any], key: str) -> expressions.Node | None:
    text = optional_str(body, key)
    if text is None:
        return None
    try:
        return expressions.parse_condition(text)
    except expressions.ExpressionError as exc:
        raise errors.invalid(f"{key}: {exc}") from None


def _holds(condition: expressions.Node | None, values: dict[str, Value], key: str) -> bool:
    """A condition's verdict; one that cannot be evaluated (``a[9]`` past the end, ``'s' * 2``) is a 400."""
    try:
        return expressions.truth(condition, values)
    except expressions.ExpressionError as exc:
        raise errors.invalid(f"{key}: {exc}") from None


def _update(body: dict[str, Any], key: str) -> list[expressions.Action] | None:
    text = optional_str(body, key)
    if text is None:
        return None
    try:
        actions = expressions.parse_update(text)
    except expressions.ExpressionError as exc:
        raise errors.invalid(f"{key}: {exc}") from None
    for name in expressions.assigned_names(actions):
        attributes.check_name(name)
        attributes.check_writable(name)
    return actions


def _item_path(target: Target, body: dict[str, Any]) -> str:
    """The item's path: from the URL, or (documented alternative) ``TableName`` + ``Key`` in the body."""
    path = target.path
    table = optional_str(body, "TableName")
    if table:
        path = paths.join(path, paths.normalise(table))
    key = body.get("Key")
    if key is not None:
        if not isinstance(key, dict) or len(key) != 1:
            raise errors.invalid("Key must be an object with one typed attribute")
        ((_, typed),) = key.items()
        value = attributes.validate_value(typed, "Key")
        name = str(next(iter(value.values())))
        paths.check_component(name)
        path = paths.join(path, name)
    elif target.trailing_slash or not path:
        raise errors.invalid("the URL names a directory; an item needs a path without a trailing '/' or a Key")
    return path


def _existing_item(store: Storage, container: str, path: str) -> NodeRow | None:
    node = store.get_node(container, path)
    if node is not None and node.kind == KIND_DIRECTORY:
        raise errors.is_a_directory(path)
    return node


def _write(store: Storage, container: str, path: str, node: NodeRow | None, attrs: TypedAttributes) -> NodeRow:
    if node is None:
        namespace.ensure_directory(store, container, paths.split(path)[0])
        return store.create_node(container, path, KIND_OBJECT, attrs)
    store.set_attrs(node, attrs)
    return node


def _apply(
    store: Storage, node: NodeRow | None, base: TypedAttributes, actions: list[expressions.Action]
) -> TypedAttributes:
    values: dict[str, Value] = {name: attributes.decode(typed) for name, typed in base.items()}
    system = namespace.view(store, node)
    readable = {**{k: v for k, v in system.items() if k in attributes.SYSTEM_ATTRIBUTES}, **values}
    try:
        result = expressions.apply_update(actions, readable)
    except expressions.ExpressionError as exc:
        raise errors.invalid(f"UpdateExpression: {exc}") from None
    out: TypedAttributes = {}
    for name, value in result.items():
        if name in attributes.SYSTEM_ATTRIBUTES:
            continue
        out[name] = base[name] if name in base and values.get(name) is value else attributes.encode(value)
    return out


def put_item(store: Storage, target: Target, request: Request) -> Response:
    body = json_body(request)
    path = _item_path(target, body)
    item = attributes.validate_attributes(body.get("Item", {}))
    condition = _condition(body, "ConditionExpression")
    mode = optional_str(body, "UpdateMode")
    if mode is not None and mode not in _MODES:
        raise errors.invalid(f"UpdateMode {mode!r} is not one of {', '.join(_MODES)}")
    actions = _update(body, "UpdateExpression")
    with store.transaction():
        node = _existing_item(store, target.container, path)
        if not _holds(condition, namespace.view(store, node), "ConditionExpression"):
            raise errors.condition_false()
        if mode == MODE_CREATE_ONLY and node is not None:
            raise errors.ItemExistsError(path)
        if mode == MODE_MERGE and node is not None:
            attrs = {**node.attrs, **item}
        elif node is not None and node.kind != KIND_OBJECT:
            # Replacing a shard's attributes keeps the hidden ones other consumer groups wrote.
            attrs = {**{k: v for k, v in node.attrs.items() if k.startswith("__")}, **item}
        else:
            attrs = item
        if actions:
            attrs = _apply(store, node, attrs, actions)
        node = _write(store, target.container, path, node, attrs)
    return Response(200, headers=namespace.verifier(node))


def update_item(store: Storage, target: Target, request: Request) -> Response:
    body = json_body(request)
    path = _item_path(target, body)
    condition = _condition(body, "ConditionExpression")
    actions = _update(body, "UpdateExpression")
    alternate = _update(body, "AlternateUpdateExpression")
    item = attributes.validate_attributes(body["Item"]) if "Item" in body else {}
    mode = optional_str(body, "UpdateMode")
    if mode is not None and mode not in _MODES:
        raise errors.invalid(f"UpdateMode {mode!r} is not one of {', '.join(_MODES)}")
    if actions is None and not item:
        raise errors.invalid("UpdateItem needs an UpdateExpression")
    with store.transaction():
        node = _existing_item(store, target.container, path)
        if mode == MODE_CREATE_ONLY and node is not None:
            raise errors.ItemExistsError(path)
        if _holds(condition, namespace.view(store, node), "ConditionExpression"):
            chosen = actions
        elif alternate is not None:
            chosen = alternate
        else:
            raise errors.condition_false()
        attrs = {**(node.attrs if node is not None else {}), **item}
        if chosen:
            attrs = _apply(store, node, attrs, chosen)
        node = _write(store, target.container, path, node, attrs)
    return Response(200, headers=namespace.verifier(node))


def get_item(store: Storage, target: Target, request: Request) -> Response:
    body = json_body(request, allow_empty=True)
    path = _item_path(target, body)
    spec = optional_str(body, "AttributesToGet") or "*"
    node = store.get_node(target.container, path)
    if node is None:
        raise errors.no_such_file()
    return json_response({"Item": namespace.select(store, node, spec)}, headers=namespace.verifier(node))


def _encode_marker(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def _decode_marker(marker: str) -> str:
    try:
        return base64.urlsafe_b64decode(marker.encode()).decode()
    except (binascii.Error, UnicodeError, ValueError):
        raise errors.invalid("Marker is not a marker this server returned") from None


class _KeyRange:
    """A range scan: the items whose sharding key (the name left of its leftmost period) is ``sharding_key``
    and whose sorting key (the rest) lies in ``[start, end)``, in name order, as the platform keeps them."""

    def __init__(self, sharding_key: str, start: str | None, end: str | None) -> None:
        if "." in sharding_key or not sharding_key:
            raise errors.invalid("ShardingKey must be a non-empty sharding-key value without periods")
        self.sharding_key, self.start, self.end = sharding_key, start, end
        floor = sharding_key if start is None else f"{sharding_key}.{start}"
        self.scan_after = floor[:-1]
        """Strictly below every name in range (a prefix of the lowest one)."""
        self.upper = f"{sharding_key}.{end}" if end is not None else f"{sharding_key}/"
        """Every name in range sorts below this ('/' follows '.')."""

    def past(self, name: str) -> bool:
        return name >= self.upper

    def holds(self, name: str) -> bool:
        key, _, sort_key = name.partition(".")
        return (
            key == self.sharding_key
            and (self.start is None or sort_key >= self.start)
            and (self.end is None or sort_key < self.end)
        )


def _key_range(body: dict[str, Any], parallel: bool) -> _KeyRange | None:
    sharding_key = optional_str(body, "ShardingKey")
    start, end = optional_str(body, "SortKeyRangeStart"), optional_str(body, "SortKeyRangeEnd")
    if sharding_key is None:
        if start is not None or end is not None:
            raise errors.invalid("SortKeyRangeStart and SortKeyRangeEnd need ShardingKey")
        return None
    if parallel:
        raise errors.invalid("a range scan (ShardingKey) and a parallel scan (Segment) cannot be combined")
    return _KeyRange(sharding_key, start, end)


def get_items(store: Storage, target: Target, request: Request) -> Response:
    body = json_body(request, allow_empty=True)
    directory = target.path
    table = optional_str(body, "TableName")
    if table:
        directory = paths.join(directory, paths.normalise(table))
    spec = optional_str(body, "AttributesToGet") or "*"
    filter_node = _condition(body, "FilterExpression")
    marker = optional_str(body, "Marker")
    after = _decode_marker(marker) if marker else ""
    limit = optional_int(body, "Limit", minimum=1) or MAX_PAGE
    page = min(limit, MAX_PAGE)
    total = optional_int(body, "TotalSegment", minimum=1)
    segment = optional_int(body, "Segment", minimum=0)
    if segment is not None and segment >= (total or 1):
        raise errors.invalid(f"Segment {segment} must be below TotalSegment {total or 1}")
    key_range = _key_range(body, parallel=total is not None or segment is not None)

    if directory:
        node = store.get_node(target.container, directory)
        if node is None:
            raise errors.no_such_file()
        if node.kind != KIND_DIRECTORY:
            raise errors.not_a_directory(directory)

    items: list[TypedAttributes] = []
    last_name = after if key_range is None else max(after, key_range.scan_after)
    exhausted = False
    while len(items) < page and not exhausted:
        batch = store.children(target.container, directory, after=last_name, limit=MAX_PAGE)
        if not batch:
            exhausted = True
            break
        for child in batch:
            if key_range is not None and key_range.past(child.name):
                exhausted = True
                break
            last_name = child.name
            if child.kind == KIND_DIRECTORY or (key_range is not None and not key_range.holds(child.name)):
                continue
            if total and (zlib.crc32(child.name.encode()) % total) != (segment or 0):
                continue
            if filter_node is not None and not _holds(filter_node, namespace.view(store, child), "FilterExpression"):
                continue
            items.append(namespace.select(store, child, spec))
            if len(items) >= page:
                break
    if not exhausted and len(items) >= page:
        following = store.children(target.container, directory, after=last_name, limit=1)
        exhausted = not following or (key_range is not None and key_range.past(following[0].name))
    payload: dict[str, Any] = {
        "LastItemIncluded": "TRUE" if exhausted else "FALSE",
        "NumItems": len(items),
        "Items": items,
    }
    if not exhausted:
        payload["NextMarker"] = _encode_marker(last_name)
    return json_response(payload)
