"""The express lane's decisions and their reconciliation with the pipeline: no I/O.

Right after a PUT group is committed the primary decides, for each row, what
the pipeline will decide a few seconds later, and pushes at once:

- `GuidHistory`: is the GUID a duplicate? BlazingMQ's rule, as the pipeline's
  `dropDuplicatesWithinWatermark` applies it: a GUID committed again within the
  history window of its first commit is a duplicate (ACKed, never pushed). One
  history per partition, like the pipeline's query, with the partition's
  longest domain window (`ClusterConfig.history_window_ms`). Time is the
  primary's commit time (`put_time`), the pipeline's event time.
- `target_apps`: which apps get it: the domain's apps whose application
  subscription matches (all of them without one), the same expression the
  pipeline renders as Spark SQL (`protocol/expression.py`, which holds both
  back ends to one semantics).

Spark stays the authority. `Reconciler` keeps each express decision until the
pipeline's delivery log has judged that row, then compares:

- a delivery row with apps the express lane did not push to (it judged the
  GUID a duplicate with a history rebuilt short, or a domain change reached
  the pipeline first) is pushed to those apps then ("late");
- an express push the pipeline does not keep (no delivery row once the
  pipeline has judged past that seq: it dropped a duplicate; or fewer apps) is
  a disagreement;
- every difference is a `Disagreement`, with both decisions, which the primary
  logs and writes to the partition's disagreements table.

Rows of `delivery = "pipeline"` domains get no express decision: they are
pushed when their delivery row arrives, as before the express lane.

Bounds: the history holds the GUIDs of one window; the reconciler holds at
most `decisions_max` decisions. Past that (a pipeline stopped for long), the
oldest are forgotten: their rows are taken as pushed when they arrive, and
counted (`forgotten`), so memory stays flat however far the pipeline lags.

Not thread safe: the partition serialises access (`Partition._decisions_lock`).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol.columns import fixed_width_binary, joined_values
from protocol.expression import Expression, compile_expression
from protocol.limits import GUID_LENGTH

DECISIONS_MAX = 2_000_000
KIND_DEDUP = "dedup"      # one side judged the GUID a duplicate, the other did not
KIND_APPS = "apps"        # both kept it, for different apps


HISTORY_SHARDS = 1024   # GuidHistory's dicts, by the GUID's hash


class GuidHistory:
    """GUIDs first committed within the last `window_us` microseconds.

    Each commit's new GUIDs are kept for expiry as one bytes object (16
    bytes each), not a list: at 20k msg/s a 300 s window holds 6M GUIDs, and
    lists of them made every full collection of Python's garbage collector
    traverse them all (75 ms, every thread stopped, growing with the window).

    The GUIDs are spread over `HISTORY_SHARDS` dicts by hash. One dict of 6M
    entries rehashes all of them when it grows, holding the GIL: 231 ms alone
    at 5.6M entries (119 ms at 2.8M), and a whole-node stall of 1.3-1.6 s
    when it came 280 s into a run at 20k msg/s (the lease renewal logged it
    late). A shard grows in steps a thousand times smaller."""

    def __init__(self, window_us: int):
        assert window_us > 0
        self.window_us = window_us
        self._shards: list[dict[bytes, int]] = [{} for _ in range(HISTORY_SHARDS)]   # guid -> first commit time
        self._commits: deque[tuple[int, bytes]] = deque()  # (time, GUIDs first seen then, joined), in time order
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __contains__(self, guid: bytes) -> bool:
        return guid in self._shards[hash(guid) % HISTORY_SHARDS]

    def commit(self, guids: Iterable[bytes], now_us: int) -> list[bool]:
        """Record one commit's GUIDs (in seq order); return, per row, whether it
        is a duplicate: first committed within the window, earlier or in this
        same commit."""
        self.expire(now_us)
        shards = self._shards
        fresh: list[bytes] = []
        duplicates = []
        for guid in guids:
            shard = shards[hash(guid) % HISTORY_SHARDS]
            if guid in shard:
                duplicates.append(True)
            else:
                shard[guid] = now_us
                fresh.append(guid)
                duplicates.append(False)
        if fresh:
            self._size += len(fresh)
            self._commits.append((now_us, _guid_blob(fresh)))
        return duplicates

    def load(self, first_times: Iterable[tuple[bytes, int]]) -> None:
        """Rebuild from the PUT log after a takeover: (guid, first put time) in time order."""
        at: int | None = None
        fresh: list[bytes] = []
        for guid, at_us in first_times:
            shard = self._shards[hash(guid) % HISTORY_SHARDS]
            if guid in shard:
                continue
            shard[guid] = at_us
            self._size += 1
            if at_us != at and fresh:
                self._commits.append((cast(int, at), _guid_blob(fresh)))
                fresh = []
            at = at_us
            fresh.append(guid)
        if fresh:
            self._commits.append((cast(int, at), _guid_blob(fresh)))

    def expire(self, now_us: int) -> None:
        horizon = now_us - self.window_us
        commits, shards = self._commits, self._shards
        while commits and commits[0][0] < horizon:
            joined = commits.popleft()[1]
            for i in range(0, len(joined), GUID_LENGTH):
                guid = joined[i:i + GUID_LENGTH]
                del shards[hash(guid) % HISTORY_SHARDS][guid]
            self._size -= len(joined) // GUID_LENGTH


def _guid_blob(guids: list[bytes]) -> bytes:
    joined = b"".join(guids)
    if len(joined) != GUID_LENGTH * len(guids):   # checked at the door; a wrong one would misalign the rest
        raise ValueError("a GUID of the wrong length reached the GUID history")
    return joined


class AppRules:
    """A domain's application subscriptions, compiled once per domain config."""

    def __init__(self, apps: Sequence[str], subscriptions: Mapping[str, str]):
        self.apps = tuple(apps)
        self._rules: list[tuple[str, Expression | None]] = [
            (app, compile_expression(subscriptions[app]) if app in subscriptions else None) for app in apps]
        self.filtered = any(rule is not None for _, rule in self._rules)

    def target_apps(self, properties: Callable[[], Mapping[str, object]]) -> tuple[str, ...]:
        """The apps a message goes to. `properties()` gives its typed
        properties; called only when some app has a subscription."""
        if not self.filtered:
            return self.apps
        props = properties()
        return tuple(app for app, rule in self._rules if rule is None or rule.matches(props))


