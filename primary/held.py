"""A consumer's unconfirmed messages, by seq, in push order: a run's rows
held as one span (its seqs, and a bitmap of those still held), not a dict
entry a row.

A consumer of a queue in its usual state takes a committed frame's rows as
one `MessageRun` and confirms them as seq ranges. Held as a dict of seq ->
(run, row), each row cost a tuple and a dict entry going in and a pop coming
out, 0.35-0.45 us a row each way. A span costs the same whatever its rows:
its seqs are the run's (a range when consecutive, else a sorted array), the
rows still held a bitmap made at the first confirm, and a range of seqs is
confirmed by slicing it.

Messages held one at a time (a StoredMessage, or a row (run, row) of a frame
spanning queues) stay dict entries, as before. The spans' seq intervals
never overlap (a run that would overlap one goes in row by row, as does one
whose seqs do not ascend), so the one that may hold a seq is found by
bisecting their first seqs.

Not thread safe: the caller holds the partition lock.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np

if TYPE_CHECKING:
    from primary.dispatcher import Held, MessageRun

SPAN_MIN_ROWS = 2


class _Span:
    """Rows of one run pushed together: row i has seq `run.seqs[i]`."""

    __slots__ = ("run", "first", "last", "seqs", "alive", "live")

    def __init__(self, run: "MessageRun", consecutive: bool):
        """`run`'s seqs ascend; `consecutive`: each is the one before plus one."""
        seqs = run.seqs
        self.run = run
        self.first, self.last = seqs[0], seqs[-1]
        # Consecutive seqs (a frame's rows of one queue): row = seq - first.
        self.seqs: np.ndarray | None = None if consecutive else np.asarray(seqs, np.int64)
        self.alive: np.ndarray | None = None   # None: every row still held
        self.live = len(seqs)

    def rows(self, lo: int, hi: int) -> tuple[int, int]:
        """Rows [a, b) whose seqs are within [lo, hi]."""
        if self.seqs is None:
            return max(lo, self.first) - self.first, min(hi, self.last) - self.first + 1
        return int(np.searchsorted(self.seqs, lo, "left")), int(np.searchsorted(self.seqs, hi, "right"))

    def row_of(self, seq: int) -> int:
        """The live row of `seq`, or -1."""
        if not self.first <= seq <= self.last:
            return -1
        if self.seqs is None:
            row = seq - self.first
        else:
            row = int(np.searchsorted(self.seqs, seq))
            if self.seqs[row] != seq:
                return -1
        return row if self.alive is None or self.alive[row] else -1

    def live_rows(self) -> Iterable[int]:
        return range(len(self.run.seqs)) if self.alive is None else np.flatnonzero(self.alive).tolist()

    def seq_of(self, row: int) -> int:
        return self.first + row if self.seqs is None else int(self.seqs[row])

    def kill(self, a: int, b: int) -> np.ndarray | None:
        """Rows [a, b) no longer held; returns those that were (None: all of them)."""
        if self.alive is None:
            self.alive = np.ones(len(self.run.seqs), np.bool_)
            self.alive[a:b] = False
            self.live -= b - a
            return None
        was = np.flatnonzero(self.alive[a:b])
        self.alive[a:b] = False
        self.live -= len(was)
        return None if len(was) == b - a else was + a


