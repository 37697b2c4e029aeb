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
import itertools
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


HISTORY_SHARDS = 1024   # the young GUIDs' dicts, by the GUID's hash
GENERATIONS = 16        # the window's older GUIDs are kept as this many sorted generations (about)
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))


def _keys(blob: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GUIDs (16 bytes each, concatenated) as (hash, first 8 bytes, last 8
    bytes), three uint64 arrays. The hash mixes all 16 bytes: the SDK's
    GUIDs start with a clock, a client's may be anything."""
    words = np.frombuffer(blob, dtype="<u8").reshape(-1, 2)
    hi, lo = words[:, 0], words[:, 1]
    h = (hi * _MIX[0]) ^ (lo * _MIX[1])   # (wraps modulo 2**64)
    h ^= h >> np.uint64(29)
    return h, hi, lo


class _Generation:
    """GUIDs first committed in one span of time, frozen: sorted by hash,
    33 bytes each (hash, the GUID's two halves, its first commit time, and a
    byte of the bitmap that rules most lookups out without a search)."""

    __slots__ = ("h", "hi", "lo", "t", "newest", "bits", "shift")

    def __init__(self, blob: bytes, times: np.ndarray):
        h, hi, lo = _keys(blob)
        order = np.argsort(h)   # (equal hashes in any order: `find` looks at all of them)
        self.h, self.hi, self.lo, self.t = h[order], hi[order], lo[order], times[order]
        self.newest = int(times.max())
        # A one-hash Bloom filter of 8 bits a GUID: a GUID it does not hold
        # passes it about one time in eight or less; only those are searched for.
        size = max(64, 1 << int(8 * len(h) - 1).bit_length())
        self.shift = np.uint64(64 - (size.bit_length() - 1))
        flags = np.zeros(size, np.bool_)
        flags[self._slots(self.h)] = True
        self.bits = np.packbits(flags, bitorder="little")

    def _slots(self, h: np.ndarray) -> np.ndarray:
        slots: np.ndarray = (h * _MIX[1]) >> self.shift
        return slots

    def __len__(self) -> int:
        return len(self.h)

    def find(self, h: np.ndarray, hi: np.ndarray, lo: np.ndarray, horizon: int) -> np.ndarray | None:
        """For each GUID, whether this generation holds it first committed at
        or after `horizon`; None when it holds none of them."""
        slots = self._slots(h)
        maybe = np.flatnonzero((self.bits[slots >> np.uint64(3)] >> (slots & np.uint64(7)).astype(np.uint8)) & 1)
        if not len(maybe):
            return None
        n = len(self.h)
        hm = h[maybe]
        at = np.minimum(np.searchsorted(self.h, hm), n - 1)
        same_hash = self.h[at] == hm
        found = same_hash & (self.hi[at] == hi[maybe]) & (self.lo[at] == lo[maybe])
        for i in np.flatnonzero(same_hash & ~found):   # another GUID with the same 64-bit hash: look on
            j = int(at[i]) + 1
            while j < n and self.h[j] == hm[i]:
                if self.hi[j] == hi[maybe[i]] and self.lo[j] == lo[maybe[i]]:
                    found[i], at[i] = True, j
                    break
                j += 1
        found &= self.t[at] >= horizon
        if not found.any():
            return None
        result = np.zeros(len(h), np.bool_)
        result[maybe[found]] = True
        return result

    def count_since(self, horizon: int) -> int:
        return int(np.count_nonzero(self.t >= horizon))


class GuidHistory:
    """GUIDs first committed within the last `window_us` microseconds.

    The young ones, first committed within the last `window_us /
    GENERATIONS`, are in dicts; each span of that length before is frozen
    into a `_Generation`, 33 bytes a GUID, and a generation goes as a whole
    once its newest GUID has left the window. A commit looks its GUIDs up in
    the generations a few NumPy searches at a time, then in the dicts. A
    window of 6M GUIDs (300 s at 20k msg/s) all in dicts took about 120
    bytes a GUID, 720 MiB.

    The young GUIDs are spread over `HISTORY_SHARDS` dicts by hash. One dict
    of 6M entries rehashed all of them when it grew, holding the GIL: 231 ms
    alone at 5.6M entries, and a whole-node stall of 1.3-1.6 s 280 s into a
    run at 20k msg/s. Each commit's new GUIDs are also kept as one bytes
    object (16 bytes each), not a list, for freezing: lists of millions of
    GUIDs made every full collection of Python's garbage collector traverse
    them all (75 ms, every thread stopped)."""

    def __init__(self, window_us: int):
        assert window_us > 0
        self.window_us = window_us
        self.generation_us = max(1, window_us // GENERATIONS)
        self._shards: list[dict[bytes, int]] = [{} for _ in range(HISTORY_SHARDS)]   # guid -> first commit time
        self._commits: deque[tuple[int, bytes]] = deque()  # the young: (time, GUIDs first seen then, joined)
        self._young = 0
        self._generations: deque[_Generation] = deque()    # oldest first
        self._horizon = -(1 << 62)                          # times before it have left the window

    def __len__(self) -> int:
        return self._young + sum(g.count_since(self._horizon) for g in self._generations)

    def __contains__(self, guid: bytes) -> bool:
        if guid in self._shards[hash(guid) % HISTORY_SHARDS]:
            return True
        if not self._generations:
            return False
        h, hi, lo = _keys(_guid_blob([guid]))
        return any(g.find(h, hi, lo, self._horizon) is not None for g in self._generations)

    def commit(self, guids: Sequence[bytes], now_us: int) -> list[bool]:
        """Record one commit's GUIDs (in seq order); return, per row, whether it
        is a duplicate: first committed within the window, earlier or in this
        same commit."""
        self.expire(now_us)
        older: list[bool] | None = None
        if self._generations and len(guids):
            h, hi, lo = _keys(_guid_blob(guids if isinstance(guids, list) else list(guids)))
            seen = None
            for generation in self._generations:
                found = generation.find(h, hi, lo, self._horizon)
                if found is not None:
                    seen = found if seen is None else seen | found
            if seen is not None:
                older = seen.tolist()
        shards = self._shards
        fresh: list[bytes] = []
        duplicates = []
        for i, guid in enumerate(guids):
            shard = shards[hash(guid) % HISTORY_SHARDS]
            if (older is not None and older[i]) or guid in shard:
                duplicates.append(True)
            else:
                shard[guid] = now_us
                fresh.append(guid)
                duplicates.append(False)
        if fresh:
            self._young += len(fresh)
            self._commits.append((now_us, _guid_blob(fresh)))
        return duplicates

    def load(self, first_times: Iterable[tuple[bytes, int]]) -> None:
        """Rebuild from the PUT log after a takeover: (guid, first put time)
        in time order, each run of one time as the commit it was."""
        at: int | None = None
        run: list[bytes] = []
        for guid, at_us in first_times:
            if at_us != at and run:
                self.commit(run, cast(int, at))
                run = []
            at = at_us
            run.append(guid)
        if run:
            self.commit(run, cast(int, at))

    def expire(self, now_us: int) -> None:
        """Forget what left the window by `now_us`; freeze the young GUIDs
        into a generation once they span `generation_us`."""
        self._horizon = max(self._horizon, now_us - self.window_us)
        if self._commits and now_us - self._commits[0][0] >= self.generation_us:
            self._freeze()
        generations = self._generations
        while generations and generations[0].newest < self._horizon:
            generations.popleft()

    def _freeze(self) -> None:
        commits, self._commits = self._commits, deque()
        times = np.repeat(np.fromiter((t for t, _ in commits), np.int64, len(commits)),
                          [len(blob) // GUID_LENGTH for _, blob in commits])
        self._generations.append(_Generation(b"".join(blob for _, blob in commits), times))
        self._shards = [{} for _ in range(HISTORY_SHARDS)]
        self._young = 0


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
    """The express decisions for consecutive seqs, `first` to `end - 1`:
    either one set of apps for the whole run (`rows` None; a columnar frame
    to one queue, where only duplicates, `dups`, differ) or one entry per
    row (`rows`), of one queue (`key`) or, once rows of several queues
    follow each other (a commit's rows, a queue's one or two each when
    there are thousands), of each row's own (`keys`): a run per commit, not
    per row, so a pipeline lag's worth of decisions is a few objects for
    the garbage collector to walk, not three a row. `open[i]` is 1 while
    row i waits for its delivery row; rows before `start` have left the
    reconciler (judged, or forgotten)."""

    __slots__ = ("first", "end", "key", "keys", "guids", "apps", "joined", "dups", "rows", "open", "start")

    def __init__(self, first: int, key: Any, guids: Any, apps: tuple[str, ...] | None,
                 dups: np.ndarray | None, rows: list[tuple[str, ...] | None] | None):
        self.first, self.end, self.key = first, first + len(guids), key
        self.keys: list[Any] | None = None
        self.guids = guids                   # list[bytes] or an Arrow binary array, read only on a disagreement
        self.apps, self.dups, self.rows = apps, dups, rows
        self.joined = _joined(apps) if apps is not None else None
        self.open = bytearray(b"\x01") * len(guids)
        self.start = 0

    def decision(self, i: int) -> tuple[str, ...] | None:
        if self.rows is not None:
            return self.rows[i]
        return None if self.dups is not None and self.dups[i] else self.apps

    def key_of(self, i: int) -> Any:
        return self.key if self.keys is None else self.keys[i]

    def guid(self, i: int) -> bytes:
        guid = self.guids[i]
        return guid if isinstance(guid, bytes) else guid.as_py()

    def open_rows(self, a: int, b: int) -> np.ndarray:
        """Indexes in [a, b) still waiting for their delivery row."""
        return a + np.flatnonzero(np.frombuffer(self.open, np.bool_)[a:b])


def _same_apps(pushed: tuple[str, ...] | None, apps: Sequence[str]) -> bool:
    """Whether the express lane pushed to exactly the apps the pipeline kept."""
    return pushed is not None and len(pushed) == len(apps) and (
        all(a == b for a, b in zip(pushed, apps)) or set(pushed) == set(apps))


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

    compact_min = 1024   # runs that left before the list drops them (amortised O(1) a run)

    def __init__(self, decisions_max: int = DECISIONS_MAX):
        self.decisions_max = decisions_max
        self._runs: list[_Run] = []          # ascending seqs; those before _head have left
        self._head = 0
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
        that follows the last one joins its run (whatever its queue)."""
        last = self._runs[-1] if len(self._runs) > self._head else None
        if last is not None and last.rows is not None and last.end == seq:
            if last.keys is not None:
                last.keys.append(key)
            elif last.key is not key:
                last.keys = [last.key] * (last.end - last.first) + [key]
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
            run = self._runs[self._head]
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
            # The first run leaves. Not list.pop(0): with a run per row (a
            # queue's one row in a commit, 1,000 queues and more) there are
            # a pipeline lag's worth of runs (10 us a pop at 150,000).
            self._head += 1
            if self._head >= self.compact_min and self._head * 2 >= len(self._runs):
                del self._runs[:self._head]
                self._head = 0

    def _find(self, seq: int) -> tuple[_Run, int] | None:
        """The run holding a decision still waiting for `seq`'s delivery row."""
        runs = self._runs
        n = bisect.bisect_right(runs, seq, lo=self._head, key=lambda r: r.first) - 1
        if n < self._head:
            return None
        run = runs[n]
        i = seq - run.first
        if i < run.start or seq >= run.end or not run.open[i]:
            return None
        return run, i

    # -- the pipeline's delivery rows -----------------------------------------
    def delivered(self, seq: int, apps: Sequence[str], express_domain: bool,
                  copy: tuple[_Run, int] | None = None) -> Delivered | None:
        """A delivery row: the pipeline kept `seq` for `apps`. None when there
        is nothing to do (the common case: the express lane decided the same).
        `copy`: the held decision of another row with the same GUID, which the
        express lane pushed (`delivered_rows` finds it)."""
        found = self._find(seq)
        if found is None:
            if express_domain and seq <= self.forgotten_through:
                return None   # decided, then forgotten: taken as pushed
            return Delivered(seq, tuple(apps), None)  # never decided here: the pipeline's call
        run, i = found
        run.open[i] = 0
        self._held -= 1
        pushed = run.decision(i)
        if pushed is None and copy is not None and copy[0].key_of(copy[1]) is run.key_of(i) and _same_apps(
                copy[0].decision(copy[1]), apps):
            # One message committed twice to its queue in one micro-batch (a
            # producer's resend, a mirrored PUT): the express lane pushed the
            # first copy and the pipeline kept another. The same message went
            # to the same apps: both rows agree, and nothing is pushed again.
            other, j = copy
            other.open[j] = 0
            self._held -= 1
            self.agreed += 2
            return None
        if _same_apps(pushed, apps):
            self.agreed += 1
            return None
        kept = tuple(apps)
        late = tuple(a for a in kept if pushed is None or a not in pushed)
        self.disagreed += 1
        return Delivered(seq, late, Disagreement(run.key_of(i), run.guid(i), seq, pushed, kept, late))

    def delivered_rows(self, seqs: np.ndarray, apps: pa.Array, express: np.ndarray,
                       guids: pa.Array | None = None) -> list[tuple[int, Delivered]]:
        """A batch of delivery rows at once: `seqs` ascending, `apps` (a
        list<string> array without nulls) and whether each row's domain is
        express; with `guids` (the rows' GUIDs, binary), a row the express
        lane judged a duplicate whose earlier copy it pushed agrees with that
        copy (`delivered`'s `copy`). Returns (row index, what to do) for the
        rows that need something, in seq order; the same outcome as
        `delivered` row by row."""
        count = len(seqs)
        if not count:
            return []
        slow: list[np.ndarray] = []
        covered = np.zeros(count, np.bool_)
        runs = self._runs
        if len(runs) > self._head and not (count > 1 and (np.diff(seqs) <= 0).any()):
            joined = pc.binary_join(apps, "\0")
            lo_seq, hi_seq = int(seqs[0]), int(seqs[-1])
            first = max(self._head, bisect.bisect_right(runs, lo_seq, lo=self._head, key=lambda r: r.first) - 1)
            for run in itertools.islice(runs, first, None):
                if run.first > hi_seq:
                    break
                lo = int(np.searchsorted(seqs, run.first + run.start))
                hi = int(np.searchsorted(seqs, run.end))
                if lo == hi:
                    continue
                covered[lo:hi] = True
                idx = seqs[lo:hi] - run.first
                if run.rows is not None:
                    # Each row's own decision, joined as the log's apps are
                    # (a duplicate's None never equals: the per-row path).
                    decisions = run.rows
                    expected: Any = pa.array([None if (d := decisions[i]) is None else "\0".join(d)
                                              for i in idx.tolist()], pa.string())
                else:
                    expected = run.joined
                same = pc.equal(joined.slice(lo, hi - lo), expected).fill_null(False)
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
        copies: dict[bytes, tuple[_Run, int]] = {}
        row_guids: list[bytes] = []
        if guids is not None:
            copies = self._pushed_copies(seqs, rows, guids)
            if copies:
                row_guids = guids.take(pa.array(rows)).to_pylist()
        for n, row in enumerate(rows.tolist()):
            seq = int(seqs[row])
            copy = copies.get(row_guids[n]) if copies else None
            outcome = self.delivered(seq, row_apps[n], bool(express[row]),
                                     copy if copy is not None and copy[0].first + copy[1] != seq else None)
            if outcome is not None:
                out.append((row, outcome))
        return out

    def _pushed_copies(self, seqs: np.ndarray, rows: np.ndarray, guids: pa.Array) -> dict[bytes, tuple[_Run, int]]:
        """For the slow rows the express lane judged duplicates: the held
        decision of an earlier row with the same GUID that it pushed, by GUID.
        One scan of the held runs, in Arrow, only when there are such rows."""
        wanted = []
        for row in rows.tolist():
            found = self._find(int(seqs[row]))
            if found is not None and found[0].decision(found[1]) is None:
                wanted.append(row)
        if not wanted:
            return {}
        values = guids.take(pa.array(wanted))
        copies: dict[bytes, tuple[_Run, int]] = {}
        for run in itertools.islice(self._runs, self._head, None):
            held = run.guids if isinstance(run.guids, pa.Array) else pa.array(run.guids, pa.binary())
            if held.type != values.type:
                held = held.cast(values.type)
            hits = np.flatnonzero(pc.is_in(held, value_set=values).to_numpy(zero_copy_only=False))
            for i in hits.tolist():
                if i >= run.start and run.open[i] and run.decision(i) is not None:
                    copies.setdefault(run.guid(i), (run, i))
        return copies

    def judged_through(self, seq_bound: int) -> list[Disagreement]:
        """The pipeline has judged every row up to `seq_bound`: a decision
        still held there got no delivery row, so the pipeline dropped it as
        a duplicate."""
        found = []
        while len(self._runs) > self._head and (
                self._runs[self._head].first + self._runs[self._head].start <= seq_bound):
            run = self._runs[self._head]
            stop = min(run.end, seq_bound + 1) - run.first
            held = run.open_rows(run.start, stop)
            self._held -= len(held)
            for i in held.tolist():
                pushed = run.decision(i)
                if pushed is None:
                    self.agreed += 1
                else:
                    self.disagreed += 1
                    found.append(Disagreement(run.key_of(i), run.guid(i), run.first + i, pushed, None, ()))
            self._leave(run, stop)
        return found