@dataclass(frozen=True)
class Disagreement:
    key: Any                               # the caller's queue handle (the partition's QueueState)
    guid: bytes
    seq: int
    express_apps: tuple[str, ...] | None   # None: judged a duplicate
    pipeline_apps: tuple[str, ...] | None  # None: no delivery row (a duplicate)
    late_apps: tuple[str, ...]             # pushed when the delivery row came

    @property
    def kind(self) -> str:
        return KIND_DEDUP if (self.express_apps is None) != (self.pipeline_apps is None) else KIND_APPS

    def describe(self) -> str:
        def side(apps: tuple[str, ...] | None) -> str:
            if apps is None:
                return "duplicate"
            return "apps [" + ", ".join(repr(a) for a in apps) + "]"
        late = f"; pushed late to {list(self.late_apps)}" if self.late_apps else ""
        return f"seq {self.seq} guid {self.guid.hex()}: express {side(self.express_apps)}, " \
               f"pipeline {side(self.pipeline_apps)}{late}"


@dataclass(frozen=True)
class Delivered:
    """What to do with one delivery row: push it to `push_apps` (all its apps
    when the express lane never decided it; the missing ones when it did)."""
    seq: int
    push_apps: tuple[str, ...]
    disagreement: Disagreement | None


class _Run:
    """The express decisions for consecutive seqs of one queue, `first` to
    `end - 1`: either one set of apps for the whole run (`rows` None; a
    columnar frame, where only duplicates, `dups`, differ) or one entry per
    row (`rows`). `open[i]` is 1 while row i waits for its delivery row; rows
    before `start` have left the reconciler (judged, or forgotten)."""

    __slots__ = ("first", "end", "key", "guids", "apps", "joined", "dups", "rows", "open", "start")

    def __init__(self, first: int, key: Any, guids: Any, apps: tuple[str, ...] | None,
                 dups: np.ndarray | None, rows: list[tuple[str, ...] | None] | None):
        self.first, self.end, self.key = first, first + len(guids), key
        self.guids = guids                   # list[bytes] or an Arrow binary array, read only on a disagreement
        self.apps, self.dups, self.rows = apps, dups, rows
        self.joined = _joined(apps) if apps is not None else None
        self.open = bytearray(b"\x01") * len(guids)
        self.start = 0

    def decision(self, i: int) -> tuple[str, ...] | None:
        if self.rows is not None:
            return self.rows[i]
        return None if self.dups is not None and self.dups[i] else self.apps

    def guid(self, i: int) -> bytes:
        guid = self.guids[i]
        return guid if isinstance(guid, bytes) else guid.as_py()

    def open_rows(self, a: int, b: int) -> np.ndarray:
        """Indexes in [a, b) still waiting for their delivery row."""
        return a + np.flatnonzero(np.frombuffer(self.open, np.bool_)[a:b])


