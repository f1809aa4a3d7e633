"""What a backfill of one shard re-processes, and in which waves: pure, so the CLI's preview and the backfill run's
own plan are the same function of the same facts.

A sink that keeps each range's output apart (the example's ``range=<shard>-<start>-<end>`` folders, replaced by
Spark's dynamic partition overwrite) is replaced only by a run over the *same* range: a backfill over other bounds
writes its output beside the group's, and every record counts twice. So an aligned backfill re-processes the
ranges the group committed, with their bounds (a range that the request cuts is taken whole), and cuts only what no
committed range covers (ranges skipped as dead letters, or committed before their bounds were recorded) into
pieces. It never reaches past the group's committed offset: the group processes those offsets itself, later, under
its own bounds, and the backfill's output of them would be doubled. A sink that replaces rows by their source
coordinates (``replaces_by_coordinates``) needs neither rule: any bounds replace exactly their records, and the
group's later run replaces a backfill's rows past its offset.

A backfill run reads many consecutive ranges of a shard in one Spark read (a *wave*, at most ``budget`` records,
as a member's run is), and the stream function still sees each range (``ranges_of``), so it writes each into its
own output: a day's 2,900 ranges are a few waves of one run, not 2,900 runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class BackfillRefusedError(ValueError):
    """A backfill that must not run as asked; the message says why and what would run."""


@dataclass(frozen=True)
class Wave:
    """One Spark read of ``[start, end)`` of the shard, re-processing ``ranges`` (which tile it)."""

    start: int
    end: int
    ranges: tuple[tuple[int, int], ...]

    @property
    def records(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class BackfillPlan:
    shard: str
    requested: tuple[int, int]
    waves: tuple[Wave, ...]
    aligned: bool
    clipped_at: int | None = None
    """The group's committed offset, when the request reached past it and was cut there."""
    gaps: tuple[tuple[int, int], ...] = ()
    """Offsets (of an aligned plan) no recorded committed range covers, cut in pieces."""
    skipped: tuple[tuple[int, int], ...] = ()
    """Recorded ranges left out because they overlap others (recorded before offsets were moved back)."""

    @property
    def start(self) -> int:
        return self.waves[0].start

    @property
    def end(self) -> int:
        return self.waves[-1].end

    @property
    def records(self) -> int:
        return self.end - self.start

    @property
    def ranges(self) -> list[tuple[int, int]]:
        return [r for wave in self.waves for r in wave.ranges]

    @property
    def widened(self) -> bool:
        lo, hi = self.requested
        return self.start < lo or self.end > (hi if self.clipped_at is None else min(hi, self.clipped_at))

    def notes(self) -> list[str]:
        """What the plan changed of the request, in words an operator reads before launching."""
        lo, hi = self.requested
        notes = []
        if self.clipped_at is not None:
            notes.append(
                f"{self.shard}: [{lo}, {hi}) reaches past the group's committed offset {self.clipped_at}: the backfill "
                f"stops there (the group processes [{self.clipped_at}, {hi}) itself, and re-processing it now would "
                "write its records twice)"
            )
        if self.widened:
            notes.append(
                f"{self.shard}: the request cuts a committed range: the backfill covers [{self.start}, {self.end}), "
                "whole ranges, so each range's output is replaced"
            )
        if self.gaps:
            shown = ", ".join(f"[{a}, {b})" for a, b in self.gaps[:5]) + (" ..." if len(self.gaps) > 5 else "")
            notes.append(
                f"{self.shard}: no committed range is recorded over {shown} (dead-lettered ranges, or ranges committed "
                "before their bounds were recorded): cut in pieces; a range-keyed output of them lands beside any "
                "earlier output"
            )
        if self.skipped:
            notes.append(
                f"{self.shard}: {len(self.skipped)} recorded range(s) overlap others and are left out, first "
                f"[{self.skipped[0][0]}, {self.skipped[0][1]})"
            )
        return notes


