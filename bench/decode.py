"""Typed records: how fast the ranges read decoded, against the same records read as bytes and against the peer.

    python -m bench.decode [--records 2000000] [--partitions 8] [--rounds 3] [--warmup 2]
        [--formats avro,protobuf,json_schema]

Starts the local broker and the local Schema Registry (or uses ``STREAMGROUP_KAFKA_BOOTSTRAP`` /
``STREAMGROUP_SCHEMA_REGISTRY_URL``), registers the schemas through confluent-kafka's ``SchemaRegistryClient`` and
produces, on one topic per format, ``--records`` records of about 100 bytes (10 fields; Avro in two writer versions
mixed record by record, the second adding a field with a default) over ``--partitions`` partitions, in the Confluent
wire format. Then, in two ``local[2]`` Spark sessions of their own processes (the whole tree measured from ``/proc``,
the broker apart), every variant reads every record of its topic and writes it to Spark's ``noop`` sink (every
column computed, nothing stored):

- ``bytes_<format>``: the ``streamgroup-kafka`` source as bytes (today's read);
- ``<format>``: the same source decoding typed records (``formats``: Polars' Avro reader, protobuf, Arrow's JSON
  reader, in the Spark tasks), the reader schema the subject's latest;
- ``peer_avro``: Spark's own Kafka source with the five-byte header cut off and spark-avro's ``from_avro`` with the
  writer schema of each record's id and the latest as the reader schema (``avroSchema``), as users decode by hand
  today (one ``from_avro`` branch per writer id);
- ``avro_spark_avro``: our source as bytes decoded the peer's way (``from_avro`` per writer id, in the JVM): Python
  decoding in the tasks against Spark's own, on the same reader.

Every session reads its variants once off the clock and checks the record count; each round then runs every
variant in an order rotated per round. Figures: ``ratio_decoded_vs_bytes`` (``avro`` / ``bytes_avro``, goal >= 0.8),
``ratio_vs_peer`` (``avro`` / ``peer_avro``, goal >= 1.2), the same of Protobuf and JSON Schema against their bytes
(goal >= 0.6), ``ratio_python_vs_spark_avro`` and CPU seconds per million records beside each; goals are printed,
never asserted. The last line is one JSON object of the medians over the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import multiprocessing.connection
import random
import statistics
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.context import SpawnProcess
from typing import TYPE_CHECKING, Any

from bench.read_throughput import (
    _answer,
    broker,
    per_million,
    rotated,
    spark_kafka_options,
    spent,
    tree_cpu_by_part,
)
from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.kafka_data import BULK_PRODUCER, create_topics, delete_topics, produce_or_wait
from dagster_streamgroup.local.schema_registry import external_registry, running_registry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FORMATS = ("avro", "protobuf", "json_schema")
GOALS = {"ratio_decoded_vs_bytes": 0.8, "ratio_vs_peer": 1.2, "ratio_protobuf_vs_bytes": 0.6,
         "ratio_json_schema_vs_bytes": 0.6}  # fmt: skip

CLICK_V1: dict[str, Any] = {
    "type": "record",
    "name": "Click",
    "namespace": "bench",
    "fields": [
        {"name": "user_id", "type": "long"},
        {"name": "session", "type": "string"},
        {"name": "page", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "price", "type": "double"},
        {"name": "qty", "type": "int"},
        {"name": "country", "type": "string"},
        {"name": "mobile", "type": "boolean"},
        {"name": "referrer", "type": ["null", "string"], "default": None},
        {"name": "score", "type": "float"},
    ],
}
CLICK_V2: dict[str, Any] = {
    **CLICK_V1,
    "fields": [*CLICK_V1["fields"], {"name": "campaign", "type": "string", "default": ""}],
}
"""The second writer: a field added with a default (BACKWARD-compatible: the registry accepts it)."""

JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Click",
    "properties": {
        "user_id": {"type": "integer"},
        "session": {"type": "string"},
        "page": {"type": "string"},
        "ts": {"type": "string", "format": "date-time"},
        "price": {"type": "number"},
        "qty": {"type": "integer"},
        "country": {"type": "string"},
        "mobile": {"type": "boolean"},
        "referrer": {"type": ["string", "null"]},
        "score": {"type": "number"},
    },
}
PROTO_FIELDS = [("user_id", "int64"), ("session", "string"), ("page", "string"), ("ts", "int64"),
                ("price", "double"), ("qty", "int32"), ("country", "string"), ("mobile", "bool"),
                ("referrer", "string"), ("score", "float")]  # fmt: skip


def click(i: int, rng: random.Random) -> dict[str, Any]:
    """One record's values: about 100 bytes in Avro."""
    return {
        "user_id": rng.randrange(1, 10_000_000),
        "session": f"{rng.getrandbits(96):024x}",
        "page": f"/product/{rng.randrange(100_000)}/details",
        "ts": 1_790_000_000_000 + i,
        "price": round(rng.uniform(1, 500), 2),
        "qty": rng.randrange(1, 10),
        "country": rng.choice(["DE", "FR", "US", "JP", "BR"]),
        "mobile": rng.random() < 0.6,
        "referrer": None if rng.random() < 0.5 else f"https://ref.example/{rng.randrange(1000)}/landing",
        "score": rng.random(),
    }


