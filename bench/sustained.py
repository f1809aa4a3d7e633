"""Our deployment and the peer under a steady stream: lag, units of work and CPU on a ladder of rates.

``python -m bench.sustained [--rates 1000,20000,50000,75000,100000,150000] [--minutes 3] [--sides ours,peer]
[--partitions 32] [--members 3] [--spark connect|local] [--max-records-per-run N] [--peer-parallelism 2]
[--peer-driver-memory 2g] [--warmup-records 8000] [--warmup-rate 50000] [--warmup-s 180] [--sample-s 2]
[--settle-s 60] [--growth-tolerance 0.02] [--behind-tolerance 0.2] [--max-p95-behind-s 30] [--timeout 300]``

Two sides, one after the other on the same local broker, each on a ``--partitions`` topic of its own, with
the same producer, rates, windows and rules:

- **ours** (``our_side``): the local Spark Connect server and the example deployment (``bench.deployment``:
  ``dagster dev`` with the example's member sensors and stream asset and the project's ``dagster.yaml``),
  started as ``bench.e2e`` starts it; what it has committed is Kafka's group offsets (the group mirrors each
  commit there); its units of work are the runs Dagster created;
- **the peer** (``peer_side``): what a Spark user would run instead, Spark Structured Streaming's own Kafka
  source with the default trigger (``bench.peer_follow``: a micro-batch as soon as the one before ended,
  ``read_committed``, the example's function through ``foreachBatch`` into the same range-keyed sink), a
  ``local[--peer-parallelism]`` session in a process of its own; what it has committed is the end offsets of
  the last batch committed to its checkpoint; its units of work are those micro-batches.

Each side drains ``--warmup-records`` first, then follows a warm-up stream of ``--warmup-rate`` events/s for
``--warmup-s`` and catches up (``warmup_stream``; its Spark JVM compiles for its first minutes of work, which
would otherwise fall on the first rate). Then, for each rate of ``--rates`` (events/s) in order, a producer
process (``bench.producer``: the example's events, batched) writes for ``--minutes`` while the benchmark
samples, every ``--sample-s``, the broker's high watermarks and what the side has committed. Per rate:

- ``achieved_events_per_s``: what the broker received (high watermarks) over the phase, and the producer's
  own count; the producer's and the broker's CPU, apart from the side's;
- ``lag_records_p50``/``p95``; ``seconds_behind_p50``/``p95``: the age of the oldest record the side has not
  committed (when it appeared at the broker, interpolated from the watermark history);
  ``lag_over_rate_s_p50``/``p95``: records behind divided by the rate;
- ``lag_slope_records_per_s``: least-squares slope of the lag over the phase's second half, and
  ``lag_peak_growth_records_per_s``: how fast its tops rose over that half, the least-squares line through
  every top of the sawtooth (commits come in steps: the sawtooth's least-squares slope swings by up to a
  quarter of the rate either way while its tops stay level);
- ``sustained`` (``judge_sustained``, a pure function of the samples): the tops rose by at most
  ``--growth-tolerance`` (0.02) x the rate, the side caught up within ``--settle-s`` after producing stopped,
  the mean seconds behind of the phase's fourth quarter is not above that of its third by more than
  ``--behind-tolerance`` (0.2) of it (at least one sample interval), and the p95 seconds behind is at most
  ``--max-p95-behind-s`` (30). ``sustained_failed`` names what failed; ``sustained_old_rule`` and
  ``lag_peak_growth_two_point_records_per_s`` are the rule before (two tops, 10% of the rate, nothing else);
- ``runs_per_minute`` (ours) or ``batches_per_minute`` (the peer), and ``deployment_cores``: CPU seconds per
  second of the side's processes (ours: daemon, webserver, code server, runs, Spark Connect server; the peer:
  its driver, JVM and Python workers), with ``cores_by_part``;

then the producer stops and the side gets up to ``--settle-s`` to catch up before the next rate. A side's
ladder stops after a rate the producer could not hold (below 97% of it: what it reached is reported) or the
side did not catch up from (``ladder_stop``; ``ladder_stopped`` says which).

The last line is one JSON object: our per-rate figures and headline figures at the top level
(``max_sustained_events_per_s``: the highest sustained rate, the rate asked for when the producer reached 97%
of it, else what it reached; ``p95_seconds_behind_at_max``; ``p95_seconds_behind_at_50000``;
``cores_at_1000``), the peer's under ``peer``, and the comparison (``comparison``):
``max_sustained_ours_minus_peer`` (goal >= 0), ``p95_at_50000_ours_minus_peer_s`` (goal <= 10) and
``cores_at_1000_ratio`` (ours / the peer's, goal <= 1). Targets are printed, never asserted; ours alone:
50,000 events/s sustained with p95 <= 30 s behind, <= 0.5 cores at 1,000 events/s. The run takes at most
about ``sides x len(rates) x (minutes + settle)`` plus start-up and warm-up.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import process_cpu
from bench.deployment import ExampleSettings, finished_runs, queued_s, running_example, running_s
from bench.figures import highest_by_step, peak_growth, percentile, rounded, second_half, slope, sustained, target_line
from bench.lag import LagSampler
from bench.peer_follow import batches_committed_between, following_peer, wait_committed
from bench.peer_spark_streaming import PeerSpec, produce_clicks
from dagster_streamgroup.dagster.tags import TAG_MEMBER
from dagster_streamgroup.local.kafka_broker import BrokerInfo, running_broker
from dagster_streamgroup.local.kafka_data import create_topics
from dagster_streamgroup.streams.kafka import KafkaBackend
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from jobs.clickstream_events import produce_burst, producers

DEPLOYMENT_PARTS = ("dagster_dev", "daemon", "webserver", process_cpu.CODE_SERVER_AND_RUNS, "spark_connect_server")
PRODUCER_REACHED = 0.97
"""A phase counts at the rate asked for when its producer reached this share of it."""
COMMAND_TIMEOUT_S = 120.0
GROWTH_TOLERANCE = 0.02
"""Default of ``--growth-tolerance``: the lag's peaks may rise by at most this share of the rate."""
BEHIND_TOLERANCE = 0.2
"""Default of ``--behind-tolerance``: how much higher the mean seconds behind of the window's fourth quarter
may be than that of its third, as a share of the third's. Not a measured figure: a simulated sawtooth (three
members committing every 8-25 s, +-20% jitter, read every 2 s over 4-minute windows) moved the quarters' means
apart by under 17% of their level in 99% of windows, with nothing falling behind. The sawtooth's phase, not a
trend, decides that difference, so a fixed number of seconds would fail long run cycles by chance."""
MAX_P95_BEHIND_S = 30.0
"""Default of ``--max-p95-behind-s``: a rate is sustained only with the seconds behind under this at p95."""
LADDER = (1_000.0, 20_000.0, 50_000.0, 75_000.0, 100_000.0, 150_000.0)
"""The default rates (events/s), climbed in order on both sides until ``ladder_stop``."""
OLD_GROWTH_TOLERANCE = 0.1
"""The rule before: two-point peak growth within 10% of the rate, nothing else (``old_rule_sustained``)."""