class HeldRows:
    """seq -> Held in push order (the mapping `_Consumer.unconfirmed` was):
    `len`, `in`, iteration over seqs, `items`, `values`, `pop`, `get`,
    setting a single message, `update`, `clear`; and `add_run` and
    `take_range` for a run's rows at once."""

    __slots__ = ("_entries", "_firsts", "_spans", "_singles", "_live")

    def __init__(self) -> None:
        # In push order: seq -> a single Held, and each span -> itself.
        self._entries: dict[Any, Any] = {}
        self._firsts: list[int] = []        # the spans' first seqs, sorted,
        self._spans: list[_Span] = []       # and the spans in that order
        self._singles = 0
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def __bool__(self) -> bool:
        return self._live > 0

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, int) and self.get(seq) is not None

    def __iter__(self) -> Iterator[int]:
        return (seq for seq, _ in self.items())

    def __repr__(self) -> str:
        return f"HeldRows({self._live} rows, {len(self._spans)} spans)"

    def items(self) -> Iterator[tuple[int, "Held"]]:
        for key, entry in list(self._entries.items()):
            if key is entry:   # a span
                run = entry.run
                for row in entry.live_rows():
                    yield entry.seq_of(row), (run, row)
            else:
                yield key, entry

    def values(self) -> Iterator["Held"]:
        return (held for _, held in self.items())

    def clear(self) -> None:
        self._entries.clear()
        self._firsts.clear()
        self._spans.clear()
        self._singles = self._live = 0

    # -- one at a time ----------------------------------------------------------
    def __setitem__(self, seq: int, held: "Held") -> None:
        """Hold one message in `seq`'s place: a seq held as a single keeps its
        place, as in a dict; one held as a row of a span is taken out of it
        and goes last."""
        entries = self._entries
        if seq not in entries:
            if self._spans and self.get(seq) is not None:   # (no span to look in: a dict's cost)
                self.pop(seq)
            self._singles += 1
            self._live += 1
        entries[seq] = held

    def update(self, entries: Iterable[tuple[int, "Held"]]) -> None:
        for seq, held in entries:
            self[seq] = held

    def get(self, seq: int) -> "Held | None":
        entry: Held | None = self._entries.get(seq)
        if entry is not None:
            return entry
        span = self._span_at(seq)
        if span is None:
            return None
        row = span.row_of(seq)
        return None if row < 0 else (span.run, row)

    def pop(self, seq: int, default: "Held | None" = None) -> "Held | None":
        entry: Held | None = self._entries.pop(seq, None)   # (a span's key is the span, never a seq)
        if entry is not None:
            self._singles -= 1
            self._live -= 1
            return entry
        span = self._span_at(seq)
        if span is None:
            return default
        row = span.row_of(seq)
        if row < 0:
            return default
        span.kill(row, row + 1)
        self._live -= 1
        if not span.live:
            self._drop(span)
        return span.run, row

    # -- runs -------------------------------------------------------------------
    def add_run(self, run: "MessageRun") -> None:
        """Hold every row of `run` (none held yet), as one span unless its
        seq interval would overlap another span's, or its seqs do not
        ascend (a span is searched by seq; runs' seqs ascend, as committed)."""
        seqs = run.seqs
        n = len(seqs)
        if n >= SPAN_MIN_ROWS:
            first, last = seqs[0], seqs[-1]
            # (Both ends alone do not say the seqs between them ascend.)
            consecutive = last - first == n - 1 and seqs == list(range(first, last + 1))
            if consecutive or all(a < b for a, b in zip(seqs, seqs[1:])):
                firsts = self._firsts
                at = bisect.bisect_right(firsts, first)
                if not ((at and self._spans[at - 1].last >= first) or (at < len(firsts) and firsts[at] <= last)):
                    span = _Span(run, consecutive)
                    firsts.insert(at, first)
                    self._spans.insert(at, span)
                    self._entries[span] = span
                    self._live += n
                    return
        self.update(zip(seqs, ((run, i) for i in range(n))))

    def take_range(self, first: int, count: int) -> tuple[list[bytes], list[int], int]:
        """Stop holding seqs `first` .. `first + count - 1` (those held):
        their GUIDs and seqs, ascending, and their bytes."""
        last = first + count - 1
        guids: list[bytes] = []
        seqs: list[int] = []
        size = 0
        firsts = self._firsts
        if firsts:
            at = max(bisect.bisect_right(firsts, first) - 1, 0)
            emptied: list[_Span] = []
            spans = self._spans
            while at < len(firsts) and firsts[at] <= last:
                span = spans[at]
                at += 1
                if span.last < first:
                    continue
                a, b = span.rows(first, last)
                if a >= b:
                    continue
                run = span.run
                was = span.kill(a, b)
                if was is None:
                    guids += run.guids[a:b]
                    seqs += range(span.first + a, span.first + b) if span.seqs is None else span.seqs[a:b].tolist()
                    size += sum(run.sizes[a:b])
                    self._live -= b - a
                elif len(was):
                    rows = was.tolist()
                    guids += [run.guids[i] for i in rows]
                    seqs += (was + span.first).tolist() if span.seqs is None else span.seqs[was].tolist()
                    size += sum([run.sizes[i] for i in rows])
                    self._live -= len(rows)
                if not span.live:
                    emptied.append(span)
            for span in emptied:
                self._drop(span)
        if self._singles:
            from_spans = len(seqs)
            entries = self._entries
            if count <= 2 * self._singles:
                wanted: Iterable[int] = range(first, last + 1)
            else:
                wanted = sorted(seq for seq in entries if not isinstance(seq, _Span) and first <= seq <= last)
            for seq in wanted:
                entry = entries.pop(seq, None)
                if entry is None:
                    continue
                self._singles -= 1
                self._live -= 1
                if isinstance(entry, tuple):
                    run, i = entry
                    guids.append(run.guids[i])
                    size += run.sizes[i]
                else:
                    guids.append(entry.guid)
                    size += len(entry.payload)
                seqs.append(seq)
            if from_spans and len(seqs) > from_spans:   # both: back into seq order
                order = sorted(range(len(seqs)), key=seqs.__getitem__)
                guids = [guids[i] for i in order]
                seqs = [seqs[i] for i in order]
        return guids, seqs, size

    def _span_at(self, seq: int) -> _Span | None:
        """The span whose seq interval holds `seq`, if any."""
        firsts = self._firsts
        at = bisect.bisect_right(firsts, seq) - 1
        if at < 0:
            return None
        span = self._spans[at]
        return span if seq <= span.last else None

    def _drop(self, span: _Span) -> None:
        del self._entries[span]
        at = bisect.bisect_left(self._firsts, span.first)
        del self._firsts[at], self._spans[at]
