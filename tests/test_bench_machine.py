"""The bench's gauge of how fast the shared host let the cores run
(`taproot_ops.bench.machine`): its summary and its sampling thread (unit;
its place in a run's result, printout and spread is in `test_bench.py`)."""

from __future__ import annotations

import threading
import time

import pytest

from taproot_ops.bench import machine

pytestmark = pytest.mark.unit


def test_the_summary_counts_the_samples_in_the_slow_state_against_the_runs_fastest():
    s = machine.summary([2.0, 2.2, 4.0, 2.0, 3.0, 2.69])
    # 1.35x the fastest (2.0) is 2.7: 4.0 and 3.0 are slow, 2.69 is not.
    assert s["samples"] == 6 and s["fastest_ms"] == 2.0 and s["median_ms"] == pytest.approx(2.445)
    assert s["slow_share"] == pytest.approx(2 / 6)
    assert s["mean_vs_fastest"] == pytest.approx((2.0 + 2.2 + 4.0 + 2.0 + 3.0 + 2.69) / 6 / 2.0)
    assert machine.summary([1.5] * 4)["slow_share"] == 0.0
    assert machine.summary([]) is None
    assert "series" not in s


def test_the_fixed_work_is_timed_by_the_clock_it_is_given():
    ticks = iter([10.0, 10.004])
    assert machine.work_ms(lambda: next(ticks)) == pytest.approx(4.0)
    assert machine.work_ms() > 0   # the thread's own CPU clock


def test_the_sampler_samples_at_once_then_every_period_until_it_is_left():
    periods = []

    def wait(event, seconds):
        periods.append(seconds)
        return len(periods) == 3     # stopped after the third wait

    values, clock = iter([1.0, 2.0, 3.0, 4.0]), iter([100.0, 100.5, 101.0, 101.5])
    with machine.Sampler(every_s=0.5, work=lambda: next(values), wait=wait, now=lambda: next(clock)) as s:
        s._thread.join(5)
    assert s.samples == [1.0, 2.0, 3.0] and periods == [0.5, 0.5, 0.5]
    # Each sample with when it began, for the run's per-second series.
    assert s.summary()["series"] == [[100.0, 1.0], [100.5, 2.0], [101.0, 3.0]]


def test_leaving_the_sampler_stops_its_thread_without_waiting_out_the_period():
    started = time.monotonic()
    with machine.Sampler(every_s=60.0, work=lambda: 1.0) as s:
        assert s._thread.is_alive()   # waiting out its 60 s period
    assert time.monotonic() - started < 5 and not s._thread.is_alive() and s.samples == [1.0]
    assert "machine-probe" not in [t.name for t in threading.enumerate()]
