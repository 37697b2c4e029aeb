"""Python's garbage collector in a server process (node, proxy), or in an
application that moves many messages a second (`taproot.tune_gc`, which the
bench's load generator calls).

With the interpreter's defaults (a young collection every 700 net
allocations, older generations scanned as their survivors pile up) the node
spent 10% of its CPU in collections with one queue and a third of it with
10,000 queues (per-message PUTs, `taproot bench --scenario queues`): full
collections of 36 ms of CPU on average with one queue, up to 205 ms with
10,000, every thread of the node stopped meanwhile (`docs/benchmarks.md`,
"The garbage collector"). A message's objects live from its PUT to its CONFIRM,
milliseconds to seconds: at 700 allocations they survived two young
collections and were promoted, and the old generation then filled up with
objects that were about to die anyway, and scanned everything, the
process's startup objects (modules, functions, classes) included, each time
it did.

So, once a server has started: one full collection, then `gc.freeze()`
(what is alive now, the code and the startup state, is never scanned
again; objects still die by reference count as always), and thresholds
that let short-lived objects die young: a young collection every
`YOUNG_THRESHOLD` net allocations, a full one only after `OLD_THRESHOLD`
middle ones (and, as always, only once the old generation's new survivors
are a quarter of it). Reference cycles are still collected, later.
`GcWatch` counts the collections and their CPU time; the server logs them
when it stops.
"""

from __future__ import annotations

import gc
import time
from typing import Any

YOUNG_THRESHOLD = 10_000
MIDDLE_THRESHOLD = 10
OLD_THRESHOLD = 100


class GcWatch:
    """Collections per generation: how many, their CPU time (the thread's,
    so a collection preempted by other processes is not counted longer
    than it ran) and the longest."""

    def __init__(self) -> None:
        self._started = 0.0
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]

    def install(self) -> "GcWatch":
        gc.callbacks.append(self._callback)
        return self

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Runs with the GIL held, inside whatever allocation triggered the
        # collection: no locks, no logging.
        if phase == "start":
            self._started = time.thread_time()
            return
        took = time.thread_time() - self._started
        generation = info["generation"]
        self.counts[generation] += 1
        self.seconds[generation] += took
        if took > self.longest[generation]:
            self.longest[generation] = took

    def describe(self) -> str:
        return "; ".join(f"generation {g}: {self.counts[g]} collections, {self.seconds[g] * 1000:.0f} ms "
                         f"(longest {self.longest[g] * 1000:.1f} ms)" for g in range(3))


def settle_for_serving() -> GcWatch:
    """Freeze what the process has built so far and set the thresholds
    above; returns the watch counting collections from now on."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
    return GcWatch().install()
