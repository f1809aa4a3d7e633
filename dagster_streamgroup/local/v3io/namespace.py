"""Directories and system attributes shared by the KV, object and stream operations."""

from __future__ import annotations

from dagster_streamgroup.local.v3io import attributes, errors, paths
from dagster_streamgroup.local.v3io.attributes import TypedAttributes, Value
from dagster_streamgroup.local.v3io.storage import KIND_DIRECTORY, KIND_SHARD, NodeRow, Storage

_NS = 1_000_000_000
_MODE_FILE = 0o100644
_MODE_DIR = 0o040755


def ensure_directory(store: Storage, container: str, path: str) -> None:
    """``mkdir -p``: create every missing directory down to ``path`` (the root always exists)."""
    if not path:
        return
    prefix = ""
    for part in path.split("/"):
        prefix = paths.join(prefix, part)
        node = store.get_node(container, prefix)
        if node is None:
            store.create_node(container, prefix, KIND_DIRECTORY)
        elif node.kind != KIND_DIRECTORY:
            raise errors.not_a_directory(prefix)


def system_attributes(store: Storage, node: NodeRow) -> TypedAttributes:
    mtime_s, mtime_ns = divmod(node.mtime_ns, _NS)
    ctime_s, ctime_ns = divmod(node.ctime_ns, _NS)
    number = attributes.number
    system: TypedAttributes = {
        "__name": {"S": node.name},
        "__size": number(node.size),
        "__mode": number(_MODE_DIR if node.kind == KIND_DIRECTORY else _MODE_FILE),
        "__mtime_secs": number(mtime_s),
        "__mtime_nsecs": number(mtime_ns),
        "__atime_secs": number(mtime_s),
        "__atime_nsecs": number(mtime_ns),
        "__ctime_secs": number(ctime_s),
        "__ctime_nsecs": number(ctime_ns),
        "__uid": number(0),
        "__gid": number(0),
        "__obj_type": number(node.kind),
    }
    if node.kind == KIND_SHARD:
        shard = store.shard_by_node(node.id)
        if shard is not None:
            system["__last_sequence_num"] = number(shard.last_seq)
    return system


def view(store: Storage, node: NodeRow | None) -> dict[str, Value]:
    """Decoded user and system attributes, what conditions and update expressions read."""
    if node is None:
        return {}
    values = {name: attributes.decode(typed) for name, typed in node.attrs.items()}
    values.update({name: attributes.decode(typed) for name, typed in system_attributes(store, node).items()})
    return values


def select(store: Storage, node: NodeRow, spec: str) -> TypedAttributes:
    """``AttributesToGet``: ``*`` user attributes, ``**`` everything, else the listed names that exist."""
    spec = spec.strip() or "*"
    if spec == "*":
        return {name: typed for name, typed in node.attrs.items() if not name.startswith("__")}
    if spec == "**":
        return {**node.attrs, **system_attributes(store, node)}
    names = [name.strip() for name in spec.split(",") if name.strip()]
    system = system_attributes(store, node) if any(name in attributes.SYSTEM_ATTRIBUTES for name in names) else {}
    out: TypedAttributes = {}
    for name in names:
        if name == "*":
            out.update({n: t for n, t in node.attrs.items() if not n.startswith("__")})
        elif name in node.attrs:
            out[name] = node.attrs[name]
        elif name in system:
            out[name] = system[name]
    return out


def verifier(node: NodeRow) -> list[tuple[str, str]]:
    """``X-v3io-transaction-verifier``: v3io-go fails a write without it; storey reads it as a CAS condition."""
    secs, nsecs = divmod(node.mtime_ns, _NS)
    return [("X-v3io-transaction-verifier", f"__mtime_secs=={secs} and __mtime_nsecs=={nsecs}")]
