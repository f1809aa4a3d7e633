"""Simple objects, directories and listings through the real client (requests without X-v3io-function)."""

from __future__ import annotations

from typing import Any

import pytest
import v3io.dataplane

from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io_server.helpers import CONTAINER, NEVER, error_of

pytestmark = pytest.mark.v3io


def test_object_put_get_range_append_delete(v3io_client: Any) -> None:
    path = unique_v3io_name("dir") + "/obj ect.txt"  # percent-encoded on the wire
    v3io_client.object.put(CONTAINER, path, body="hello world")
    assert v3io_client.object.get(CONTAINER, path).body == b"hello world"
    assert v3io_client.object.get(CONTAINER, path, offset=6).body == b"world"
    assert v3io_client.object.get(CONTAINER, path, offset=0, num_bytes=5).body == b"hello"
    v3io_client.object.put(CONTAINER, path, body=b"!!", append=True)
    assert v3io_client.object.get(CONTAINER, path).body == b"hello world!!"
    head = v3io_client.object.head(CONTAINER, path)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) == 13
    assert v3io_client.object.delete(CONTAINER, path).status_code == 204
    missing = v3io_client.object.get(CONTAINER, path, raise_for_status=NEVER)
    assert missing.status_code == 404 and "No such file" in error_of(missing)["ErrorMessage"]


def test_directories_and_listing(v3io_client: Any) -> None:
    root = unique_v3io_name("tree")
    v3io_client.object.put(CONTAINER, f"{root}/empty/")
    for name in ("a", "b", "c"):
        v3io_client.object.put(CONTAINER, f"{root}/{name}.txt", body=name * 3)
    v3io_client.kv.put(CONTAINER, f"{root}/items", "k", {"x": 1})
    v3io_client.stream.create(CONTAINER, f"{root}/stream", shard_count=3, retention_period_hours=2)
    assert v3io_client.object.head(CONTAINER, f"{root}/stream").status_code == 200

    listing = v3io_client.container.list(CONTAINER, root).output
    assert listing.name == CONTAINER and listing.is_truncated == "false"
    assert [(c.key, c.size) for c in listing.contents] == [(f"{root}/{n}.txt", 3) for n in "abc"]
    assert [p.prefix for p in listing.common_prefixes] == [f"{root}/{d}/" for d in ("empty", "items", "stream")]

    dirs = v3io_client.container.list(CONTAINER, root + "/", directories_only=True).output
    assert dirs.contents == [] and len(dirs.common_prefixes) == 3

    info = v3io_client.container.list(CONTAINER, root + "/", get_all_attributes=True).output
    assert all(hasattr(c, "inode_number") and hasattr(c, "mode") for c in info.contents)

    first = v3io_client.container.list(CONTAINER, root + "/", limit=2).output
    assert first.is_truncated == "true" and len(first.contents) == 2
    rest = v3io_client.container.list(CONTAINER, root + "/", marker=first.next_marker).output
    assert [c.key for c in rest.contents] == [f"{root}/c.txt"] and len(rest.common_prefixes) == 3

    missing = v3io_client.container.list(CONTAINER, unique_v3io_name("nope") + "/", raise_for_status=NEVER)
    assert missing.status_code == 404 and b"No such file" in missing.body

    v3io_client.object.delete(CONTAINER, root + "/")  # recursive
    assert v3io_client.object.head(CONTAINER, f"{root}/a.txt", raise_for_status=NEVER).status_code == 404
    assert v3io_client.stream.describe(CONTAINER, f"{root}/stream", raise_for_status=NEVER).status_code == 404


def test_shard_listing_carries_last_sequence_id(v3io_client: Any) -> None:
    stream = unique_v3io_name("stream")
    v3io_client.stream.create(CONTAINER, stream, shard_count=2)
    v3io_client.stream.put_records(CONTAINER, stream, [{"data": "x", "shard_id": 1}] * 5)
    (shard,) = v3io_client.container.list(CONTAINER, stream + "/").output.contents
    assert (shard.key, shard.last_sequence_id) == (f"{stream}/1", 5)
    refused = v3io_client.object.put(CONTAINER, f"{stream}/1", body="data", raise_for_status=NEVER)
    assert refused.status_code == 400


def test_containers(v3io_client: Any) -> None:
    names = [c.name for c in v3io_client.get_containers().output.containers]
    assert names == ["bigdata", "users"]
    response = v3io_client.kv.get("nosuchcontainer", "t", "k", raise_for_status=NEVER)
    assert response.status_code == 404 and "Container not found" in error_of(response)["ErrorMessage"]
    with pytest.raises(v3io.dataplane.response.HttpResponseError, match="Container not found"):
        v3io_client.object.get("nosuchcontainer", "x")


def test_object_errors(v3io_client: Any) -> None:
    base = unique_v3io_name("objs")
    v3io_client.object.put(CONTAINER, f"{base}/file", body="x")
    under_file = v3io_client.object.put(CONTAINER, f"{base}/file/child", body="y", raise_for_status=NEVER)
    assert under_file.status_code == 400 and "Not a directory" in error_of(under_file)["ErrorMessage"]
    v3io_client.object.put(CONTAINER, f"{base}/dir/")
    over_dir = v3io_client.object.put(CONTAINER, f"{base}/dir", body="y", raise_for_status=NEVER)
    assert over_dir.status_code == 400 and "Is a directory" in error_of(over_dir)["ErrorMessage"]
    assert v3io_client.object.delete(CONTAINER, f"{base}/gone", raise_for_status=NEVER).status_code == 404
