"""How fast this machine's cores ran during a run.

This machine is a two-core VM on a shared host, and its cores change speed
under it. A fixed piece of interpreter work, timed back to back on one vCPU
with nothing of ours running, took either about 1.5 ms or 2.6-3.0 ms of
CPU: two states, 1.6-1.9x apart, switching every few milliseconds to every
half second (slow spells of 2-174 ms in 6 s). Both vCPUs do it, and windows
with the other vCPU kept busy by us had as many slow samples as idle ones,
so the slow state comes from outside the VM (perhaps another tenant on the
same physical core; there are no hardware counters here to show it).
In a minute with many slow spells every process of ours needs more CPU for
the same messages, and a commit caught in one is late by a good part of it
(`docs/benchmarks.md`, thirtieth session).

So the bench times that work (`work_ms`, on its own thread's CPU clock: time
spent waiting for a core does not count, only how long the work took once it
ran) every `EVERY_S` during each run, and reports the share of the samples
that ran in the slow state (`SLOW_RATIO` times the fastest sample of the run
or more) and their mean against the fastest. It is printed with each run and
written to its result (`machine`), and `--repeat` shows it beside each run's
figures, so a reader can tell a slow window from a slow change.

The samples share the cores with the run: about 1.5-3 ms of CPU every
0.2 s, under 1.5% of one core.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Callable

EVERY_S = 0.2          # a sample every this many seconds
LOOPS = 20_000         # about 1.5 ms of CPU in the fast state, 2.6-3.0 in the slow one
SLOW_RATIO = 1.35      # a sample this many times the run's fastest or more ran in the slow state

Clock = Callable[[], float]


def work_ms(clock: Clock = time.thread_time) -> float:
    """CPU ms of a fixed loop of interpreter work: integer arithmetic and
    dictionary stores."""
    started = clock()
    table: dict[int, int] = {}
    total = 0
    for i in range(LOOPS):
        total += (i * 3) ^ (i >> 2)
        table[i & 1023] = total
    return (clock() - started) * 1000


class Sampler:
    """`work_ms` every `every_s` on a thread of its own while in use
    (`with Sampler() as s:`), the first at once; `samples` holds them in
    order. `work` and `wait` are injectable (tests)."""

    def __init__(self, every_s: float = EVERY_S, work: Callable[[], float] = work_ms,
                 wait: Callable[[threading.Event, float], bool] = lambda event, s: event.wait(s),
                 now: Clock = time.time):
        self.every_s = every_s
        self.samples: list[float] = []
        self.times: list[float] = []   # when each sample began (`now`: the wall clock, as a run's start_s)
        self._now = now
        self._work, self._wait = work, wait
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="machine-probe", daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = self._now()
            self.samples.append(self._work())
            self.times.append(began)
            if self._wait(self._stop, self.every_s):
                return

    def summary(self) -> dict[str, Any] | None:
        return summary(self.samples, self.times)


def summary(samples: list[float], times: list[float] | None = None) -> dict[str, Any] | None:
    """The run's samples: how many, the fastest and the median (ms), the
    share in the slow state, and their mean against the fastest (1.0: the
    whole run at full speed); with their `times`, each sample as [when
    (the wall clock, s), ms], to set beside the run's per-second series.
    None without samples."""
    if not samples:
        return None
    fastest = min(samples)
    out: dict[str, Any] = {
        "samples": len(samples), "fastest_ms": fastest, "median_ms": statistics.median(samples),
        "slow_share": sum(s >= fastest * SLOW_RATIO for s in samples) / len(samples),
        "mean_vs_fastest": statistics.fmean(samples) / fastest if fastest > 0 else 1.0}
    if times is not None:
        out["series"] = [[round(t, 3), round(ms, 4)] for t, ms in zip(times, samples)]
    return out


def fmt(machine: dict[str, Any]) -> str:
    """A run's `machine` figures as one line for the terminal."""
    return (f"machine speed: {machine['slow_share'] * 100:.0f}% of {machine['samples']:,} samples in the slow "
            f"state ({SLOW_RATIO:g}x the fastest or more); fixed work {machine['mean_vs_fastest']:.2f}x its "
            f"fastest time on average ({machine['fastest_ms']:.2f} ms) (taproot_ops/bench/machine.py)")