def proto_class() -> Any:
    """The Protobuf message of the same fields (as ``protoc`` would make it)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    kinds = {
        "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
        "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
        "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        "double": descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
        "float": descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
        "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    }
    file = descriptor_pb2.FileDescriptorProto(name="bench/click.proto", package="bench", syntax="proto3")
    message = file.message_type.add(name="Click")
    for number, (name, kind) in enumerate(PROTO_FIELDS, 1):
        message.field.add(name=name, number=number, type=kinds[kind], label=1)
    pool = descriptor_pool.DescriptorPool()
    return message_factory.GetMessageClass(pool.Add(file).message_types_by_name["Click"])


def framed_values(
    fmt: str, registry_url: str, topic: str, count: int, seed: int = 7
) -> tuple[list[bytes], dict[int, str]]:
    """``count`` framed records of ``fmt`` (schemas registered through confluent-kafka's client and serializers),
    and the writer schemas by id (for the peer's ``from_avro``)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.serialization import MessageField, SerializationContext

    rng = random.Random(seed)
    client = SchemaRegistryClient({"url": registry_url})
    context = SerializationContext(topic, MessageField.VALUE)
    if fmt == "avro":
        import fastavro
        from confluent_kafka.schema_registry.avro import AvroSerializer

        writers = {}
        parsed = []
        for schema in (CLICK_V1, CLICK_V2):
            text = json.dumps(schema)
            sample = click(0, rng)
            if schema is CLICK_V2:
                sample["campaign"] = "x"
            first = AvroSerializer(schema_registry_client=client, schema_str=text)(sample, context)
            schema_id = struct.unpack(">I", first[1:5])[0]
            writers[schema_id] = text
            parsed.append((struct.pack(">bI", 0, schema_id), fastavro.parse_schema(schema)))
        out = []
        buffer = io.BytesIO()
        for i in range(count):
            record = click(i, rng)
            header, schema = parsed[i % 2]
            if i % 2:
                record["campaign"] = f"c{i % 17}"
            buffer.seek(0)
            buffer.truncate()
            fastavro.schemaless_writer(buffer, schema, record)
            out.append(header + buffer.getvalue())
        return out, writers
    if fmt == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        cls = proto_class()
        serializer = ProtobufSerializer(
            msg_type=cls, schema_registry_client=client, conf={"use.deprecated.format": False}
        )
        first = serializer(cls(**{k: v for k, v in click(0, rng).items() if v is not None}), context)
        header = first[:6]  # magic, id, the message index [0]
        out = []
        for i in range(count):
            values = {k: v for k, v in click(i, rng).items() if v is not None}
            out.append(header + cls(**values).SerializeToString())
        return out, {}
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    serializer = JSONSerializer(schema_str=json.dumps(JSON_SCHEMA), schema_registry_client=client)

    def as_json(i: int) -> dict[str, Any]:
        record = click(i, rng)
        record["ts"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record["ts"] / 1000)) + "Z"
        return record

    header = serializer(as_json(0), context)[:5]
    return [header + json.dumps(as_json(i), separators=(",", ":")).encode() for i in range(count)], {}


def produce_values(bootstrap: str, topic: str, partitions: int, values: Sequence[bytes]) -> dict[int, int]:
    """The values round-robin over the partitions (an idempotent bulk producer); each partition's end offset."""
    from confluent_kafka import Producer

    producer = Producer({**BULK_PRODUCER, "enable.idempotence": True, "bootstrap.servers": bootstrap})
    counts = dict.fromkeys(range(partitions), 0)
    for i, value in enumerate(values):
        produce_or_wait(producer, topic, value, partition=i % partitions)
        counts[i % partitions] += 1
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise TimeoutError("records still undelivered after 300 s")
    return counts


def from_avro_by_id(df: DataFrame, writers: Mapping[int, str], reader: str) -> DataFrame:
    """``value`` decoded as users do it by hand: the header cut off, ``from_avro`` with each id's writer schema
    and the latest as the reader schema (one branch per writer id), the id as a column."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)
    from pyspark.sql.avro.functions import from_avro

    schema_id = F.conv(F.hex(F.substring("value", 2, 4)), 16, 10).cast("int")
    payload = F.expr("substring(value, 6)")
    decoded = None
    for writer_id, text in sorted(writers.items()):
        branch = from_avro(payload, text, {"mode": "PERMISSIVE", "avroSchema": reader})
        decoded = (
            F.when(schema_id == writer_id, branch) if decoded is None else decoded.when(schema_id == writer_id, branch)
        )
    assert decoded is not None
    columns = [c for c in df.columns if c != "value"]
    return df.select(*columns, decoded.alias("value"), schema_id.alias("valueSchemaId"))


def _session_main(conn: multiprocessing.connection.Connection, settings: dict[str, Any]) -> None:
    """A ``local[2]`` session of its own: for each command (a variant's name) writes its read to ``noop`` and
    answers ``(records, seconds)``; ``count:<variant>`` counts instead (off the clock)."""
    from dagster_streamgroup.formats.config import ColumnFormat, FormatConfig, RegistryConfig
    from dagster_streamgroup.formats.decoder import resolve_readers
    from dagster_streamgroup.formats.spark import decode_options
    from dagster_streamgroup.spark.kafka_source import read_kafka_ranges
    from dagster_streamgroup.spark.session import local_spark_session
    from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

    spark: SparkSession = local_spark_session(
        master=settings["master"],
        app_name=f"bench-decode-{settings['side']}",
        conf={"spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false"},
    )
    bootstrap, registry = settings["bootstrap"], settings["registry"]

    def ours(fmt: str, typed: bool) -> DataFrame:
        topic, ends = settings["topics"][fmt]
        config = KafkaStreamConfig(bootstrap_servers=bootstrap, topics=[topic])
        ranges = {f"{topic}:{p}": (0, end) for p, end in ends.items()}
        decode = None
        if typed:
            formats = FormatConfig(value=ColumnFormat(format=fmt), registry=RegistryConfig(url=registry))
            decode = decode_options(formats, resolve_readers(formats, [topic]))
        return read_kafka_ranges(spark, config, ranges, decode=decode)

    def peer() -> DataFrame:
        topic, ends = settings["topics"]["avro"]
        options = spark_kafka_options(bootstrap, topic, {int(p): e for p, e in ends.items()})
        df = spark.read.format("kafka").options(**options).load()
        return from_avro_by_id(df, settings["writers"], json.dumps(CLICK_V2))

    frames: dict[str, Callable[[], DataFrame]] = {
        "peer_avro": peer,
        "avro_spark_avro": lambda: from_avro_by_id(ours("avro", False), settings["writers"], json.dumps(CLICK_V2)),
    }
    for fmt in settings["formats"]:
        frames[f"bytes_{fmt}"] = lambda fmt=fmt: ours(fmt, False)
        frames[fmt] = lambda fmt=fmt: ours(fmt, True)
    conn.send(("ready", 0.0))
    try:
        while True:
            command = conn.recv()
            if command is None:
                return
            try:
                name = command.removeprefix("count:")
                started = time.perf_counter()
                df = frames[name]()
                if command.startswith("count:"):  # records, decode errors and null values, in one pass
                    errors = "count_if(decodeError is not null)" if "decodeError" in df.columns else "0"
                    row = df.selectExpr("count(*)", errors, "count_if(value is null)").collect()[0]
                    conn.send(((int(row[0]), int(row[1]), int(row[2])), time.perf_counter() - started))
                    continue
                df.write.format("noop").mode("overwrite").save()
                conn.send((-1, time.perf_counter() - started))
            except Exception as exc:  # reported to the parent, which raises it (as text: any exception pickles)
                conn.send(RuntimeError(f"{type(exc).__name__}: {exc}"))
    finally:
        spark.stop()


class Session:
    """A session's process, measured as a whole tree (driver, JVM, Python workers)."""

    def __init__(self, side: str, settings: dict[str, Any]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.proc: SpawnProcess = context.Process(
            target=_session_main, args=(child, {**settings, "side": side}), name=f"decode-{side}", daemon=True
        )
        self.proc.start()
        child.close()
        self.side = side
        _answer(self.conn, self.proc, f"session {side}")

    def ask(self, command: str) -> tuple[Any, float]:
        self.conn.send(command)
        result, seconds = _answer(self.conn, self.proc, f"{self.side} {command}")
        return result, float(seconds)

    def cpu(self) -> dict[str, float]:
        assert self.proc.pid is not None
        pid = self.proc.pid

        def part(p: int) -> str:
            if p == pid:
                return "driver"
            argv = procfs.cmdline(p)
            return "jvm" if argv and argv[0].endswith(b"java") else "python_workers"

        return tree_cpu_by_part(pid, part)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(60)
        if self.proc.is_alive():
            self.proc.kill()


def summarize(
    rates: Mapping[str, Sequence[float]], cpu: Mapping[str, Sequence[Mapping[str, float]]], records: int
) -> dict[str, Any]:
    """The figures from every round's records/s and CPU per variant (pure)."""
    medians = {name: statistics.median(values) for name, values in rates.items() if values}

    def ratio(a: str, b: str) -> float | None:
        return round(medians[a] / medians[b], 3) if a in medians and b in medians else None

    per_record = {
        name: {part: per_million([r.get(part, 0.0) for r in runs], records) for part in sorted({*runs[0]})}
        for name, runs in cpu.items()
        if runs
    }
    return {
        "records_per_s": {name: round(value) for name, value in medians.items()},
        "ratio_decoded_vs_bytes": ratio("avro", "bytes_avro"),
        "ratio_vs_peer": ratio("avro", "peer_avro"),
        "ratio_protobuf_vs_bytes": ratio("protobuf", "bytes_protobuf"),
        "ratio_json_schema_vs_bytes": ratio("json_schema", "bytes_json_schema"),
        "ratio_python_vs_spark_avro": ratio("avro", "avro_spark_avro"),
        "ratio_peer_vs_bytes": ratio("peer_avro", "bytes_avro"),
        "cpu_s_per_million_records": per_record,
        "goals": GOALS,
    }


@contextlib.contextmanager
def registry() -> Iterator[str]:
    external = external_registry()
    if external is not None:
        yield external
        return
    with running_registry() as local:
        yield local.url


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2, help="reads of each variant before the rounds")
    parser.add_argument("--formats", default=",".join(FORMATS), help="some of avro,protobuf,json_schema")
    args = parser.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not formats or any(f not in FORMATS for f in formats):
        parser.error(f"--formats: some of {','.join(FORMATS)}")
    for name in ("records", "partitions", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")

    with broker() as (bootstrap, broker_pid), registry() as registry_url:
        suffix = time.time_ns()
        topics: dict[str, tuple[str, dict[int, int]]] = {}
        writers: dict[int, str] = {}
        sizes: dict[str, float] = {}
        created = []
        sessions: list[Session] = []
        try:
            for fmt in formats:
                topic = f"bench-decode-{fmt.replace('_', '-')}-{suffix}"
                create_topics(bootstrap, {topic: args.partitions})
                created.append(topic)
                started = time.perf_counter()
                values, fmt_writers = framed_values(fmt, registry_url, topic, args.records)
                writers.update(fmt_writers)
                sizes[fmt] = round(sum(map(len, values)) / len(values), 1)
                ends = produce_values(bootstrap, topic, args.partitions, values)
                del values
                topics[fmt] = (topic, ends)
                print(f"produced {args.records} {fmt} records of {sizes[fmt]} B on average over {args.partitions} "
                      f"partitions in {time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
            settings = {"bootstrap": bootstrap, "registry": registry_url, "topics": topics, "writers": writers,
                        "formats": formats, "master": "local[2]"}  # fmt: skip
            ours = Session("ours", settings)
            sessions.append(ours)
            variants: list[tuple[str, Session]] = []
            for fmt in formats:
                variants += [(f"bytes_{fmt}", ours), (fmt, ours)]
            if "avro" in formats:
                variants.append(("avro_spark_avro", ours))
                peer = Session("peer", settings)
                sessions.append(peer)
                variants.append(("peer_avro", peer))

            def broker_cpu() -> float:
                return sum(procfs.tree_cpu_seconds(broker_pid).values()) if broker_pid is not None else 0.0

            for name, session in variants:  # warm, and every record read, off the clock
                (count, bad, nulls), secs = session.ask(f"count:{name}")
                if count != args.records or bad or nulls:
                    raise RuntimeError(f"{name}: read {count} records, {bad} with decode errors, {nulls} null values")
                for _ in range(args.warmup):
                    session.ask(name)
                print(f"checked {name}: {count} records, none bad (count {secs:.1f} s)", flush=True)

            rates: dict[str, list[float]] = {name: [] for name, _ in variants}
            cpu: dict[str, list[dict[str, float]]] = {name: [] for name, _ in variants}
            for round_no in range(args.rounds):
                order = [v for v in rotated([_Named(n, s) for n, s in variants], round_no)]
                for item in order:
                    before, broker_before = item.session.cpu(), broker_cpu()
                    _, seconds = item.session.ask(item.name)
                    used = spent(before, item.session.cpu())
                    reading = {"readers": sum(used.values()), **used, "broker": broker_cpu() - broker_before}
                    rates[item.name].append(args.records / seconds)
                    cpu[item.name].append(reading)
                    print(f"round {round_no + 1} {item.name:>18}: {seconds:6.2f} s {args.records / seconds:11,.0f} "
                          f"rec/s cpu s {round(reading['readers'], 2)}", flush=True)  # fmt: skip
        finally:
            for session in reversed(sessions):
                session.close()
            delete_topics(bootstrap, created)

    figures = summarize(rates, cpu, args.records)
    for key, goal in GOALS.items():
        if figures.get(key) is not None:
            print(f"{key}: {figures[key]} (goal >= {goal})", flush=True)
    print(json.dumps({"records": args.records, "partitions": args.partitions, "rounds": args.rounds,
                      "record_bytes": sizes, **figures}))  # fmt: skip


class _Named:
    def __init__(self, name: str, session: Session) -> None:
        self.name = name
        self.session = session


if __name__ == "__main__":
    main()
