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


GENERATIONS = 16        # the window's older GUIDs are kept as this many sorted generations (about)
_YOUNG_MIN = 1 << 16    # GUIDs the first young table holds (3 MiB)
_YOUNG_MAX = 1 << 22    # GUIDs a young table grows to hold at most (about 200 MiB)
_BUCKET = 8             # slots in a bucket of the young table
Mix = tuple[np.uint64, np.uint64]
# The GUID hash's default multipliers. A primary gives its histories odd ones
# of its own, drawn at random (`GuidHistory(seed=...)`), so a client cannot
# choose GUIDs that all land in one bucket of the young table (its lookups
# would then go through the whole table for each GUID).
_MIX: Mix = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))


def mix_of(seed: bytes) -> Mix:
    """The hash's two odd multipliers from 16 bytes of `seed`."""
    return np.uint64(int.from_bytes(seed[:8], "little") | 1), np.uint64(int.from_bytes(seed[8:16], "little") | 1)


def _keys(blob: bytes, mix: Mix = _MIX) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GUIDs (16 bytes each, concatenated) as (hash, first 8 bytes, last 8
    bytes), three uint64 arrays. The hash mixes all 16 bytes: the SDK's
    GUIDs start with a clock, a client's may be anything."""
    words = np.frombuffer(blob, dtype="<u8").reshape(-1, 2)
    return _hash(words[:, 0], words[:, 1], mix), words[:, 0], words[:, 1]


def _hash(hi: np.ndarray, lo: np.ndarray, mix: Mix = _MIX) -> np.ndarray:
    """A 64-bit hash of each GUID whose every bit depends on all 128 (the
    young table takes its low bits, a generation's filter a product of it):
    GUIDs that differ only in their high bytes, as counters written big-end
    first do, must not all land in one bucket."""
    h: np.ndarray = (hi * mix[0]) ^ (lo * mix[1])   # (wraps modulo 2**64)
    h ^= h >> np.uint64(32)
    h *= mix[0]
    h ^= h >> np.uint64(29)
    return h