def plan_backfill(
    shard: str,
    start: int,
    end: int,
    *,
    committed: int | None,
    low: int,
    high: int,
    recorded: Iterable[tuple[int, int]],
    budget: int,
    chunk: int,
    align: bool = True,
    ahead: bool = False,
) -> BackfillPlan:
    """The waves re-processing ``[start, end)`` of ``shard``.

    ``committed``: the group's committed offset of the shard (None: never positioned); ``low``/``high``: the shard's
    watermarks; ``recorded``: the committed ranges recorded over the request (any superset, in any order); ``budget``:
    records a wave reads at most (a committed range longer than that is one wave of its own); ``chunk``: the pieces
    offsets no recorded range covers are cut in (all of them, ``align=False``). ``ahead``: a sink that replaces by
    coordinates may re-process past the group's offset."""
    if start < 0 or end <= start:
        raise BackfillRefusedError(f"need 0 <= from < to, got [{start}, {end})")
    if budget < 1 or chunk < 1:
        raise BackfillRefusedError(f"the wave budget ({budget}) and the piece size ({chunk}) must be >= 1")
    if end > high:
        raise BackfillRefusedError(
            f"the range ends at offset {end}, past the end of {shard} (high watermark {high}); end at {high} at most"
        )
    requested, clipped_at = (start, end), None
    if not ahead:
        if committed is None:
            raise BackfillRefusedError(
                f"the group has committed nothing of {shard} yet: it processes [{start}, {end}) itself (a backfill "
                "re-processes what the group committed)"
            )
        if start >= committed:
            raise BackfillRefusedError(
                f"[{start}, {end}) of {shard} is not committed yet (the group's committed offset is {committed}): the "
                "group processes it itself, and a backfill of it now would write its records twice"
            )
        if end > committed:
            clipped_at, end = committed, committed
    skipped: list[tuple[int, int]] = []
    gaps: list[tuple[int, int]] = []
    pieces: list[tuple[int, int]] = []
    if align:
        chosen: list[tuple[int, int]] = []
        for lo, hi in sorted(set(recorded)):
            if hi <= lo or hi <= start or lo >= end:
                continue
            if chosen and lo < chosen[-1][1]:
                skipped.append((lo, hi))
                continue
            if not ahead and committed is not None and hi > committed:
                skipped.append((lo, hi))  # recorded before the offsets moved back: not what the group committed
                continue
            chosen.append((lo, hi))
        position = min(start, chosen[0][0]) if chosen else start
        for lo, hi in chosen:
            if lo > position:
                gaps.append((position, lo))
                pieces += _cut(position, lo, chunk)
            pieces.append((lo, hi))
            position = hi
        if position < end:
            gaps.append((position, end))
            pieces += _cut(position, end, chunk)
    else:
        pieces = _cut(start, end, chunk)
    if pieces[0][0] < low:
        first = pieces[0]
        why = f" (where the committed range [{first[0]}, {first[1]}) starts)" if first[0] < start else ""
        raise BackfillRefusedError(
            f"offset {first[0]} of {shard}{why} is out of retention (the earliest offset is {low}): start at "
            f"{_first_whole(pieces, low)} at the earliest"
        )
    return BackfillPlan(
        shard=shard,
        requested=requested,
        waves=_waves(pieces, budget),
        aligned=align,
        clipped_at=clipped_at,
        gaps=tuple(gaps),
        skipped=tuple(skipped),
    )


def _cut(start: int, end: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(s + chunk, end)) for s in range(start, end, chunk)]


def _first_whole(pieces: list[tuple[int, int]], low: int) -> int:
    """The first piece boundary at or after ``low``: where an aligned backfill may start within retention."""
    return next((lo for lo, _ in pieces if lo >= low), pieces[-1][1])


def _waves(pieces: list[tuple[int, int]], budget: int) -> tuple[Wave, ...]:
    """Consecutive pieces packed into reads of at most ``budget`` records (a longer piece is a read of its own)."""
    waves: list[Wave] = []
    current: list[tuple[int, int]] = []
    for piece in pieces:
        if current and piece[1] - current[0][0] > budget:
            waves.append(Wave(current[0][0], current[-1][1], tuple(current)))
            current = []
        current.append(piece)
    if current:
        waves.append(Wave(current[0][0], current[-1][1], tuple(current)))
    return tuple(waves)
