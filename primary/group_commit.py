"""Group commit: many PUT (or CONFIRM) batches become one Delta commit.

`GroupPolicy` is the pure part: given what is waiting and the time, it says
whether to commit now. `GroupCommitter` is the thread shell: producers
`submit()` lists of items; one thread takes everything waiting (while a commit
runs, the next group builds up, which is what makes group commit efficient),
commits it through `commit_fn`, and calls `commit_fn`'s owner back.

The number of items waiting is bounded (`pending_max`): `submit` returns False
beyond it and the caller NACKs with LIMIT_MESSAGES instead of growing memory.

A busy process lingers longer (`GroupPolicy.busy_linger_ms`): each commit
costs the node a few milliseconds of CPU whatever its size, so when the
process is spending most of a core (`CpuLoad`) and PUTs keep arriving while
commits run (streaming or many producers, not one producer waiting for each
ACK, whose next PUT only comes after its ACK), fewer, larger commits leave
more CPU for everything else, and the queues behind the GIL shorten by more
than the linger adds.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

from protocol.clock import Clock, MonotonicClock
from protocol.metrics import LATENCY_BUCKETS, SIZE_BUCKETS, WeightedHistogram

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupPolicy:
    max_items: int
    max_bytes: int
    linger_ms: int
    # A group of this many items does not linger: the linger lets single
    # PUTs of many producers share a commit, and a producer's frame of this
    # many rows is a batch already. None: always linger.
    eager_items: int | None = None
    # The linger while the process is busy and items arrive during commits
    # (the module's docstring); no longer than `linger_ms` means never.
    busy_linger_ms: int = 0

    def linger(self, busy: bool) -> int:
        """How long a group's first item may wait, busy or not."""
        return max(self.linger_ms, self.busy_linger_ms) if busy else self.linger_ms

    def should_commit(self, items: int, nbytes: int, oldest_wait_ms: float, busy: bool = False) -> bool:
        if items == 0:
            return False
        return (items >= self.max_items or nbytes >= self.max_bytes or oldest_wait_ms >= self.linger(busy)
                or (self.eager_items is not None and items >= self.eager_items))


class CpuLoad:
    """Whether this process is busy: the CPU it used (every thread, user and
    system) over the last window of at least `WINDOW_S` of wall time, as a
    fraction of one core, with hysteresis: busy from `ENTER` up, then until
    it is under `LEAVE`. A Python process's threads share one GIL, so most
    of one core is what saturation looks like. The clocks are injectable
    (tests); a window is only closed when asked, so a long quiet spell ends
    in a long window of little use, and not busy."""

    WINDOW_S = 0.5
    ENTER = 0.75
    LEAVE = 0.5

    def __init__(self, cpu_s: Callable[[], float] = time.process_time,
                 wall_s: Callable[[], float] = time.monotonic) -> None:
        self._cpu_s, self._wall_s = cpu_s, wall_s
        self._since, self._cpu_at = wall_s(), cpu_s()
        self._busy = False

    def busy(self) -> bool:
        now = self._wall_s()
        elapsed = now - self._since
        if elapsed >= self.WINDOW_S:
            cpu = self._cpu_s()
            used = (cpu - self._cpu_at) / elapsed
            self._busy = used >= (self.LEAVE if self._busy else self.ENTER)
            self._since, self._cpu_at = now, cpu
        return self._busy


class GroupCommitter(Generic[T]):
    def __init__(self, name: str, commit_fn: Callable[[list[T]], None], policy: GroupPolicy,
                 pending_max: int, clock: Clock | None = None, load: CpuLoad | None = None):
        self.name = name
        self._commit_fn = commit_fn
        self._policy = policy
        self._pending_max = pending_max
        self._clock = clock or MonotonicClock()
        self._cond = threading.Condition()
        self._items: list[T] = []
        self._count = 0
        self._bytes = 0
        self._oldest_ms = 0.0
        self._stopping = False
        self._committing = False
        self._taken = 0      # the messages of the group being committed
        self._load = load if load is not None else CpuLoad() if policy.busy_linger_ms > policy.linger_ms else None
        # Items were submitted while the last commit ran (they were waiting
        # when it ended): PUTs that do not wait for the ACKs before them.
        self._arrived_during = False
        self.linger_ms = policy.linger_ms   # the linger the last group was given (metrics)
        # Each group's size in messages and its commit's duration (metrics).
        self.sizes = WeightedHistogram(SIZE_BUCKETS)
        self.seconds = WeightedHistogram(LATENCY_BUCKETS)
        self._thread = threading.Thread(target=self._run, name=f"commit-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def stopping(self) -> bool:
        """`stop` was called: nothing more is taken."""
        return self._stopping

    def submit(self, items: Sequence[T], nbytes: int, count: int | None = None) -> bool:
        """`count`: the messages the items stand for (one item may carry a
        frame's worth), for the policy and the bound; one per item by default."""
        count = len(items) if count is None else count
        with self._cond:
            if self._stopping or self._count + count > self._pending_max:
                return False
            if not self._items:
                self._oldest_ms = self._clock.now_ms()
            self._items.extend(items)
            self._count += count
            self._bytes += nbytes
            self._cond.notify()
        return True

    @property
    def idle(self) -> bool:
        """Nothing waiting and no commit running (every item answered)."""
        with self._cond:
            return not self._items and not self._committing

    def stop(self, timeout_s: float = 30.0) -> None:
        """Commit what is waiting, then stop."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _busy(self) -> bool:
        """Linger as a busy process does (the module's docstring)?"""
        return self._arrived_during and self._load is not None and self._load.busy()

    def _take(self) -> list[T] | None:
        with self._cond:
            while True:
                waited = self._clock.now_ms() - self._oldest_ms if self._items else 0.0
                busy = False
                if self._items:
                    busy = self._busy()
                    self.linger_ms = self._policy.linger(busy)
                if self._policy.should_commit(self._count, self._bytes, waited, busy) or (
                        self._stopping and self._items):
                    self._taken = self._count
                    items, self._items, self._bytes, self._count = self._items, [], 0, 0
                    self._committing = True
                    return items
                if self._stopping:
                    return None
                timeout = None if not self._items else max(0.0, (self.linger_ms - waited) / 1000)
                self._cond.wait(timeout)

    def _run(self) -> None:
        while True:
            items = self._take()
            if items is None:
                return
            # commit_fn reports failures to the items' owners itself (NACK with
            # STORAGE_FAILURE); an exception escaping it is a bug, but the
            # thread must survive it or every later PUT would go unanswered.
            started = time.perf_counter()
            try:
                self._commit_fn(items)
                self.seconds.observe(time.perf_counter() - started)
                self.sizes.observe(self._taken)
            except Exception:  # pragma: no cover - defensive
                log.exception("group commit %s: commit function raised", self.name)
            finally:
                with self._cond:
                    self._committing = False
                    self._arrived_during = bool(self._items)