def lag_peaks(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The tops of the lag's sawtooth: every sample the next one is lower than (a commit came between them),
    unless the one before was higher still (then it is a step down of a commit in parts, not a top), and the
    last sample when it stands above every top found (the tooth in progress has risen at least that far).

    A run commits its ranges at once, so the lag drops in steps; just before a drop it is as high as that
    tooth got (as sampled). A last sample below the last top is left out: its tooth may still rise."""
    peaks = [
        points[i]
        for i in range(len(points) - 1)
        if points[i + 1][1] < points[i][1] and (i == 0 or points[i - 1][1] <= points[i][1])
    ]
    if points and (not peaks or points[-1][1] > max(y for _, y in peaks)):
        peaks.append(points[-1])
    return peaks


def fitted_peak_growth(points: Sequence[tuple[float, float]], start: float, end: float) -> tuple[float | None, int]:
    """How fast the lag's tops rise over the second half of ``[start, end]``: the least-squares slope through
    all of them (``lag_peaks``), in records per second, and how many there were.

    Through every top instead of two, one high or low tooth moves the line little. With fewer than two tops,
    or tops closer together than an eighth of the window, there is no sawtooth to see through (the lag only
    rose, or stayed flat): the slope through every sample of the half is the growth."""
    half = second_half(points, start, end)
    peaks = lag_peaks(half)
    if len(peaks) >= 2 and peaks[-1][0] - peaks[0][0] >= (end - start) / 8:
        return slope(peaks), len(peaks)
    return slope(half), len(peaks)


def quarter_means(ages: Sequence[tuple[float, float]], start: float, end: float) -> tuple[float | None, float | None]:
    """Mean seconds behind over the third and the fourth quarter of ``[start, end]`` (None: no sample there)."""
    length = end - start
    third = [age for t, age in ages if start + length / 2 <= t < start + 3 * length / 4]
    fourth = [age for t, age in ages if start + 3 * length / 4 <= t <= end]
    return (statistics.fmean(third) if third else None, statistics.fmean(fourth) if fourth else None)


@dataclass(frozen=True)
class Verdict:
    """Whether a rate was sustained, and each condition's figure (``judge_sustained``)."""

    sustained: bool
    failed: tuple[str, ...]
    """The conditions that failed: ``lag_peaks_growing``, ``not_caught_up``, ``seconds_behind_rising``,
    ``seconds_behind_p95_over_limit``."""
    peak_growth_records_per_s: float | None
    peaks: int
    growth_limit_records_per_s: float
    behind_q3_s: float | None
    behind_q4_s: float | None
    behind_rise_limit_s: float | None


def judge_sustained(
    points: Sequence[tuple[float, float]],
    ages: Sequence[tuple[float, float]],
    start: float,
    end: float,
    rate: float,
    caught_up: bool,
    *,
    growth_tolerance: float = GROWTH_TOLERANCE,
    behind_tolerance: float = BEHIND_TOLERANCE,
    behind_floor_s: float = 2.0,
    max_p95_behind_s: float | None = None,
) -> Verdict:
    """A rate is sustained when all three hold (four with ``max_p95_behind_s``):

    1. the lag's tops over the window's second half rise by at most ``growth_tolerance`` x ``rate`` records
       per second, fitted through all of them (``fitted_peak_growth``);
    2. the group caught up (committed everything produced) within the settle time after producing stopped:
       a deployment that keeps up has a bounded backlog it can clear;
    3. the mean seconds behind of the fourth quarter is at most that of the third plus
       ``max(behind_floor_s, behind_tolerance x the third's)``: the group is not falling behind in time,
       whatever the record counts say (a starved shard ages while the total lag stays level);
    4. (when ``max_p95_behind_s`` is given) the 95th percentile of the seconds behind over the window is at
       most ``max_p95_behind_s``: a deployment may keep pace and still be too far behind to count.

    ``points`` are (time, records behind) and ``ages`` (time, seconds behind the oldest uncommitted record),
    both sampled over ``[start, end]``. Pure: the samples in, the verdict out."""
    failed: list[str] = []
    growth, peaks = fitted_peak_growth(points, start, end)
    limit = growth_tolerance * rate
    if growth is None or growth > limit:
        failed.append("lag_peaks_growing")
    if not caught_up:
        failed.append("not_caught_up")
    q3, q4 = quarter_means(ages, start, end)
    rise_limit = None if q3 is None else max(behind_floor_s, behind_tolerance * q3)
    if q3 is None or q4 is None or rise_limit is None or q4 - q3 > rise_limit:
        failed.append("seconds_behind_rising")
    if max_p95_behind_s is not None and (percentile([age for _, age in ages], 95) or 0.0) > max_p95_behind_s:
        failed.append("seconds_behind_p95_over_limit")
    return Verdict(not failed, tuple(failed), growth, peaks, limit, q3, q4, rise_limit)


def old_rule_sustained(points: Sequence[tuple[float, float]], start: float, end: float, rate: float) -> bool:
    """The rule before, kept for comparison: the line through the highest lag of the second half's first and
    last halves rose by at most 10% of the rate. Nothing else was required."""
    return sustained(peak_growth(points, start, end), rate, OLD_GROWTH_TOLERANCE)


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rates: comma-separated events/s, got {text!r}") from None
    if not rates or any(rate <= 0 for rate in rates):
        raise argparse.ArgumentTypeError(f"--rates: one or more rates > 0, got {text!r}")
    return rates


def start_producer(broker: BrokerInfo, topic: str, partitions: int, rate: float, seconds: float, log: Path) -> Any:
    command = [
        sys.executable, "-m", "bench.producer",
        "--bootstrap", broker.bootstrap, "--topic", topic, "--partitions", str(partitions),
        "--rate", f"{rate:g}", "--seconds", f"{seconds:g}", "--seed", str(int(rate)),
    ]  # fmt: skip
    with log.open("ab") as err:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)


