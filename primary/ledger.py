"""Rows of frames spanning queues held by sole consumers, as arrays.

With thousands of queues a PUT frame holds a row or a few of each, and a
CONFIRM frame names a seq or a few of each. Held in each queue's dispatcher,
every row cost a Python dict entry going in and a pop coming out, a call's
worth of lookups a queue, twice (`take_fresh`, `confirm_ranges`). The
ledger keeps those rows for the queues in their usual state instead, as
numpy arrays: per frame, which queue's consumer holds each row; per queue
(a *slot*, one per dispatcher), how many rows and bytes its consumer holds
and its window. A frame's take and a CONFIRM frame's ranges are then a few
array operations whatever the number of queues.

A dispatcher is *plain* while the ledger may hold rows for it: one
consumer, without a subscription, with nothing waiting and nothing held
in the dispatcher itself. Every other thing that happens to a dispatcher
first moves its ledger rows into its consumer (`release`), as (run, row)
entries in push order, exactly what `take_fresh` would have put there;
the dispatcher then works as it always did, and is plain again once it
is back in its usual state (`QueueDispatcher._sync_ledger`). So a
consumer's rows are all in the ledger or all in the dispatcher, never
split, and the outcome is `take_fresh`'s and `confirm_ranges`'s
(`tests/test_dispatcher.py` holds them to the same schedules).

Not thread safe: the caller holds the partition lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from primary.dispatcher import ConsumerKey, take_fresh

if TYPE_CHECKING:
    from primary.dispatcher import ConfirmedRows, MessageRun, QueueDispatcher

_GROW = 1024


class _Frame:
    """One frame's rows held in the ledger: `holder[row]` is the slot whose
    consumer holds row `row` (-1: none here), as (`runs[run_of[row]]`, row)."""

    __slots__ = ("first", "holder", "run_of", "runs", "sizes", "live", "made_us")

    def __init__(self, run: "MessageRun", sizes: np.ndarray, made_us: int):
        n = len(run.seqs)
        self.first = run.seqs[0]
        self.holder = np.full(n, -1, np.int32)
        self.run_of = np.zeros(n, np.int16)
        self.runs: list[MessageRun] = []
        self.sizes = sizes
        self.live = 0
        self.made_us = made_us


# Queue ids below this are indexed by link as arrays (`Ledger.slots_of`): a
# session numbers its queues from 1, so its array is as long as its queues.
DENSE_QUEUE_IDS = 1 << 20


class Ledger:
    """The held rows of one partition's plain dispatchers (see the module).
    `keys`: the sole consumer of each plain dispatcher, to its slot."""

    def __init__(self) -> None:
        self.keys: dict[ConsumerKey, int] = {}
        # `keys` of the form (link, queue id) again, a link's as an array of
        # slots by queue id (-1: none), for a CONFIRM frame's queue ids
        # looked up at once (`slots_of`); with how many each holds.
        self._by_link: dict[Any, np.ndarray] = {}
        self._by_link_count: dict[Any, int] = {}
        self._dispatchers: list[QueueDispatcher] = []   # by slot (they live as long as the partition)
        self._owners: list[Any] = []
        self._key_of: list[ConsumerKey | None] = []
        size = _GROW
        self.plain = np.zeros(size, bool)
        self.count = np.zeros(size, np.int64)
        self.bytes = np.zeros(size, np.int64)
        self.max_messages = np.zeros(size, np.int64)
        self.max_bytes = np.zeros(size, np.int64)
        self.pushed = np.zeros(size, np.int64)      # rows taken here, a slot (its dispatcher's `pushed` adds them)
        self.confirmed = np.zeros(size, np.int64)   # and confirmed here
        self._frames: list[_Frame] = []        # in seq order
        self._firsts: np.ndarray | None = None  # their first seqs, cached
        self._by_run: dict[int, _Frame] = {}   # id(first run) -> frame

    # -- slots ----------------------------------------------------------------
    def register(self, dispatcher: "QueueDispatcher", owner: Any = None) -> int:
        """A slot for `dispatcher`; `owner` is what `confirm` names its rows by."""
        slot = len(self._dispatchers)
        self._dispatchers.append(dispatcher)
        self._owners.append(owner)
        self._key_of.append(None)
        if slot >= len(self.plain):
            grow = len(self.plain)
            for name in ("plain", "count", "bytes", "max_messages", "max_bytes", "pushed", "confirmed"):
                old = getattr(self, name)
                setattr(self, name, np.concatenate([old, np.zeros(grow, old.dtype)]))
        return slot

    def set_plain(self, slot: int, key: ConsumerKey | None, max_messages: int = 0, max_bytes: int = 0) -> None:
        """The slot's dispatcher is plain with sole consumer `key` (None: not plain;
        it must hold nothing here then)."""
        old = self._key_of[slot]
        if old is not None and old != key:
            if self.keys.get(old) == slot:
                del self.keys[old]
                self._index(old, -1)
        dispatcher = self._dispatchers[slot]
        if key is None:
            assert not self.count[slot], "a dispatcher left plain with rows in the ledger"
            self.plain[slot] = False
            self._key_of[slot] = None
            dispatcher._plain, dispatcher._plain_as = False, ()
            return
        self.plain[slot] = True
        self._key_of[slot] = key
        self.keys[key] = slot
        self._index(key, slot)
        self.max_messages[slot] = max_messages
        self.max_bytes[slot] = max_bytes
        dispatcher._plain, dispatcher._plain_as = True, (key, max_messages, max_bytes)

    def _index(self, key: ConsumerKey, slot: int) -> None:
        """Keep `_by_link` as `keys` for a key (link, queue id) of a queue id
        under `DENSE_QUEUE_IDS` (others are looked up in `keys` alone);
        `slot` -1: the key is gone."""
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], int)
                and 0 <= key[1] < DENSE_QUEUE_IDS):
            return
        link, queue_id = key
        slots = self._by_link.get(link)
        if slot < 0:
            if slots is None or queue_id >= len(slots) or slots[queue_id] < 0:
                return
            slots[queue_id] = -1
            left = self._by_link_count[link] = self._by_link_count[link] - 1
            if not left:
                del self._by_link[link], self._by_link_count[link]
            return
        if slots is None or queue_id >= len(slots):
            grown = np.full(max(64, 2 * (queue_id + 1)), -1, np.int64)
            if slots is not None:
                grown[:len(slots)] = slots
            slots = self._by_link[link] = grown
        if slots[queue_id] < 0:
            self._by_link_count[link] = self._by_link_count.get(link, 0) + 1
        slots[queue_id] = slot

    def slots_of(self, link: Any, queue_ids: np.ndarray) -> np.ndarray | None:
        """The slot of each key (link, queue id) of these queue ids, as
        `keys` has them; None if one is not there (or not a small id)."""
        slots = self._by_link.get(link)
        if slots is None or not len(queue_ids) or int(queue_ids.max()) >= len(slots) or int(queue_ids.min()) < 0:
            return None
        found = slots[queue_ids]
        return None if (found < 0).any() else found

    def held(self, slot: int) -> tuple[int, int]:
        """Rows and bytes held here for the slot's consumer."""
        return int(self.count[slot]), int(self.bytes[slot])

    # -- rows -----------------------------------------------------------------
    def take(self, slots: np.ndarray, runs: Sequence["MessageRun"], rows: np.ndarray, now_us: int
             ) -> tuple[np.ndarray, np.ndarray]:
        """Rows `rows` of one frame (its runs: one a position) for plain
        slots `slots`, in seq order, none held before: each taken while
        its consumer has room (`_Consumer.has_capacity` before each row),
        and not expired. Returns the positions taken and those left: once a
        slot's row is left, so are its later ones (the caller hands them to
        the dispatcher, after `release`)."""
        n = len(rows)
        if not n:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        order = np.argsort(slots, kind="stable")
        s, r = slots[order], rows[order]
        first = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        lengths = np.diff(np.r_[first, n])
        rank = np.arange(n) - np.repeat(first, lengths)
        frame = self._by_run.get(id(runs[0].guids))
        all_sizes = frame.sizes if frame is not None else np.asarray(runs[0].sizes, np.int64)
        sizes = all_sizes[r]
        spent = np.cumsum(sizes) - sizes
        spent -= np.repeat(spent[first], lengths)     # bytes taken before each row, in its slot
        count_before = self.count[s] + rank
        bytes_before = self.bytes[s] + spent
        limit = self.max_bytes[s]
        ok = (count_before < self.max_messages[s]) & (limit > 0) & ((count_before == 0) | (bytes_before < limit))
        expired = {id(run) for run in set(runs) if run.expires_us and run.expires_us <= now_us}
        if expired:
            ok &= ~np.fromiter((id(runs[i]) in expired for i in order.tolist()), bool, n)
        bad = np.cumsum(~ok)
        ok = (bad - np.repeat(bad[first] - (~ok)[first], lengths)) == 0   # none left before it in its slot
        taken = order[ok]
        if len(taken):
            if frame is None:
                frame = self._new_frame(runs[0], all_sizes)
            self._hold(frame, slots[taken], rows[taken], [runs[i] for i in taken.tolist()], sizes[ok],
                       s[ok])
        taken.sort()
        left = order[~ok]
        left.sort()
        return taken, left

    def _new_frame(self, run: "MessageRun", sizes: np.ndarray) -> _Frame:
        """A frame's entry, made by its first take. Its runs share their
        GUID list (`MessageRun.sharing`), which names it."""
        frame = _Frame(run, sizes, getattr(run, "made_us", 0))
        self._by_run[id(run.guids)] = frame
        if self._frames and self._frames[-1].first > frame.first:
            self._frames.append(frame)
            self._frames.sort(key=lambda f: f.first)
        else:
            self._frames.append(frame)
        self._firsts = None
        return frame

    def _hold(self, frame: _Frame, slots: np.ndarray, rows: np.ndarray, runs: list["MessageRun"],
              sizes: np.ndarray, sorted_slots: np.ndarray) -> None:
        index = {id(run): i for i, run in enumerate(frame.runs)}
        for run in runs:
            if id(run) not in index:
                index[id(run)] = len(frame.runs)
                frame.runs.append(run)
        frame.holder[rows] = slots
        if len(index) > 1:
            frame.run_of[rows] = np.fromiter((index[id(run)] for run in runs), np.int16, len(runs))
        else:
            frame.run_of[rows] = next(iter(index.values()))
        frame.live += len(rows)
        np.add.at(self.count, sorted_slots, 1)
        np.add.at(self.bytes, sorted_slots, sizes)
        np.add.at(self.pushed, sorted_slots, 1)

    def owners(self) -> Sequence[Any]:
        """Each slot's owner (what `register` was given), by slot."""
        return self._owners

    def confirm_slots(self, slots: np.ndarray, starts: np.ndarray, counts: np.ndarray, into: "ConfirmedRows"
                      ) -> tuple[np.ndarray, np.ndarray]:
        """CONFIRMs of plain slots as seq ranges: range i names seqs
        `starts[i]` .. `starts[i] + counts[i] - 1` of slot `slots[i]`'s
        consumer; a seq it does not hold here is skipped. The rows
        confirmed are appended to `into`, grouped by slot; returned, the
        slots in that order and each one's count of them."""
        none = np.zeros(0, np.int64)
        total = int(counts.sum())
        if not total or not self._frames:
            return none, none
        offsets = np.cumsum(counts) - counts
        seqs = np.arange(total, dtype=np.int64) + np.repeat(starts - offsets, counts)
        want = np.repeat(slots, counts)
        frames = self._frames
        if self._firsts is None:
            self._firsts = np.fromiter((f.first for f in frames), np.int64, len(frames))
        at = np.searchsorted(self._firsts, seqs, side="right") - 1
        hit_slots: list[np.ndarray] = []
        hit_seqs: list[np.ndarray] = []
        hit_sizes: list[np.ndarray] = []
        hit_guids: list[list[bytes]] = []
        emptied = False
        for f in np.unique(at[at >= 0]).tolist():
            frame = frames[f]
            mine = at == f
            row = seqs[mine] - frame.first
            inside = row < len(frame.holder)
            row, who = row[inside], want[mine][inside]
            row = np.unique(row[frame.holder[row] == who])   # (a seq named twice is confirmed once)
            if not len(row):
                continue
            holders = frame.holder[row]
            frame.holder[row] = -1
            frame.live -= len(row)
            emptied = emptied or not frame.live
            hit_slots.append(holders)
            hit_seqs.append(row + frame.first)
            hit_sizes.append(frame.sizes[row])
            guids = frame.runs[0].guids
            hit_guids.append([guids[i] for i in row.tolist()])
        if emptied:
            self._drop_empty()
        if not hit_slots:
            return none, none
        slots_hit = np.concatenate(hit_slots)
        order = np.argsort(slots_hit, kind="stable")
        slots_hit = slots_hit[order]
        sizes = np.concatenate(hit_sizes)[order]
        np.subtract.at(self.count, slots_hit, 1)
        np.subtract.at(self.bytes, slots_hit, sizes)
        np.add.at(self.confirmed, slots_hit, 1)
        guids = hit_guids[0] if len(hit_guids) == 1 else [g for part in hit_guids for g in part]
        into.guids.extend([guids[i] for i in order.tolist()])
        into.seqs.extend(np.concatenate(hit_seqs)[order].tolist())
        uniq, per = np.unique(slots_hit, return_counts=True)
        return uniq, per

    def release(self, slots: Sequence[int]) -> None:
        """Move the rows held here for `slots` into their dispatchers'
        consumers, in push order, and mark the slots not plain."""
        wanted = [s for s in slots if self.count[s]]
        if wanted:
            want = np.asarray(wanted, np.int64)
            moved: dict[int, list[tuple[int, tuple[MessageRun, int]]]] = {s: [] for s in wanted}
            emptied = False
            for frame in self._frames:
                rows = np.flatnonzero(np.isin(frame.holder, want)) if len(want) > 1 else \
                    np.flatnonzero(frame.holder == want[0])
                if not len(rows):
                    continue
                holders = frame.holder[rows].tolist()
                run_of = frame.run_of[rows].tolist()
                for row, slot, r in zip(rows.tolist(), holders, run_of):
                    moved[slot].append((frame.first + row, (frame.runs[r], row)))
                frame.holder[rows] = -1
                frame.live -= len(rows)
                emptied = emptied or not frame.live
            if emptied:
                self._drop_empty()
            for slot, entries in moved.items():
                self._dispatchers[slot]._take_held(entries, int(self.bytes[slot]))
                self.count[slot] = 0
                self.bytes[slot] = 0
        for slot in slots:
            if self.plain[slot]:
                self.set_plain(slot, None)

    def seqs_of(self, slot: int) -> list[int]:
        """The seqs held here for the slot's consumer, in push order."""
        if not self.count[slot]:
            return []
        return [f.first + int(row) for f in self._frames for row in np.flatnonzero(f.holder == slot)]

    def stale(self, made_before_us: int) -> list[int]:
        """Slots holding rows of frames made before `made_before_us`
        (`QueueDispatcher.own_frames`: they get copies of their own)."""
        old = [f.holder for f in self._frames if f.made_us < made_before_us]
        if not old:
            return []
        held = np.concatenate(old)
        return [int(s) for s in np.unique(held[held >= 0])]

    def _drop_empty(self) -> None:
        kept = []
        for frame in self._frames:
            if frame.live:
                kept.append(frame)
            else:
                del self._by_run[id(frame.runs[0].guids)]
        self._frames = kept
        self._firsts = None


