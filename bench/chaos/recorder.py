"""What the chaos deployment's user function writes about itself, so the check never trusts the group state.

Every run writes one record per range it read, before it returns (and before it raises on poison): the run,
its member and run key, its process id, the offsets it saw, as ``[first, last + 1)`` intervals, and the CRC-32
of each of those records' payloads. The hashes are what tell a record apart from another one at the same
offset: a broker that lost acknowledged records and took new ones at their offsets shows the same offsets, not
the same payloads. A record is written to a temporary name and renamed, so a run killed while writing leaves no
half record.

Two files in the work directory steer the function from outside:

- ``poison-switch``: while it exists, a range holding a record whose value carries ``POISON_MARKER`` raises
  (after its record is written), so the group retries it, then parks or dead-letters it;
- ``hold``: while it exists, a run that has written its records announces itself in ``held/<run id>.json``
  (process id, run key, ranges) and waits until that file is removed, or ``hold`` is, so the driver can SIGKILL
  it between its read and its commit, or let it commit while the broker is paused and SIGKILL it between its
  commit and its materialization.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

POISON_MARKER = "CHAOS-POISON"
POISON_SWITCH = "poison-switch"
HOLD = "hold"
HELD = "held"
RECORDS = "records"
HOLD_LIMIT_S = 120.0
"""A held run goes on by itself after this long, so a driver that died never leaves runs waiting forever."""


class RangeRecord(BaseModel):
    """One range as the function saw it."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    run_key: str | None
    member: str | None
    pid: int
    shard: str
    start: int
    end: int
    intervals: tuple[tuple[int, int], ...]
    """The offsets seen, as sorted, disjoint ``[first, end)`` intervals."""
    seen: int
    """Records seen (duplicates within the read included: a source that repeats a record shows here)."""
    hashes: tuple[int, ...]
    """The payload's CRC-32 (``payload_hash``) of each offset of ``intervals``, in offset order."""
    poison: int
    raised: bool
    backfill: bool
    at: float


class HeldRun(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_id: str
    run_key: str | None
    pid: int
    ranges: tuple[tuple[str, int, int], ...]
    member: str | None = None
    """The member that launched the run: the zombie fault stops that member's sensor."""


def payload_hash(payload: bytes) -> int:
    """CRC-32 of a record's payload, as Spark's ``crc32`` computes it over the ``value`` column, so the function
    (in Spark) and the producer (in Python) hash the same bytes the same way."""
    return zlib.crc32(payload)


def offsets_of(spans: Iterable[tuple[int, int]]) -> Iterator[int]:
    """Every offset of ``[first, end)`` spans, in order."""
    for first, end in spans:
        yield from range(first, end)


def intervals(offsets: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sorted disjoint ``[first, end)`` intervals covering exactly ``offsets`` (repeats collapse)."""
    out: list[tuple[int, int]] = []
    for offset in sorted(set(offsets)):
        if out and out[-1][1] == offset:
            out[-1] = (out[-1][0], offset + 1)
        else:
            out.append((offset, offset + 1))
    return tuple(out)


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def record_path(work: Path, record: RangeRecord) -> Path:
    shard = record.shard.replace(":", "_").replace("/", "_")
    return work / RECORDS / f"{record.run_id}.{shard}.{record.start}-{record.end}.json"


def write_records(work: Path, records: Sequence[RangeRecord]) -> None:
    for record in records:
        write_atomically(record_path(work, record), record.model_dump_json())


def read_records(work: Path) -> list[RangeRecord]:
    folder = work / RECORDS
    if not folder.is_dir():
        return []
    return [RangeRecord.model_validate_json(p.read_text()) for p in sorted(folder.glob("*.json"))]


def poisoned(work: Path) -> bool:
    return (work / POISON_SWITCH).exists()


def hold_if_asked(work: Path, held: HeldRun, limit_s: float = HOLD_LIMIT_S) -> bool:
    """Wait while the driver holds runs; whether this run was held."""
    if not (work / HOLD).exists():
        return False
    marker = work / HELD / f"{held.run_id}.json"
    write_atomically(marker, held.model_dump_json())
    deadline = time.monotonic() + limit_s
    while marker.exists() and (work / HOLD).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    marker.unlink(missing_ok=True)
    return True


def held_runs(work: Path) -> list[HeldRun]:
    folder = work / HELD
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            out.append(HeldRun.model_validate_json(path.read_text()))
        except (OSError, ValueError):
            continue  # released meanwhile
    return out


def release(work: Path, run_id: str) -> None:
    (work / HELD / f"{run_id}.json").unlink(missing_ok=True)


def dump_json(value: object) -> str:
    return json.dumps(value, sort_keys=True)