def _joined(apps: Sequence[str]) -> str:
    """Apps as one string (app ids never hold a NUL), to compare a delivery
    log's `apps` column with one decision in one Arrow kernel."""
    return "\0".join(apps)


class Reconciler:
    """The express decisions, held as runs of consecutive seqs (a columnar
    frame is one run and one set of apps), and reconciled against the
    delivery log's rows a batch at a time: rows that agree with their run are
    checked in a few vectorised operations per run; only the rest (a
    disagreement, a row never decided here) take the per-row path."""

    def __init__(self, decisions_max: int = DECISIONS_MAX):
        self.decisions_max = decisions_max
        self._runs: list[_Run] = []          # ascending seqs
        self._rows = 0                       # rows from each run's start to its end (judged rows leave)
        self._held = 0                       # of those, decisions still waiting for their delivery row
        self.forgotten_through = -1          # decisions up to this seq were dropped for the bound
        self.forgotten = 0
        self.agreed = 0
        self.disagreed = 0

    def __len__(self) -> int:
        return self._held

    # -- the express lane's decisions ------------------------------------------
    def decided(self, seq: int, key: Any, guid: bytes, apps: tuple[str, ...] | None) -> None:
        """The express lane's decision for one committed row: the apps it
        pushed to, or None for a duplicate. Rows come in ascending seq; a row
        that follows the last one, for the same queue, joins its run."""
        last = self._runs[-1] if self._runs else None
        if last is not None and last.rows is not None and last.key is key and last.end == seq:
            last.rows.append(apps)
            last.guids.append(guid)
            last.open.append(1)
            last.end += 1
            self._added(1)
        else:
            self._add(_Run(seq, key, [guid], None, None, [apps]))

    def decided_run(self, first_seq: int, key: Any, guids: Any, apps: tuple[str, ...],
                    duplicates: Sequence[bool] | np.ndarray | None = None) -> None:
        """One decision for a run of rows (a columnar frame to a queue whose
        apps have no subscriptions): every row went to `apps`, except those
        `duplicates` marks, which went nowhere. `guids` is indexable (a list,
        or an Arrow array)."""
        if not len(guids):
            return
        if isinstance(guids, (pa.Array, pa.ChunkedArray)):
            # GUIDs in buffers of their own: a column of a decoded frame shares
            # the frame's body, and would keep every payload of it alive for
            # as long as the decision waits (the pipeline's lag: 13 s and
            # 1.7 GB of node memory in 20 s of priority-1q-batch).
            guids = fixed_width_binary(joined_values(guids), GUID_LENGTH)
        dups = None
        if duplicates is not None:
            mask = np.asarray(duplicates, dtype=np.bool_)
            if mask.any():
                dups = mask
        self._add(_Run(first_seq, key, guids, tuple(apps), dups, None))

    def _add(self, run: _Run) -> None:
        self._runs.append(run)
        self._added(run.end - run.first)

    def _added(self, count: int) -> None:
        self._rows += count
        self._held += count
        excess = self._rows - self.decisions_max
        while excess > 0:   # forget the oldest decisions: their rows are taken as pushed when they come
            run = self._runs[0]
            a = run.start
            b = min(run.end - run.first, a + excess)
            held = run.open_rows(a, b)
            if len(held):
                self.forgotten += len(held)
                self._held -= len(held)
                self.forgotten_through = max(self.forgotten_through, run.first + int(held[-1]))
            self._leave(run, b)
            excess -= b - a

    def _leave(self, run: _Run, stop: int) -> None:
        """Rows of `run` before `stop` leave the reconciler."""
        self._rows -= stop - run.start
        run.start = stop
        if run.start == run.end - run.first:
            self._runs.pop(0)

    def _find(self, seq: int) -> tuple[_Run, int] | None:
        """The run holding a decision still waiting for `seq`'s delivery row."""
        runs = self._runs
        n = bisect.bisect_right(runs, seq, key=lambda r: r.first) - 1
        if n < 0:
            return None
        run = runs[n]
        i = seq - run.first
        if i < run.start or seq >= run.end or not run.open[i]:
            return None
        return run, i

    # -- the pipeline's delivery rows -----------------------------------------
    def delivered(self, seq: int, apps: Sequence[str], express_domain: bool) -> Delivered | None:
        """A delivery row: the pipeline kept `seq` for `apps`. None when there
        is nothing to do (the common case: the express lane decided the same)."""
        found = self._find(seq)
        if found is None:
            if express_domain and seq <= self.forgotten_through:
                return None   # decided, then forgotten: taken as pushed
            return Delivered(seq, tuple(apps), None)  # never decided here: the pipeline's call
        run, i = found
        run.open[i] = 0
        self._held -= 1
        pushed = run.decision(i)
        if pushed is not None and len(pushed) == len(apps) and (
                all(a == b for a, b in zip(pushed, apps)) or set(pushed) == set(apps)):
            self.agreed += 1
            return None
        kept = tuple(apps)
        late = tuple(a for a in kept if pushed is None or a not in pushed)
        self.disagreed += 1
        return Delivered(seq, late, Disagreement(run.key, run.guid(i), seq, pushed, kept, late))

    def delivered_rows(self, seqs: np.ndarray, apps: pa.Array, express: np.ndarray) -> list[tuple[int, Delivered]]:
        """A batch of delivery rows at once: `seqs` ascending, `apps` (a
        list<string> array without nulls) and whether each row's domain is
        express. Returns (row index, what to do) for the rows that need
        something, in seq order; the same outcome as `delivered` row by row."""
        count = len(seqs)
        if not count:
            return []
        slow: list[np.ndarray] = []
        covered = np.zeros(count, np.bool_)
        if self._runs and not (count > 1 and (np.diff(seqs) <= 0).any()):
            joined = pc.binary_join(apps, "\0")
            lo_seq, hi_seq = int(seqs[0]), int(seqs[-1])
            first = max(0, bisect.bisect_right(self._runs, lo_seq, key=lambda r: r.first) - 1)
            for run in self._runs[first:]:
                if run.first > hi_seq:
                    break
                lo = int(np.searchsorted(seqs, run.first + run.start))
                hi = int(np.searchsorted(seqs, run.end))
                if lo == hi:
                    continue
                covered[lo:hi] = True
                if run.rows is not None:
                    slow.append(np.arange(lo, hi))
                    continue
                idx = seqs[lo:hi] - run.first
                same = pc.equal(joined.slice(lo, hi - lo), run.joined).fill_null(False)
                ok = np.frombuffer(run.open, np.bool_)[idx] & same.to_numpy(zero_copy_only=False)
                if run.dups is not None:
                    ok &= ~run.dups[idx]
                agreed = int(ok.sum())
                if agreed:
                    np.frombuffer(run.open, np.bool_)[idx[ok]] = False
                    self._held -= agreed
                    self.agreed += agreed
                if agreed < hi - lo:
                    slow.append(lo + np.flatnonzero(~ok))
        slow.append(np.flatnonzero(~covered))
        rows = np.sort(np.concatenate(slow))
        if not len(rows):
            return []
        out = []
        row_apps = apps.take(pa.array(rows)).to_pylist()
        for n, row in enumerate(rows.tolist()):
            outcome = self.delivered(int(seqs[row]), row_apps[n], bool(express[row]))
            if outcome is not None:
                out.append((row, outcome))
        return out

    def judged_through(self, seq_bound: int) -> list[Disagreement]:
        """The pipeline has judged every row up to `seq_bound`: a decision
        still held there got no delivery row, so the pipeline dropped it as
        a duplicate."""
        found = []
        while self._runs and self._runs[0].first + self._runs[0].start <= seq_bound:
            run = self._runs[0]
            stop = min(run.end, seq_bound + 1) - run.first
            held = run.open_rows(run.start, stop)
            self._held -= len(held)
            for i in held.tolist():
                pushed = run.decision(i)
                if pushed is None:
                    self.agreed += 1
                else:
                    self.disagreed += 1
                    found.append(Disagreement(run.key, run.guid(i), run.first + i, pushed, None, ()))
            self._leave(run, stop)
        return found
