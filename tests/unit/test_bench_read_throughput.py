"""The arithmetic of ``bench.read_throughput``: how partitions are dealt to reader processes, the order of the
variants in each round, the ratios at equal parallelism, the options of Spark's own Kafka source for exactly the
produced records, and the per-partition exactness check."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.read_throughput import (
    FAMILIES,
    Reading,
    Variant,
    offset_mismatches,
    parse_families,
    rotated,
    session_sizes,
    spark_kafka_options,
    split_partitions,
    summarize,
)


def test_partitions_are_dealt_in_disjoint_sets_even_in_records() -> None:
    ends = {0: 100, 1: 100, 2: 100, 3: 100, 4: 100, 5: 100, 6: 100, 7: 101}
    sets = split_partitions(ends, 2)
    assert len(sets) == 2
    assert sorted(p for s in sets for p in s) == list(range(8))  # every partition, once
    assert {p: e for s in sets for p, e in s.items()} == ends
    assert sorted(sum(s.values()) for s in sets) == [400, 401]
    uneven = split_partitions({0: 900, 1: 100, 2: 100, 3: 100}, 2)
    assert sorted(sum(s.values()) for s in uneven) == [300, 900]  # the big partition alone


def test_fewer_partitions_than_processes_leave_no_empty_reader() -> None:
    assert split_partitions({0: 10, 1: 10}, 4) == [{0: 10}, {1: 10}]
    assert split_partitions({0: 10, 1: 10}, 1) == [{0: 10, 1: 10}]
    with pytest.raises(ValueError, match="n: must be >= 1"):
        split_partitions({0: 1}, 0)


def test_each_round_starts_one_variant_further_along() -> None:
    def read() -> Reading:
        raise AssertionError("not read")

    variants = [Variant(name, read) for name in ("raw_2", "spark_local_2", "spark_local_1")]
    orders = [[v.name for v in rotated(variants, r)] for r in range(4)]
    assert orders == [
        ["raw_2", "spark_local_2", "spark_local_1"],
        ["spark_local_2", "spark_local_1", "raw_2"],
        ["spark_local_1", "raw_2", "spark_local_2"],
        ["raw_2", "spark_local_2", "spark_local_1"],
    ]
    assert {order[0] for order in orders[:3]} == {"raw_2", "spark_local_2", "spark_local_1"}


def test_the_headline_ratio_compares_equal_parallelism_with_cpu_per_record_beside_it() -> None:
    rates = {
        "raw_1": [1_000_000.0, 1_100_000.0, 900_000.0],
        "raw_2": [1_800_000.0, 2_000_000.0, 1_900_000.0],
        "arrow_2": [1_000_000.0, 1_000_000.0, 1_000_000.0],
        "spark_local_1": [400_000.0, 500_000.0, 450_000.0],
        "spark_local_2": [800_000.0, 950_000.0, 900_000.0],
    }
    raw_cpu = {"readers": 2.0, "broker": 1.0}
    spark_cpu = {"readers": 8.0, "driver": 0.5, "jvm": 4.5, "python_workers": 3.0, "broker": 1.2}
    cpu = {
        "raw_2": [raw_cpu, raw_cpu, {"readers": 2.2, "broker": 1.0}],
        "spark_local_2": [spark_cpu, spark_cpu, spark_cpu],
    }
    figures = summarize(rates, cpu, 2_000_000, 2)
    assert figures["ratio"] == pytest.approx(900_000 / 1_900_000, abs=1e-3)  # local[2] against two processes
    assert figures["ratio_one_task"] == pytest.approx(450_000 / 1_000_000, abs=1e-3)
    assert figures["ratio_vs_arrow_readers"] == pytest.approx(0.9)
    assert figures["ratio_unequal"] == pytest.approx(900_000 / 1_000_000, abs=1e-3)  # the comparison before
    assert figures["round_ratios"] == pytest.approx([0.444, 0.475, 0.474], abs=1e-3)
    assert figures["cpu_s_per_million_records"]["raw_2"] == {"broker": 0.5, "readers": 1.0}
    assert figures["cpu_s_per_million_records"]["spark_local_2"]["readers"] == 4.0
    assert figures["cpu_ratio"] == 4.0
    assert figures["records_per_s"]["raw_1"] == 1_000_000


def test_against_sparks_kafka_source_the_ratios_pair_equal_parallelism() -> None:
    rates = {
        "spark_local_1": [400_000.0, 500_000.0, 450_000.0],
        "spark_local_2": [800_000.0, 950_000.0, 900_000.0],
        "spark_kafka_local_1": [500_000.0, 500_000.0, 600_000.0],
        "spark_kafka_local_2": [1_000_000.0, 1_000_000.0, 900_000.0],
    }
    ours = {"readers": 3.0, "driver": 0.0, "jvm": 1.0, "python_workers": 2.0, "broker": 0.2}
    theirs = {"readers": 2.0, "driver": 0.0, "jvm": 2.0, "python_workers": 0.0, "broker": 0.3}
    cpu = {"spark_local_2": [ours] * 3, "spark_kafka_local_2": [theirs] * 3}
    figures = summarize(rates, cpu, 1_000_000, 2)
    assert figures["ratio_spark_kafka"] == pytest.approx(900_000 / 1_000_000, abs=1e-3)  # medians, local[2] both
    assert figures["ratio_spark_kafka_one_task"] == pytest.approx(450_000 / 500_000, abs=1e-3)
    assert figures["round_ratios_spark_kafka"] == pytest.approx([0.8, 0.95, 1.0], abs=1e-3)
    assert figures["cpu_ratio_spark_kafka"] == 1.5  # our readers' CPU per record over theirs, the broker apart
    assert figures["ratio"] is None and figures["cpu_ratio"] is None  # no raw readers ran


def test_ratios_of_variants_not_run_are_none() -> None:
    figures = summarize({"raw_2": [1.0], "raw_1": [1.0]}, {"raw_2": [{"readers": 1.0}]}, 10, 2)
    assert figures["ratio"] is None and figures["ratio_one_task"] is None and figures["cpu_ratio"] is None
    assert figures["round_ratios"] == []
    assert figures["ratio_spark_kafka"] is None and figures["ratio_spark_kafka_one_task"] is None
    assert figures["cpu_ratio_spark_kafka"] is None and figures["round_ratios_spark_kafka"] == []


def test_variant_families_option() -> None:
    assert parse_families("raw, spark") == ("raw", "spark")
    assert parse_families("spark,spark_kafka") == ("spark", "spark_kafka")
    assert "spark_kafka" in FAMILIES  # on by default
    for bad in ("", "raw,flink", "kafka"):
        with pytest.raises(argparse.ArgumentTypeError, match="--variants"):
            parse_families(bad)


def test_sparks_kafka_source_reads_the_exact_offsets_committed_with_headers() -> None:
    options = spark_kafka_options("127.0.0.1:9092", "t", {1: 7, 0: 5})
    assert options == {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "assign": '{"t": [0, 1]}',
        "startingOffsets": '{"t": {"0": 0, "1": 0}}',
        "endingOffsets": '{"t": {"0": 5, "1": 7}}',
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "true",
    }
    assert json.loads(options["endingOffsets"]) == {"t": {"0": 5, "1": 7}}
    split = spark_kafka_options("b:1", "t", {0: 5}, min_partitions=4, max_records_per_partition=1000)
    assert split["minPartitions"] == "4" and split["maxRecordsPerPartition"] == "1000"


def test_offset_mismatches_name_each_partition_not_read_exactly() -> None:
    ends = {0: 3, 1: 2, 2: 0}
    assert offset_mismatches([(0, 3, 3, 0, 2), (1, 2, 2, 0, 1)], ends) == []  # the empty partition returns no row
    duplicated = offset_mismatches([(0, 3, 2, 0, 2), (1, 2, 2, 0, 1)], ends)  # right count, an offset twice
    assert len(duplicated) == 1 and duplicated[0].startswith("partition 0:")
    missing = offset_mismatches([(0, 3, 3, 0, 2)], ends)
    assert missing == ["partition 1: expected (records, distinct offsets, first, last) (2, 2, 0, 1), got None"]
    extra = offset_mismatches([(0, 3, 3, 0, 2), (1, 2, 2, 0, 1), (2, 1, 1, 0, 0)], ends)
    assert extra == ["partition 2: expected (records, distinct offsets, first, last) None, got (1, 1, 0, 0)"]


def test_sessions_each_source_needs() -> None:
    assert session_sizes({"spark", "spark_kafka", "parquet"}, 2) == {"ours": [1, 2], "kafka": [1, 2]}
    assert session_sizes({"parquet"}, 2) == {"ours": [2]}
    assert session_sizes({"spark_kafka"}, 1) == {"kafka": [1]}
    assert session_sizes({"raw", "arrow"}, 2) == {}
