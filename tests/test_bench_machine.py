"""The bench's gauge of how fast the shared host let the cores run
(`taproot_ops.bench.machine`): its summary, its sampling thread, and its
place in a run's result, its printout and `--repeat`'s spread (unit)."""

from __future__ import annotations

import json
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
        pass
    assert time.monotonic() - started < 5 and not s._thread.is_alive() and s.samples == [1.0]
    assert "machine-probe" not in [t.name for t in threading.enumerate()]


def test_each_run_reports_the_machines_speed_and_repeat_puts_it_in_the_spread(tmp_path, monkeypatch, capsys):
    from taproot_ops import bench, cli
    from taproot_ops.bench import runner

    # Each run's samples: the first run's all fast, the second's half slow.
    runs = iter([[1.5, 1.5, 1.6, 1.5], [1.5, 3.0, 1.5, 3.0]])
    current: list[float] = []

    def run(system, address, scenario, **kw):
        deadline = time.monotonic() + 5
        while len(sampled) < len(current) and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"system": system, "scenario": scenario.name, "label": scenario.name, "posted": 10, "acked": 10,
                "failed": {}, "received": 10, "expected_received": 10, "produce_msg_s": 1.0, "consume_msg_s": 1.0,
                "ack_ms": {"p50": None}, "push_ms": {"p50": None}}

    sampled: list[float] = []

    def work():
        value = current[len(sampled)] if len(sampled) < len(current) else current[0]   # then fast again
        sampled.append(value)
        return value

    def sampler(*a, **kw):
        current[:] = next(runs)
        sampled.clear()
        return machine_sampler(every_s=0.001, work=work)

    machine_sampler = machine.Sampler
    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(bench.machine, "Sampler", sampler)
    monkeypatch.setattr(bench, "plot", lambda result, path, title: open(path, "w").close())
    monkeypatch.setattr(bench, "_run_taproot",
                        lambda scenarios, args, out_dir: bench.run_system("taproot", "x", scenarios, args, out_dir))
    args = cli.build_parser().parse_args(["bench", "--scenario", "priority-1q", "--repeat", "2",
                                          "--out", str(tmp_path)])
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "results.json").read_text())
    assert [r["machine"]["fastest_ms"] for r in report["runs"]] == [1.5, 1.5]
    first, second = (r["machine"] for r in report["runs"])
    # The sampler may take a fast sample or two more before the run's end is noticed.
    assert first["slow_share"] == 0.0 and second["slow_share"] == 2 / second["samples"] and second["samples"] >= 4
    assert f"machine speed: 0% of {first['samples']} samples in the slow state" in out
    assert f"machine speed: {second['slow_share'] * 100:.0f}% of {second['samples']} samples" in out
    first, second = first["slow_share"], second["slow_share"]
    values = report["spread"][0]["figures"]["machine slow %"]["values"]
    assert values == [first * 100, second * 100]