@dataclass(frozen=True)
class Side:
    """One side of the comparison as a phase measures it: our deployment or the peer, each on a topic of its
    own on the same broker. ``committed`` reads what the side has committed (Kafka's group offsets for ours,
    the checkpoint for the peer), ``units_between`` counts its units of work in a window of epoch seconds
    (runs Dagster created; the peer's committed micro-batches), and the CPU of ``cpu_parts`` of the process
    trees ``cpu_roots`` is the side's (the broker's and the producer's are reported apart)."""

    name: str
    topic: str
    highs: Callable[[], dict[str, int]]
    committed: Callable[[], Mapping[str, int | None]]
    units_between: Callable[[float, float], int]
    unit: str
    cpu_roots: dict[str, int]
    cpu_parts: tuple[str, ...]
    check: Callable[[], None] = lambda: None
    """Raises when the side stopped working (the peer's query failed): a phase must not measure a corpse."""
    cycle_between: Callable[[float, float], dict[str, Any]] | None = None
    """Where a unit's cycle goes in a window of epoch seconds (ours: ``run_cycle``); None where not known."""


def run_cycle(runs: Sequence[Mapping[str, Any]], member_tag: str) -> dict[str, Any]:
    """Where a member's run cycle goes, from Dagster's run records (``creationTime``, ``startTime``,
    ``endTime``, epoch seconds, and the tags): medians and p90 over the runs of ``queued_s`` (created to
    started), ``running_s`` (started to ended: the run's process, its Spark work, its commit) and ``gap_s``
    (a member's run ended to its next run created: the sensor's tick and the daemon's pass), and
    ``cycle_s`` (one of a member's runs created to its next). These are what the seconds behind are made of:
    a record waits for the run in flight and the gap before the run that reads it."""
    by_member: dict[str, list[Mapping[str, Any]]] = {}
    for run in finished_runs(runs):
        member = run["tags"].get(member_tag)
        if member is not None:
            by_member.setdefault(member, []).append(run)
    queued, running, gaps, cycles = [], [], [], []
    for member_runs in by_member.values():
        member_runs.sort(key=lambda run: run["creationTime"])
        queued += [queued_s(run) for run in member_runs]
        running += [running_s(run) for run in member_runs]
        for before, after in itertools.pairwise(member_runs):
            gaps.append(after["creationTime"] - before["endTime"])
            cycles.append(after["creationTime"] - before["creationTime"])

    def spread(values: list[float]) -> dict[str, float | None]:
        return {"p50": rounded(percentile(values, 50), 2), "p90": rounded(percentile(values, 90), 2)}

    return {
        "runs": sum(len(member_runs) for member_runs in by_member.values()),
        "queued_s": spread(queued),
        "running_s": spread(running),
        "gap_s": spread(gaps),
        "cycle_s": spread(cycles),
    }


