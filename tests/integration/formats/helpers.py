"""Typed records as real producers write them: schemas registered and records serialized by confluent-kafka's own
``SchemaRegistryClient`` and serializers against the real registry, written to the real broker."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from dagster_streamgroup.local.kafka_data import produce_records


def avro_values(
    registry_url: str, topic: str, schema: Mapping[str, Any], records: Sequence[Mapping[str, Any]]
) -> list[bytes]:
    """``records`` serialized as a producer with ``schema`` writes them (registered under ``<topic>-value``)."""
    client = SchemaRegistryClient({"url": registry_url})
    serializer = AvroSerializer(schema_registry_client=client, schema_str=json.dumps(schema))
    context = SerializationContext(topic, MessageField.VALUE)
    return [serializer(dict(r), context) for r in records]


def schema_id(registry_url: str, subject: str, version: int | str = "latest") -> int:
    client = SchemaRegistryClient({"url": registry_url})
    return int(client.get_version(subject, version).schema_id)  # type: ignore[arg-type]


def produce(bootstrap: str, topic: str, values: Sequence[bytes | None], partition: int = 0) -> list[int]:
    return produce_records(bootstrap, topic, partition, values)


CLICK_V1 = {
    "type": "record",
    "name": "Click",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "page", "type": "string"},
        {"name": "referrer", "type": "string", "default": ""},
    ],
}
"""The first writer."""

CLICK_V2 = {
    "type": "record",
    "name": "Click",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "page", "type": "string"},
        {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}],
         "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 0},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["VIEW", "BUY"]}, "default": "VIEW"},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    ],
}  # fmt: skip
"""The second writer: ``id`` widened to a long, ``referrer`` removed, fields added with defaults (a decimal, a
timestamp, an enum, an array); BACKWARD-compatible with the first, so the registry accepts it."""


def proto_class(package: str, name: str, fields: Sequence[tuple[str, int, str]]) -> Any:
    """A generated-like Protobuf message class (``fields``: name, number, scalar type), as ``protoc`` would make
    from a ``.proto`` file of one message, for confluent-kafka's ProtobufSerializer."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    types = {
        "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
        "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
        "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        "double": descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
        "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    }
    file = descriptor_pb2.FileDescriptorProto(name=f"{package}/{name.lower()}.proto", package=package, syntax="proto3")
    message = file.message_type.add(name=name)
    for field_name, number, kind in fields:
        message.field.add(
            name=field_name, number=number, type=types[kind], label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
        )
    pool = descriptor_pool.DescriptorPool()
    descriptor = pool.Add(file).message_types_by_name[name]
    return message_factory.GetMessageClass(descriptor)


def protobuf_values(registry_url: str, topic: str, cls: Any, records: Sequence[Mapping[str, Any]]) -> list[bytes]:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    client = SchemaRegistryClient({"url": registry_url})
    serializer = ProtobufSerializer(msg_type=cls, schema_registry_client=client, conf={"use.deprecated.format": False})
    context = SerializationContext(topic, MessageField.VALUE)
    return [serializer(cls(**r), context) for r in records]


def json_schema_values(
    registry_url: str, topic: str, schema: Mapping[str, Any], records: Sequence[Mapping[str, Any]]
) -> list[bytes]:
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    client = SchemaRegistryClient({"url": registry_url})
    serializer = JSONSerializer(schema_str=json.dumps(schema), schema_registry_client=client)
    context = SerializationContext(topic, MessageField.VALUE)
    return [serializer(dict(r), context) for r in records]
