"""The asyncio side of the peer drivers: pacing, windows, recording.

A driver supplies, per client, an async `publish(payload)` that returns an
awaitable completed on the broker's acknowledgement, and a consumer that
calls `Recorder.received(payload)` then acknowledges. Up to `scenario.window`
publishes are unacknowledged per producer, as in every system's driver."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from taproot_ops.bench.report import Samples
from taproot_ops.bench.runner import Shared, pacing_delay, payload_factory, push_latency_ms
from taproot_ops.bench.scenarios import Scenario


async def wait_start(shared: Shared) -> float:
    while shared.start_at.value == 0:
        await asyncio.sleep(0.01)
    start = float(shared.start_at.value)
    await asyncio.sleep(max(0.0, start - time.time()))
    return start


async def produce(scenario: Scenario, shared: Shared,
                  publish: Callable[[bytes], Awaitable[Awaitable[Any]]]) -> dict[str, Any]:
    """Publish for `scenario.duration_s`; return the ACK samples and counts."""
    rate_each = scenario.rate / (scenario.queues * scenario.producers) if scenario.rate else 0.0
    make = payload_factory(scenario.size)
    acks = Samples()
    failed: dict[str, int] = {}
    window = asyncio.Semaphore(scenario.window)
    pending = [0, 0]
    tasks: set[asyncio.Task[None]] = set()

    async def settle(confirm: Awaitable[Any], sent_ns: int) -> None:
        try:
            await confirm
            acks.add(time.time(), (time.perf_counter_ns() - sent_ns) / 1e6)
            pending[0] += 1
        except Exception as exc:  # noqa: BLE001 - counted by kind, like a Taproot failed ACK
            failed[type(exc).__name__] = failed.get(type(exc).__name__, 0) + 1
            pending[1] += 1
        finally:
            window.release()

    start = await wait_start(shared)
    stop = start + scenario.duration_s
    began, posted, last_report = time.perf_counter(), 0, time.monotonic()
    while time.time() < stop:
        if rate_each:
            delay = pacing_delay(began, posted, rate_each, time.perf_counter())
            if delay:
                await asyncio.sleep(delay)
        await window.acquire()
        sent_ns = time.perf_counter_ns()
        confirm = await publish(make())
        task = asyncio.ensure_future(settle(confirm, sent_ns))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        posted += 1
        if time.monotonic() - last_report > 0.25:
            shared.add_progress(acked=pending[0], failed=pending[1])
            pending[0] = pending[1] = 0
            last_report = time.monotonic()
    if tasks:
        done, not_done = await asyncio.wait(tasks, timeout=300)
        for _ in not_done:
            failed["NO_ACK_IN_300_S"] = failed.get("NO_ACK_IN_300_S", 0) + 1
    shared.add_progress(acked=pending[0], failed=pending[1])
    return {"acks": acks, "posted": posted, "failed": failed}


class Recorder:
    """One consumer's receipts; knows when it may stop."""

    def __init__(self, scenario: Scenario, shared: Shared, queue: int):
        self.scenario, self.shared, self.queue = scenario, shared, queue
        self.pushes = Samples()
        self.last = time.monotonic()
        self.unreported = 0
        self.last_report = time.monotonic()

    def received(self, payload: bytes) -> None:
        self.pushes.add(time.time(), push_latency_ms(payload, time.time_ns()))
        self.last = time.monotonic()
        self.unreported += 1
        if self.last - self.last_report > 0.25:
            self.report()

    def report(self) -> None:
        if self.unreported:
            self.shared.add_received(self.queue, self.unreported)
            self.unreported = 0
        self.last_report = time.monotonic()

    async def until_done(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            self.report()
            if self.shared.consumer_done(self.queue, len(self.pushes), self.scenario.copies,
                                         time.monotonic() - self.last):
                return


def mark_ready(shared: Shared) -> None:
    with shared.ready.get_lock():
        shared.ready.value += 1