def _first_seen(h: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Per GUID, whether an earlier one of the same batch is the same GUID.
    Most batches hold no hash twice: one sort of the hashes says so."""
    repeat = np.zeros(len(h), np.bool_)
    if len(h) < 2 or not (np.diff(np.sort(h)) == 0).any():
        return repeat
    order = np.lexsort((lo, hi, h))   # stable: of equal GUIDs the earliest comes first
    hs, his, los = h[order], hi[order], lo[order]
    same = (hs[1:] == hs[:-1]) & (his[1:] == his[:-1]) & (los[1:] == los[:-1])
    repeat[order[1:][same]] = True
    return repeat


class _Generation:
    """GUIDs first committed in one span of time, frozen: sorted by hash,
    34 bytes each (hash, the GUID's two halves, its first commit time, and
    two bytes of a Bloom filter that rules most lookups out without a
    search)."""

    __slots__ = ("h", "hi", "lo", "t", "newest", "words", "mix")

    def __init__(self, hi: np.ndarray, lo: np.ndarray, times: np.ndarray, mix: Mix = _MIX):
        self.mix = mix
        h = _hash(hi, lo, mix)
        order = np.argsort(h)   # (equal hashes in any order: `find` looks at all of them)
        self.h, self.hi, self.lo, self.t = h[order], hi[order], lo[order], times[order]
        self.newest = int(times.max())
        # A blocked Bloom filter: 16 bits a GUID, three of them set in one
        # 64-bit word. A GUID it does not hold passes it about one time in a
        # hundred, and only those are searched for: a search is a dozen
        # cache misses in a generation of a million, and a one-hash filter
        # of 8 bits a GUID let one in eight through.
        self.words = np.zeros(max(1, -(-len(h) // 4)), np.uint64)
        word, mask = self._probe(self.h)
        order = np.argsort(word, kind="stable")
        word, mask = word[order], mask[order]
        starts = np.flatnonzero(np.r_[True, word[1:] != word[:-1]])
        self.words[word[starts]] = np.bitwise_or.reduceat(mask, starts)

    def _probe(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each hash's word of the filter, and its three bits there."""
        g = h * self.mix[1]
        word = (g >> np.uint64(32)) % np.uint64(len(self.words))
        one = np.uint64(1)
        mask = ((one << (g & np.uint64(63))) | (one << ((g >> np.uint64(6)) & np.uint64(63)))
                | (one << ((g >> np.uint64(12)) & np.uint64(63))))
        return word, mask

    def __len__(self) -> int:
        return len(self.h)

    def find(self, h: np.ndarray, hi: np.ndarray, lo: np.ndarray, horizon: int) -> np.ndarray | None:
        """For each GUID, whether this generation holds it first committed at
        or after `horizon`; None when it holds none of them."""
        word, mask = self._probe(h)
        maybe = np.flatnonzero((self.words[word] & mask) == mask)
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

    @property
    def nbytes(self) -> int:
        return self.h.nbytes + self.hi.nbytes + self.lo.nbytes + self.t.nbytes + self.words.nbytes

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.hi, self.lo, self.t


class _Young:
    """The GUIDs first committed since the last freeze: their halves and
    first commit times in arrays, in commit order, and a hash table of
    buckets of `_BUCKET` slots (hash, position + 1; 0: empty) that holds at
    most `capacity` GUIDs, half its slots. A GUID goes in the first bucket
    its hash names with room; nothing is ever taken out (the table is
    frozen whole), so a lookup goes on to the next bucket only from a full
    one. A commit's GUIDs are looked up and added a bucket at a time for all
    of them, in NumPy: no Python object per GUID, and no rehash: a full
    table is frozen early and the next one is made larger. About 56 bytes a
    GUID."""

    __slots__ = ("count", "capacity", "hi", "lo", "t", "hashes", "refs", "used", "mask")

    def __init__(self, capacity: int = _YOUNG_MIN):
        self.count = 0
        self.capacity = capacity
        buckets = 1 << max(0, (2 * capacity - 1) // _BUCKET).bit_length()
        self.hi, self.lo = np.empty(capacity, np.uint64), np.empty(capacity, np.uint64)
        self.t = np.empty(capacity, np.int64)
        self.hashes = np.zeros((buckets, _BUCKET), np.uint64)
        self.refs = np.zeros((buckets, _BUCKET), np.uint32)
        self.used = np.zeros(buckets, np.uint8)    # slots taken in each bucket, from its first
        self.mask = np.uint64(buckets - 1)

    def __len__(self) -> int:
        return self.count

    @property
    def newest(self) -> int:
        return int(self.t[:self.count].max()) if self.count else -(1 << 62)

    def oldest_us(self) -> int | None:
        return int(self.t[0]) if self.count else None

    @property
    def nbytes(self) -> int:
        """Its arrays, made for its capacity (not its count)."""
        return (self.hi.nbytes + self.lo.nbytes + self.t.nbytes + self.hashes.nbytes + self.refs.nbytes
                + self.used.nbytes)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = self.count
        return self.hi[:n], self.lo[:n], self.t[:n]

    def find(self, h: np.ndarray, hi: np.ndarray, lo: np.ndarray, horizon: int | None = None) -> np.ndarray | None:
        """For each GUID, whether it is here (first committed at or after
        `horizon`, if given); None when none is."""
        if not self.count:
            return None
        found = np.zeros(len(h), np.bool_)
        todo = np.arange(len(h))
        bucket = h & self.mask
        while len(todo):
            rows, cols = np.nonzero(self.hashes[bucket] == h[todo, None])
            if len(rows):
                at = self.refs[bucket[rows], cols].astype(np.int64) - 1
                keys = todo[rows]
                hit = (at >= 0) & (self.hi[at] == hi[keys]) & (self.lo[at] == lo[keys])
                if horizon is not None:
                    hit &= self.t[at] >= horizon
                found[keys[hit]] = True
            go_on = (self.used[bucket] == _BUCKET) & ~found[todo]
            todo, bucket = todo[go_on], (bucket[go_on] + np.uint64(1)) & self.mask
        return found if found.any() else None

    def count_since(self, horizon: int) -> int:
        return int(np.count_nonzero(self.t[:self.count] >= horizon))

    def add(self, h: np.ndarray, hi: np.ndarray, lo: np.ndarray, now_us: int) -> None:
        """Add GUIDs that are not here, none twice; there must be room."""
        n = len(h)
        first = self.count
        assert first + n <= self.capacity, "the young table is full: freeze it first"
        self.hi[first:first + n], self.lo[first:first + n], self.t[first:first + n] = hi, lo, now_us
        self.count += n
        bucket = h & self.mask
        ref = np.arange(first + 1, first + n + 1, dtype=np.uint32)
        while len(ref):
            # The GUIDs of one bucket take its next free slots in order; those
            # it has no room for go on to the next bucket.
            order = np.argsort(bucket, kind="stable")
            h, ref, bucket = h[order], ref[order], bucket[order]
            m = len(bucket)
            starts = np.ones(m, np.bool_)
            starts[1:] = bucket[1:] != bucket[:-1]
            index = np.arange(m)
            slot = self.used[bucket].astype(np.int64) + index - np.maximum.accumulate(np.where(starts, index, 0))
            fits = slot < _BUCKET
            self.hashes[bucket[fits], slot[fits]] = h[fits]
            self.refs[bucket[fits], slot[fits]] = ref[fits]
            ends = np.ones(m, np.bool_)
            ends[:-1] = starts[1:]
            self.used[bucket[ends]] = np.minimum(_BUCKET, slot[ends] + 1)
            left = ~fits
            h, ref, bucket = h[left], ref[left], (bucket[left] + np.uint64(1)) & self.mask


Spawn = Callable[[Callable[[], None]], Callable[[], None]]


def inline(task: Callable[[], None]) -> Callable[[], None]:
    """A `Spawn` that runs `task` at once; the wait it returns has nothing to wait for."""
    task()
    return lambda: None


class _Freezing:
    """Young tables (and a generation or none) on their way to one
    `_Generation`, built by `spawn` (a primary builds it on a thread of its
    own: sorting a million hashes takes 0.1 s); until it is ready, lookups
    go to the parts, which nothing changes any more."""

    __slots__ = ("parts", "newest", "mix", "spawn", "_generation", "_wait")

    def __init__(self, parts: "list[_Young | _Generation]", mix: Mix, spawn: "Spawn"):
        self.parts, self.mix, self.spawn = parts, mix, spawn
        self.newest = max(p.newest for p in parts)
        self._generation: _Generation | None = None
        self._wait = spawn(self._build)

    def _build(self) -> None:
        arrays = [p.arrays() for p in self.parts]
        hi, lo, t = (np.concatenate([a[i] for a in arrays]) for i in range(3))
        self._generation = _Generation(hi, lo, t, self.mix)

    def ready(self, wait: bool = False) -> _Generation | None:
        """The generation once built (None before; `wait`: until the build
        ends). A build that failed (out of memory) leaves the parts in use."""
        if wait:
            self._wait()
        return self._generation

    def with_part(self, young: _Young) -> "_Freezing":
        """One generation of these and `young` (a young table that filled
        early: the tables of a first span, which grow by doubling, make
        one generation, not one each)."""
        built = self.ready()
        return _Freezing([built, young] if built is not None else [*self.parts, young], self.mix, self.spawn)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def find(self, h: np.ndarray, hi: np.ndarray, lo: np.ndarray, horizon: int) -> np.ndarray | None:
        found = None
        for part in self.parts:
            more = part.find(h, hi, lo, horizon)
            if more is not None:
                found = more if found is None else found | more
        return found

    def count_since(self, horizon: int) -> int:
        return sum(p.count_since(horizon) for p in self.parts)

    @property
    def nbytes(self) -> int:
        """The parts', and the generation's once built (until it replaces them)."""
        built = self._generation
        return sum(p.nbytes for p in self.parts) + (built.nbytes if built is not None else 0)


class GuidHistory:
    """GUIDs first committed within the last `window_us` microseconds.

    The young ones, first committed within the last `window_us /
    GENERATIONS`, are in a `_Young` table; each span of that length before
    is frozen into a `_Generation`, 34 bytes a GUID, and a generation goes
    as a whole once its newest GUID has left the window. A young table that
    fills before its span is over is frozen then, and the next one made
    twice as large. A commit looks its GUIDs up and adds them a few NumPy
    operations at a time, in the generations and the young table alike: no
    Python per GUID (dicts of GUIDs cost 0.5-0.7 us a GUID of the commit
    thread's Python, and one dict of 6M rehashed them all when it grew,
    231 ms with the GIL held). The generations are sorted on a thread of
    their own, not in the commit that freezes them.

    Nothing per GUID is a Python object, so the garbage collector has
    nothing per GUID to traverse (lists of millions made every full
    collection walk them: 75 ms, every thread stopped)."""

    def __init__(self, window_us: int, *, seed: bytes | None = None, spawn: Spawn = inline,
                 young_min: int = _YOUNG_MIN, young_max: int = _YOUNG_MAX):
        """`seed`: 16 random bytes for the hash (a primary's own; None: fixed
        multipliers). `spawn(task)` runs a generation's build and returns a
        call that waits for it to end (default: at once, in the caller).
        `young_min`, `young_max`: the GUIDs a young table holds at first and
        at most (tests make them small)."""
        assert window_us > 0 and 1 <= young_min <= young_max
        self._mix = _MIX if seed is None else mix_of(seed)
        self._spawn = spawn
        self.window_us = window_us
        self.generation_us = max(1, window_us // GENERATIONS)
        self._young_min, self._young_max = young_min, young_max
        self._young = _Young(young_min)
        self._generations: deque[_Generation | _Freezing] = deque()    # oldest first
        self._horizon = -(1 << 62)                          # times before it have left the window

    def __len__(self) -> int:
        return self._young.count + sum(g.count_since(self._horizon) for g in self._generations)

    @property
    def nbytes(self) -> int:
        """The memory its arrays take: about 34 bytes a GUID once frozen, the
        young table's for its capacity, and both while a generation is
        being built (`taproot_express_history_bytes`)."""
        return self._young.nbytes + sum(g.nbytes for g in self._generations)

    def __contains__(self, guid: bytes) -> bool:
        h, hi, lo = _keys(_guid_blob([guid]), self._mix)
        if self._young.find(h, hi, lo) is not None:
            return True
        return any(g.find(h, hi, lo, self._horizon) is not None for g in self._generations)

    def commit(self, guids: Sequence[bytes] | bytes, now_us: int) -> list[bool]:
        """Record one commit's GUIDs (in seq order: a list, or their bytes
        concatenated); return, per row, whether it is a duplicate: first
        committed within the window, earlier or in this same commit."""
        self.expire(now_us)
        blob = guids if isinstance(guids, bytes) else _guid_blob(list(guids))
        if len(blob) % GUID_LENGTH:
            raise ValueError("a GUID of the wrong length reached the GUID history")
        if not blob:
            return []
        h, hi, lo = _keys(blob, self._mix)
        duplicate = _first_seen(h, hi, lo)
        for generation in (*self._generations, self._young):
            found = generation.find(h, hi, lo, self._horizon)
            if found is not None:
                duplicate |= found
        fresh = ~duplicate
        n = int(np.count_nonzero(fresh))
        if self._young.count + n > self._young.capacity:
            self._freeze(n)
        self._young.add(h[fresh], hi[fresh], lo[fresh], now_us)
        result: list[bool] = duplicate.tolist()
        return result

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
        into a generation once they span `generation_us`; take the
        generations built since."""
        self._horizon = max(self._horizon, now_us - self.window_us)
        oldest = self._young.oldest_us()
        if oldest is not None and now_us - oldest >= self.generation_us:
            self._freeze(0)
        self._take_built(wait=False)
        generations = self._generations
        while generations and generations[0].newest < self._horizon:
            generations.popleft()

    def settle(self) -> None:
        """Wait for the generations being built (tests, and a steady state to measure)."""
        self._take_built(wait=True)

    def _take_built(self, wait: bool) -> None:
        generations = self._generations
        for i in range(len(generations)):
            g = generations[i]
            if isinstance(g, _Freezing):
                built = g.ready(wait)
                if built is not None:
                    generations[i] = built

    def _freeze(self, incoming: int) -> None:
        """The young table to a generation (built on a thread), and a new
        one with room for `incoming` GUIDs: twice as large if this one
        filled before its span was over, half as large if it was less than
        a quarter full, else as large."""
        young, generations = self._young, self._generations
        capacity = young.capacity
        full = young.count + incoming > capacity
        if young.count and full and generations and len(generations[-1]) < young.count:
            last = generations[-1]   # filled early: one generation with the smaller one before
            generations[-1] = (last.with_part(young) if isinstance(last, _Freezing)
                               else _Freezing([last, young], self._mix, self._spawn))
        elif young.count:
            generations.append(_Freezing([young], self._mix, self._spawn))
        if full:
            capacity = min(self._young_max, capacity * 2)
        elif young.count < capacity // 4:
            capacity = max(self._young_min, capacity // 2)
        self._young = _Young(max(capacity, incoming))


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

    def decided_rows(self, seqs: Sequence[int], keys: Sequence[Any], guids: Sequence[bytes],
                     apps: Sequence[tuple[str, ...] | None]) -> None:
        """`decided` for many rows at once (`seqs` ascending; gaps allowed),
        the same runs as a call per row would make: each block of consecutive
        seqs joins the last run in one extend rather than row by row (a frame
        spanning thousands of queues decides a row or two of each)."""
        n, total = 0, len(seqs)
        while n < total:
            seq = seqs[n]
            m = n + 1
            while m < total and seqs[m] == seqs[m - 1] + 1:
                m += 1
            last = self._runs[-1] if len(self._runs) > self._head else None
            if last is None or last.rows is None or last.end != seq:
                last = _Run(seq, keys[n], [guids[n]], None, None, [apps[n]])
                self._add(last)
                n += 1
                if n == m:
                    continue
            block = keys[n:m]
            if last.keys is not None:
                last.keys.extend(block)
            elif any(k is not last.key for k in block):
                last.keys = [last.key] * (last.end - last.first)
                last.keys.extend(block)
            rows = last.rows
            assert rows is not None   # (a run of rows, joined above)
            rows.extend(apps[n:m])
            last.guids.extend(guids[n:m])
            last.open.extend(b"\x01" * (m - n))
            last.end += m - n
            self._added(m - n)
            n = m

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