def settle(sampler: LagSampler, side: Side, settle_s: float) -> tuple[float, bool]:
    """Wait until the side has committed everything produced, at most ``settle_s``."""
    started = time.monotonic()
    highs = side.highs()
    while time.monotonic() - started < settle_s:
        side.check()
        committed = side.committed()
        if all((committed.get(shard) or 0) >= high for shard, high in highs.items()):
            return time.monotonic() - started, True
        time.sleep(sampler.interval_s)
    return time.monotonic() - started, False


def producer_result(producer: Any, seconds: float, what: str, work: Path) -> dict[str, Any]:
    """What a producer started by ``start_producer`` printed last, once it has produced for ``seconds``."""
    try:
        out, _ = producer.communicate(timeout=seconds + COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        producer.kill()
        producer.wait()
        raise
    if producer.returncode != 0:
        raise RuntimeError(f"{what} exited with {producer.returncode}; see {work}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def warm_up_stream(
    args: argparse.Namespace, broker: BrokerInfo, side: Side, sampler: LagSampler, work: Path
) -> dict[str, Any]:
    """A steady stream at ``--warmup-rate`` for ``--warmup-s``, then caught up, before the first measured rate.

    A side's Spark JVM meets its first few dozen jobs of the function cold: its JIT compiles for the first
    minutes of Spark work (a wave of 11 small ranges took 2.3 s of the Connect server's CPU as its first and
    0.75 s as its fortieth, most of the difference in the JVM's compiler threads), so whichever rate came
    first was judged on a cold start. A deployment that has been running for a while is the one to measure;
    both sides get the same stream. Three minutes by default: after one minute, ours still fell behind at
    100,000 events/s as the first rate and held it after three (docs/benchmarks.md)."""
    if args.warmup_s <= 0 or args.warmup_rate <= 0:
        return {}
    side.check()
    producer = start_producer(
        broker, side.topic, args.partitions, args.warmup_rate, args.warmup_s, work / "producer.log"
    )
    produced = producer_result(producer, args.warmup_s, "the warm-up producer", work)
    settle_s, caught_up = settle(sampler, side, max(args.settle_s, args.timeout))
    print(
        f"{side.name}: warm-up stream of {args.warmup_rate:g} events/s for {args.warmup_s:g} s "
        f"({produced['events_per_s']} reached), caught up after {settle_s:.1f} s: {caught_up}",
        flush=True,
    )
    return {
        "warmup_stream": {
            "events_per_s": args.warmup_rate,
            "seconds": args.warmup_s,
            "producer_events_per_s": produced["events_per_s"],
            "caught_up": caught_up,
            "settle_s": round(settle_s, 1),
        }
    }


def phase(
    args: argparse.Namespace, rate: float, broker: BrokerInfo, side: Side, sampler: LagSampler, work: Path
) -> dict[str, Any]:
    seconds = args.minutes * 60
    side.check()
    producer = start_producer(broker, side.topic, args.partitions, rate, seconds, work / "producer.log")
    assert producer.stdout is not None
    if "started" not in producer.stdout.readline():  # the window opens when the producer starts producing
        producer.wait(COMMAND_TIMEOUT_S)
        raise RuntimeError(f"the producer at {rate:g} events/s did not start (exit {producer.returncode}); see {work}")
    cpu_before, bench_cpu_before = process_cpu.cpu_by_part(side.cpu_roots), time.process_time()
    first = sampler.sample()
    t0, wall0 = time.monotonic(), time.time()
    produced = producer_result(producer, seconds, f"the producer at {rate:g} events/s", work)
    last = sampler.sample()
    t1, wall1 = time.monotonic(), time.time()
    cpu_after, bench_cpu = process_cpu.cpu_by_part(side.cpu_roots), time.process_time() - bench_cpu_before
    elapsed = t1 - t0

    samples = sampler.between(t0, t1)
    achieved = (last.high_total - first.high_total) / elapsed if first and last else produced["events_per_s"]
    lags = [float(s.lag_records) for s in samples]
    ages = [s.oldest_age_s for s in samples]
    points = [(s.t, float(s.lag_records)) for s in samples]
    least_squares, two_point = slope(second_half(points, t0, t1)), peak_growth(points, t0, t1)
    units = side.units_between(wall0, wall1)
    cpu = process_cpu.difference(cpu_after, cpu_before)
    side_cpu = sum(cpu.get(part, 0.0) for part in side.cpu_parts)
    settle_s, caught_up = settle(sampler, side, args.settle_s)
    verdict = judge_sustained(
        points,
        [(s.t, s.oldest_age_s) for s in samples],
        t0,
        t1,
        achieved,
        caught_up,
        growth_tolerance=args.growth_tolerance,
        behind_tolerance=args.behind_tolerance,
        behind_floor_s=args.sample_s,
        max_p95_behind_s=args.max_p95_behind_s,
    )
    figures: dict[str, Any] = {
        "target_events_per_s": rate,
        "achieved_events_per_s": round(achieved, 1),
        "producer_events_per_s": produced["events_per_s"],
        "producer_late_ticks": produced["late_ticks"],
        "seconds": round(elapsed, 1),
        "samples": len(samples),
        "lag_records_p50": rounded(percentile(lags, 50), 0),
        "lag_records_p95": rounded(percentile(lags, 95), 0),
        "seconds_behind_p50": rounded(percentile(ages, 50), 1),
        "seconds_behind_p95": rounded(percentile(ages, 95), 1),
        "lag_over_rate_s_p50": rounded((percentile(lags, 50) or 0.0) / achieved if achieved else None, 1),
        "lag_over_rate_s_p95": rounded((percentile(lags, 95) or 0.0) / achieved if achieved else None, 1),
        "lag_slope_records_per_s": rounded(least_squares, 1),
        "lag_peak_growth_records_per_s": rounded(verdict.peak_growth_records_per_s, 1),
        "lag_peaks": verdict.peaks,
        "lag_peak_growth_limit_records_per_s": round(verdict.growth_limit_records_per_s, 1),
        "seconds_behind_q3_mean": rounded(verdict.behind_q3_s, 1),
        "seconds_behind_q4_mean": rounded(verdict.behind_q4_s, 1),
        "seconds_behind_rise_limit_s": rounded(verdict.behind_rise_limit_s, 1),
        "sustained": verdict.sustained,
        "sustained_failed": list(verdict.failed),
        "lag_peak_growth_two_point_records_per_s": rounded(two_point, 1),
        "sustained_old_rule": old_rule_sustained(points, t0, t1, achieved),
        side.unit: units,
        f"{side.unit}_per_minute": round(units / (elapsed / 60), 2),
        "deployment_cores": round(side_cpu / elapsed, 3),
        "cores_by_part": {part: round(value / elapsed, 3) for part, value in cpu.items()},
        "producer_cores": round(produced["cpu_s"] / elapsed, 3),
        "benchmark_cores": round(bench_cpu / elapsed, 3),
        "settle_s": round(settle_s, 1),
        "caught_up": caught_up,
        "seconds_behind_highest_by_10s": [
            round(v, 1) for v in highest_by_step([(s.t, s.oldest_age_s) for s in samples], t0, 10.0)
        ],
    }
    if side.cycle_between is not None:
        figures["cycle"] = side.cycle_between(wall0, wall1)
    print(
        f"{side.name}, {rate:g} events/s: achieved {figures['achieved_events_per_s']} (producer "
        f"{produced['events_per_s']}, {produced['late_ticks']} late ticks); lag p50/p95 {figures['lag_records_p50']}/"
        f"{figures['lag_records_p95']} records, {figures['seconds_behind_p50']}/{figures['seconds_behind_p95']} s "
        f"behind (lag/rate {figures['lag_over_rate_s_p50']}/{figures['lag_over_rate_s_p95']} s); over the second "
        f"half, slope {figures['lag_slope_records_per_s']} records/s, {verdict.peaks} tops rising "
        f"{figures['lag_peak_growth_records_per_s']} records/s (limit {figures['lag_peak_growth_limit_records_per_s']};"
        f" two-point {figures['lag_peak_growth_two_point_records_per_s']}); seconds behind, mean of the 3rd/4th "
        f"quarter {figures['seconds_behind_q3_mean']}/{figures['seconds_behind_q4_mean']} (rise limit "
        f"{figures['seconds_behind_rise_limit_s']}); caught up after {figures['settle_s']} s: {caught_up}; "
        f"{'SUSTAINED' if verdict.sustained else 'not sustained: ' + ', '.join(verdict.failed)} (old rule: "
        f"{figures['sustained_old_rule']}); {figures[f'{side.unit}_per_minute']} {side.unit}/min; "
        f"{figures['deployment_cores']} cores {figures['cores_by_part']}; producer {figures['producer_cores']} cores, "
        f"benchmark {figures['benchmark_cores']}",
        flush=True,
    )
    print(
        f"{side.name}, {rate:g} events/s: seconds behind, highest of each 10 s: "
        f"{' '.join(f'{v:g}' for v in figures['seconds_behind_highest_by_10s'])}",
        flush=True,
    )
    if "cycle" in figures:
        print(f"{side.name}, {rate:g} events/s: run cycle {json.dumps(figures['cycle'])}", flush=True)
    return figures


def ladder_stop(figures: Mapping[str, Any]) -> str | None:
    """Why the ladder goes no higher after this rate, if it does not: the producer could not hold the rate
    (what it reached is the figure), or the side did not catch up within the settle time (its backlog would
    carry into the next rate, which it cannot hold either)."""
    rate, achieved = figures["target_events_per_s"], figures["achieved_events_per_s"]
    if achieved < PRODUCER_REACHED * rate:
        return f"the producer reached {achieved:g} of {rate:g} events/s"
    if not figures["caught_up"]:
        return f"not caught up within the settle time after {rate:g} events/s"
    return None


def ladder(
    args: argparse.Namespace, broker: BrokerInfo, side: Side, sampler: LagSampler, work: Path
) -> tuple[list[dict[str, Any]], str | None]:
    """The rates of ``--rates`` in order, each a ``phase``, up to the first ``ladder_stop``."""
    phases: list[dict[str, Any]] = []
    for rate in args.rates:
        figures = phase(args, rate, broker, side, sampler, work)
        phases.append(figures)
        stopped = ladder_stop(figures)
        if stopped is not None:
            print(f"{side.name}: the ladder stops: {stopped}", flush=True)
            return phases, stopped
    return phases, None


def summary(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline figures over the phases (see the module docstring)."""
    best: dict[str, Any] | None = None
    best_rate = 0.0
    for figures in phases:
        if not figures["sustained"]:
            continue
        reached = figures["achieved_events_per_s"] >= PRODUCER_REACHED * figures["target_events_per_s"]
        rate = figures["target_events_per_s"] if reached else figures["achieved_events_per_s"]
        if rate > best_rate:
            best, best_rate = figures, rate
    at_1000 = [f["deployment_cores"] for f in phases if f["target_events_per_s"] == 1000]
    at_50000 = [f["seconds_behind_p95"] for f in phases if f["target_events_per_s"] == 50_000]
    return {
        "max_sustained_events_per_s": best_rate if best is not None else None,
        "p95_seconds_behind_at_max": best["seconds_behind_p95"] if best is not None else None,
        "p95_seconds_behind_at_50000": at_50000[0] if at_50000 else None,
        "cores_at_1000": at_1000[0] if at_1000 else None,
    }


def comparison(ours: Mapping[str, Any], peer: Mapping[str, Any]) -> dict[str, Any]:
    """Ours against the peer, on the issue's three goals: at least the peer's highest sustained rate, p95
    seconds behind at 50,000 events/s within 10 s of the peer's, and no more cores at 1,000 events/s."""
    ours_max, peer_max = ours.get("max_sustained_events_per_s"), peer.get("max_sustained_events_per_s")
    ours_p95, peer_p95 = ours.get("p95_seconds_behind_at_50000"), peer.get("p95_seconds_behind_at_50000")
    ours_cores, peer_cores = ours.get("cores_at_1000"), peer.get("cores_at_1000")
    return {
        "max_sustained_ours_minus_peer": None if peer_max is None else (ours_max or 0.0) - peer_max,
        "p95_at_50000_ours_minus_peer_s": None
        if ours_p95 is None or peer_p95 is None
        else round(ours_p95 - peer_p95, 1),
        "cores_at_1000_ratio": None if not ours_cores or not peer_cores else round(ours_cores / peer_cores, 3),
    }


def our_side(
    args: argparse.Namespace, broker: BrokerInfo, work: Path, report: Callable[[dict[str, Any]], None]
) -> None:
    """Our deployment's ladder: the local Spark Connect server and the example deployment on a topic of its own,
    the warm-up drained, then the rates. ``report`` gets its figures as they are known."""
    from dagster_streamgroup.local.spark_connect import running_connect_server

    topic = f"clicks-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap, {topic: args.partitions})
    with running_connect_server() as server:
        settings = ExampleSettings(
            members=args.members,
            max_records_per_run=args.max_records_per_run,
            spark_remote=server.remote if args.spark == "connect" else None,
        )
        with running_example(broker.bootstrap, topic, work, settings, args.timeout) as example:
            bulk, trailer = producers({"bootstrap.servers": broker.bootstrap})
            produce_burst(bulk, trailer, topic, args.partitions, args.warmup_records, random.Random(0))
            del bulk, trailer
            warmup_s = example.wait_committed("the warm-up to drain", example.highs(), args.timeout)
            print(f"ours: warm-up of {args.warmup_records} records drained after {warmup_s:.1f} s", flush=True)
            report({"startup_s": round(example.startup_s, 1), "warmup_s": round(warmup_s, 1)})
            side = Side(
                name="ours",
                topic=topic,
                highs=example.highs,
                committed=example.committed,
                units_between=lambda since, until: len(example.runs_created(since, until)),
                unit="runs",
                cpu_roots={
                    "dagster_dev": example.pid,
                    "spark_connect_server": server.pid,
                    **({"broker": broker.pid} if broker.pid else {}),
                },
                cpu_parts=DEPLOYMENT_PARTS,
                cycle_between=lambda since, until: run_cycle(example.runs_created(since, until), TAG_MEMBER),
            )
            sampler = LagSampler(example.backend, example.group, example.shards, args.sample_s).start()
            try:
                report(warm_up_stream(args, broker, side, sampler, work))
                phases, stopped = ladder(args, broker, side, sampler, work)
            finally:
                sampler.stop()
            report({"lag_sample_errors": sampler.errors, "rates": phases, "ladder_stopped": stopped, **summary(phases)})


def peer_side(
    args: argparse.Namespace, broker: BrokerInfo, work: Path, report: Callable[[dict[str, Any]], None]
) -> None:
    """The peer's ladder: Spark Structured Streaming's Kafka source with the default trigger
    (``bench.peer_follow``) on a topic of its own, from its earliest offset, the warm-up drained, then the
    rates."""
    topic = f"peer-clicks-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap, {topic: args.partitions})
    backend = KafkaBackend(KafkaStreamConfig(bootstrap_servers=broker.bootstrap, topics=[topic]))
    try:
        shards = backend.shards()

        def highs() -> dict[str, int]:
            return {shard: marks.high for shard, marks in backend.watermarks(shards).items()}

        produce_clicks(broker.bootstrap, topic, args.partitions, args.warmup_records, seed=0)
        spec = PeerSpec(
            bootstrap=broker.bootstrap,
            topic=topic,
            work=str(work),
            parallelism=args.peer_parallelism,
            driver_memory=args.peer_driver_memory,
        )
        started = time.monotonic()
        with following_peer(spec) as peer:
            startup_s = time.monotonic() - started
            warmup_s = wait_committed(peer, highs(), args.timeout)
            print(f"peer: warm-up of {args.warmup_records} records drained after {warmup_s:.1f} s", flush=True)
            report({"startup_s": round(startup_s, 1), "warmup_s": round(warmup_s, 1)})
            side = Side(
                name="peer",
                topic=topic,
                highs=highs,
                committed=lambda: peer.committed(shards),
                units_between=lambda since, until: batches_committed_between(spec.checkpoint, since, until),
                unit="batches",
                cpu_roots={"peer": peer.pid, **({"broker": broker.pid} if broker.pid else {})},
                cpu_parts=("peer",),
                check=peer.check_alive,
            )
            sampler = LagSampler(backend, "", shards, args.sample_s, committed_offsets=side.committed).start()
            try:
                report(warm_up_stream(args, broker, side, sampler, work))
                phases, stopped = ladder(args, broker, side, sampler, work)
            finally:
                sampler.stop()
            report({"lag_sample_errors": sampler.errors, "rates": phases, "ladder_stopped": stopped, **summary(phases)})
    finally:
        backend.close()


SIDES = {"ours": our_side, "peer": peer_side}


def parse_sides(text: str) -> list[str]:
    sides = [part.strip() for part in text.split(",") if part.strip()]
    if not sides or any(side not in SIDES for side in sides) or len(set(sides)) != len(sides):
        raise argparse.ArgumentTypeError(f"--sides: ours and/or peer, comma-separated, got {text!r}")
    return sides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=parse_rates, default=list(LADDER), help="events/s, in order")
    parser.add_argument("--minutes", type=float, default=3.0, help="minutes of producing per rate")
    parser.add_argument("--sides", type=parse_sides, default=["ours", "peer"], help="ours, peer, or both in order")
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--spark", choices=["local", "connect"], default="connect", help="where the runs' Spark runs")
    parser.add_argument(
        "--max-records-per-run", type=int, default=None, help="CLICKSTREAM_MAX_RECORDS_PER_RUN (default: the example's)"
    )
    parser.add_argument("--peer-parallelism", type=int, default=2, help="N of the peer's local[N] session")
    parser.add_argument("--peer-driver-memory", default="2g", help="the peer's driver heap (the Connect server's)")
    parser.add_argument("--warmup-records", type=int, default=8_000, help="drained before the first rate")
    parser.add_argument("--warmup-rate", type=float, default=50_000.0, help="events/s of the warm-up stream (0: none)")
    parser.add_argument(
        "--warmup-s", type=float, default=180.0, help="seconds of the warm-up stream, caught up before the first rate"
    )
    parser.add_argument("--sample-s", type=float, default=2.0, help="seconds between lag samples")
    parser.add_argument("--settle-s", type=float, default=60.0, help="at most this long to catch up after a rate")
    parser.add_argument(
        "--growth-tolerance",
        type=float,
        default=GROWTH_TOLERANCE,
        help="growth of the lag's tops (fitted over all of them) / rate still sustained",
    )
    parser.add_argument(
        "--behind-tolerance",
        type=float,
        default=BEHIND_TOLERANCE,
        help="rise of the mean seconds behind from the 3rd to the 4th quarter / the 3rd's, still sustained",
    )
    parser.add_argument(
        "--max-p95-behind-s", type=float, default=MAX_P95_BEHIND_S, help="p95 seconds behind still sustained"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="start-up and warm-up budget in seconds")
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 60:
        parser.error("--minutes must be within (0, 60]")
    for name in ("partitions", "members", "warmup_records", "peer_parallelism"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_records_per_run is not None and args.max_records_per_run < 1:
        parser.error("--max-records-per-run must be >= 1")
    if not 0.5 <= args.sample_s <= 30 or args.settle_s < 0 or not 0 <= args.growth_tolerance < 1:
        parser.error("--sample-s must be within 0.5..30, --settle-s >= 0, --growth-tolerance within [0, 1)")
    if args.warmup_rate < 0 or not 0 <= args.warmup_s <= 600:
        parser.error("--warmup-rate must be >= 0 and --warmup-s within 0..600")
    if args.behind_tolerance < 0 or args.max_p95_behind_s <= 0:
        parser.error("--behind-tolerance must be >= 0 and --max-p95-behind-s > 0")
    per_side = len(args.rates) * (args.minutes + args.settle_s / 60) + (args.warmup_s + 3 * args.timeout) / 60
    print(
        f"{' then '.join(args.sides)}: rates {args.rates} events/s, {args.minutes:g} min each: at most "
        f"~{len(args.sides) * per_side:.0f} min",
        flush=True,
    )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    result: dict[str, Any] = {
        "partitions": args.partitions,
        "members": args.members,
        "spark": args.spark,
        "minutes_per_rate": args.minutes,
        "sides": args.sides,
    }
    by_side: dict[str, dict[str, Any]] = {side: {} for side in args.sides}
    with running_broker() as broker, tempfile.TemporaryDirectory(prefix="bench-sustained-") as tmp:
        for name in args.sides:
            SIDES[name](args, broker, Path(tmp) / name, by_side[name].update)
    if "ours" in by_side:  # our figures at the top level, where the runs-per-minute readers look for them
        result.update(by_side["ours"])
    if "peer" in by_side:
        result["peer"] = by_side["peer"]
    if "ours" in by_side and "peer" in by_side:
        result.update(comparison(by_side["ours"], by_side["peer"]))
    print("targets (printed, not asserted):", flush=True)
    lines = []
    for name, figures in by_side.items():
        lines += [
            target_line(
                f"{name} max_sustained_events_per_s", figures.get("max_sustained_events_per_s"), 50_000, at_most=False
            ),
            target_line(f"{name} p95_seconds_behind_at_max", figures.get("p95_seconds_behind_at_max"), 30),
        ]
    if "ours" in by_side:
        lines.append(target_line("ours cores_at_1000", by_side["ours"].get("cores_at_1000"), 0.5))
    if "peer" in by_side and "ours" in by_side:
        lines += [
            target_line("max_sustained_ours_minus_peer", result["max_sustained_ours_minus_peer"], 0, at_most=False),
            target_line("p95_at_50000_ours_minus_peer_s", result["p95_at_50000_ours_minus_peer_s"], 10),
            target_line("cores_at_1000_ratio (ours / peer)", result["cores_at_1000_ratio"], 1.0),
        ]
    for line in lines:
        print(f"  {line}", flush=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
