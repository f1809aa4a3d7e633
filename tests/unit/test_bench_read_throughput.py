"""The arithmetic of ``bench.read_throughput``: how partitions are dealt to reader processes, the order of the
variants in each round, and the ratios at equal parallelism."""

from __future__ import annotations

import argparse

import pytest

from bench.read_throughput import Reading, Variant, parse_families, rotated, split_partitions, summarize


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


def test_ratios_of_variants_not_run_are_none() -> None:
    figures = summarize({"raw_2": [1.0], "raw_1": [1.0]}, {"raw_2": [{"readers": 1.0}]}, 10, 2)
    assert figures["ratio"] is None and figures["ratio_one_task"] is None and figures["cpu_ratio"] is None
    assert figures["round_ratios"] == []


def test_variant_families_option() -> None:
    assert parse_families("raw, spark") == ("raw", "spark")
    for bad in ("", "raw,flink"):
        with pytest.raises(argparse.ArgumentTypeError, match="--variants"):
            parse_families(bad)