def take_fresh_held(ledger: Ledger, dispatchers: "Sequence[QueueDispatcher]", runs: "Sequence[MessageRun]",
                    rows: Sequence[int], now_us: int, spilled: "set[QueueDispatcher]",
                    slots: np.ndarray | None = None) -> tuple[list[int], list[ConsumerKey], list[int]]:
    """`take_fresh` with the ledger: the rows of plain dispatchers (each
    row to one of them: not a queue's apps) taken in a few array operations
    (`Ledger.take`), the others by `take_fresh`. The same outcome and the
    same return: positions taken, their consumers, positions left, given
    what the partition guarantees: a row's GUID is not held already. (Its
    GUID history drops a GUID seen in its window, 300 s, before the express
    lane; the ledger holds no row longer than `FRAME_HOLD_S` and a sweep.
    `take_fresh` checks it, as `add_messages` does.) `slots`: each
    dispatcher's `_slot`, if the caller has them."""
    n = len(rows)
    if slots is None:
        slots = np.fromiter((d._slot for d in dispatchers), np.int64, n)
    if not n or (slots < 0).any():
        return take_fresh(dispatchers, runs, rows, now_us, spilled)
    rows_a = np.asarray(rows, np.int64)
    fast = ledger.plain[slots]
    if fast.any():
        if len(np.unique(rows_a)) != n:   # a row of a queue with apps: one dispatcher each
            fast &= np.bincount(rows_a)[rows_a] == 1
        if spilled:
            fast &= ~np.isin(slots, np.fromiter((d._slot for d in spilled), np.int64, len(spilled)))
    held = np.flatnonzero(fast)
    taken = left = np.zeros(0, np.int64)
    keys: list[ConsumerKey] = []
    if len(held):
        went, stayed = ledger.take(slots[held], [runs[i] for i in held.tolist()], rows_a[held], now_us)
        taken, left = held[went], held[stayed]
        key_of = ledger._key_of
        keys = [key_of[s] for s in slots[taken].tolist()]
        if len(left):
            stopped = np.unique(slots[left]).tolist()
            ledger.release(stopped)   # (their rows taken before go first, then these queue behind)
            spilled.update(ledger._dispatchers[s] for s in stopped)
    if len(held) == n:
        return taken.tolist(), keys, left.tolist()
    other = np.flatnonzero(~fast).tolist()
    t2, k2, l2 = take_fresh([dispatchers[i] for i in other], [runs[i] for i in other], [rows[i] for i in other],
                            now_us, spilled)
    if not len(taken):
        return [other[i] for i in t2], k2, sorted([*left.tolist(), *(other[i] for i in l2)])
    positions = np.concatenate([taken, np.asarray([other[i] for i in t2], np.int64)])
    order = np.argsort(positions, kind="stable")
    all_keys = keys + k2
    return positions[order].tolist(), [all_keys[i] for i in order.tolist()], \
        sorted([*left.tolist(), *(other[i] for i in l2)])
