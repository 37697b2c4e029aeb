"""RabbitMQ clients for `taproot bench --compare` (pika, asynchronous
SelectConnection: one connection and I/O loop per client thread).

- priority: one durable quorum queue per Taproot queue; persistent messages.
- fanout: a fanout exchange bound to one quorum queue per app.
- broadcast: a fanout exchange; each consumer binds its own exclusive,
  transient queue (like BlazingMQ broadcast: no storage, only who is there).
Publisher confirms with up to `window` unconfirmed per producer, manual
consumer acks, prefetch equal to Taproot's consumer window.

pika's asynchronous API, not aio-pika: aio-pika's per-publish tasks capped a
producer at about 1,700 msg/s on this machine, pika's callbacks at about
16,000; the slower client would have tuned the peer down.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

import pika

from taproot_ops.bench.report import Samples
from taproot_ops.bench.runner import (
    Shared,
    in_threads,
    merge_consumers,
    merge_producers,
    pacing_delay,
    payload_factory,
    push_latency_ms,
)
from taproot_ops.bench.scenarios import Scenario
from taproot_ops.bench.taproot_driver import CONSUMER_WINDOW

QUORUM = {"x-queue-type": "quorum"}


def _params(address: str) -> pika.ConnectionParameters:
    host, port = address.rsplit(":", 1)
    return pika.ConnectionParameters(host, int(port), heartbeat=0)


def _names(scenario: Scenario, queue: int) -> tuple[str, list[str]]:
    """(exchange, queues); the exchange is "" (default) in priority mode."""
    base = f"bench-{scenario.name}-q{queue}"
    if scenario.mode == "priority":
        return "", [base]
    if scenario.mode == "fanout":
        return base, [f"{base}-app{j}" for j in range(scenario.consumers)]
    return base, []


def prepare(address: str, scenario: Scenario) -> None:
    connection = pika.BlockingConnection(_params(address))
    try:
        channel = connection.channel()
        for q in range(scenario.queues):
            exchange, queues = _names(scenario, q)
            if exchange:
                channel.exchange_declare(exchange, "fanout", durable=True)
            for name in queues:
                channel.queue_delete(name)
                channel.queue_declare(name, durable=True, arguments=QUORUM)
                if exchange:
                    channel.queue_bind(name, exchange)
    finally:
        connection.close()


def _connect(address: str, on_channel: Callable[[Any], None]) -> pika.SelectConnection:
    """A connection whose I/O loop ends when it closes (or fails to open)."""
    def stop(connection: Any, *_reason: Any) -> None:
        connection.ioloop.stop()
    return pika.SelectConnection(_params(address), on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                 on_open_error_callback=stop, on_close_callback=stop)


class _Producer:
    """One producer: publishes on its I/O loop, up to `window` unconfirmed."""

    def __init__(self, address: str, scenario: Scenario, shared: Shared, q: int, rate_each: float):
        self.scenario, self.shared, self.rate_each = scenario, shared, rate_each
        self.exchange, queues = _names(scenario, q)
        self.routing_key = queues[0] if scenario.mode == "priority" else ""
        self.make = payload_factory(scenario.size)
        self.props = pika.BasicProperties(delivery_mode=1 if scenario.mode == "broadcast" else 2)
        self.acks = Samples()
        self.failed: dict[str, int] = {}
        self.inflight: collections.deque[tuple[int, int]] = collections.deque()  # (delivery tag, sent ns)
        self.tag = self.posted = 0
        self.stop_at = self.began = 0.0
        self.unreported = [0, 0]  # acked, failed
        self.reported_at = 0.0
        self.channel = None
        self.connection = _connect(address, self._on_channel)

    def _on_channel(self, channel: Any) -> None:
        self.channel = channel
        channel.confirm_delivery(self._on_confirm)
        threading.Thread(target=self._wait_start, daemon=True).start()

    def _wait_start(self) -> None:
        while self.shared.start_at.value == 0:
            time.sleep(0.01)
        start = self.shared.start_at.value
        time.sleep(max(0.0, start - time.time()))
        self.stop_at, self.began = start + self.scenario.duration_s, time.perf_counter()
        self.connection.ioloop.add_callback_threadsafe(self._pump)

    def _settle(self, tag: int, multiple: bool, ok: bool) -> None:
        now_ns, now_s = time.perf_counter_ns(), time.time()
        done = []
        if multiple:
            while self.inflight and self.inflight[0][0] <= tag:
                done.append(self.inflight.popleft())
        else:
            for i, item in enumerate(self.inflight):
                if item[0] == tag:
                    done.append(item)
                    del self.inflight[i]
                    break
        for _, sent_ns in done:
            if ok:
                self.acks.add(now_s, (now_ns - sent_ns) / 1e6)
                self.unreported[0] += 1
            else:
                self.failed["NACK"] = self.failed.get("NACK", 0) + 1
                self.unreported[1] += 1

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        self._settle(method.delivery_tag, method.multiple, isinstance(method, pika.spec.Basic.Ack))
        self._pump()

    def _pump(self) -> None:
        if time.monotonic() - self.reported_at > 0.25:
            self.shared.add_progress(acked=self.unreported[0], failed=self.unreported[1])
            self.unreported = [0, 0]
            self.reported_at = time.monotonic()
        assert self.channel is not None
        while len(self.inflight) < self.scenario.window and time.time() < self.stop_at:
            if self.rate_each:
                delay = pacing_delay(self.began, self.posted, self.rate_each, time.perf_counter())
                if delay:
                    self.connection.ioloop.call_later(delay, self._pump)
                    return
            self.tag += 1
            self.inflight.append((self.tag, time.perf_counter_ns()))
            self.channel.basic_publish(self.exchange, self.routing_key, self.make(), self.props)
            self.posted += 1
        if time.time() >= self.stop_at and not self.inflight:
            self.connection.close()  # every publish confirmed: the I/O loop ends


def run_producers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict[str, Any]:
    rate_each = scenario.rate / (scenario.queues * scenario.producers) if scenario.rate else 0.0

    def producer(q: int, _n: int) -> tuple[int, dict[str, Any]]:
        run = _Producer(address, scenario, shared, q, rate_each)
        run.connection.ioloop.start()
        shared.add_progress(acked=run.unreported[0], failed=run.unreported[1])
        for _ in run.inflight:
            run.failed["NO_CONFIRM"] = run.failed.get("NO_CONFIRM", 0) + 1
        return q, {"acks": run.acks, "posted": run.posted, "failed": run.failed}

    return merge_producers(in_threads(clients, producer))


def run_consumers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict[str, Any]:
    def consumer(q: int, n: int) -> Samples:
        exchange, queues = _names(scenario, q)
        pushes = Samples()
        state = {"last": time.monotonic(), "unreported": 0.0, "report": time.monotonic()}

        def report() -> None:
            if state["unreported"]:
                shared.add_received(q, int(state["unreported"]))
                state["unreported"] = 0
            state["report"] = time.monotonic()

        def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
            pushes.add(time.time(), push_latency_ms(body, time.time_ns()))
            ch.basic_ack(method.delivery_tag)
            state["last"] = time.monotonic()
            state["unreported"] += 1
            if state["last"] - state["report"] > 0.25:
                report()

        def check() -> None:
            report()
            if shared.consumer_done(q, len(pushes), scenario.copies, time.monotonic() - state["last"]):
                connection.close()
            else:
                connection.ioloop.call_later(0.1, check)

        def consume(ch: Any, queue: str) -> None:
            ch.basic_consume(queue, on_message, auto_ack=False)
            with shared.ready.get_lock():
                shared.ready.value += 1
            connection.ioloop.call_later(0.1, check)

        def on_channel(ch: Any) -> None:
            def qos_ok(_frame: Any) -> None:
                if scenario.mode == "broadcast":
                    def declared(frame: Any) -> None:
                        name = frame.method.queue
                        ch.queue_bind(name, exchange, callback=lambda _f: consume(ch, name))
                    ch.queue_declare("", exclusive=True, auto_delete=True, callback=declared)
                else:
                    consume(ch, queues[n] if scenario.mode == "fanout" else queues[0])
            ch.basic_qos(prefetch_count=CONSUMER_WINDOW, callback=qos_ok)

        connection = _connect(address, on_channel)
        connection.ioloop.start()
        report()
        return pushes

    return merge_consumers(in_threads(clients, consumer))
