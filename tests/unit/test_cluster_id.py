"""The local broker's KRaft cluster ids: Kafka's storage tool takes an id that starts with ``-`` for an option."""

from __future__ import annotations

import base64

from dagster_streamgroup.local.kafka_broker import new_cluster_id


def test_cluster_ids_are_sixteen_bytes_and_never_start_with_a_dash() -> None:
    ids = [new_cluster_id() for _ in range(2000)]  # about 31 of them would start with "-" unless refused
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
