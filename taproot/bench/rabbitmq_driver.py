"""RabbitMQ clients for `taproot bench --compare` (pika, asynchronous
SelectConnection: one connection and I/O loop per client thread).

- priority: one durable quorum queue per Taproot queue; persistent messages.
- fanout: a fanout exchange bound to one quorum queue per app.
- broadcast: a fanout exchange; each consumer binds its own exclusive,
  transient queue (like BlazingMQ broadcast: no storage, only who is there).
Publisher confirms with up to `batch` unconfirmed per producer, manual
consumer acks, prefetch equal to Taproot's consumer window.

pika's asynchronous API, not aio-pika: aio-pika's per-publish tasks capped a
producer at about 1,700 msg/s on this machine, pika's callbacks at about
16,000; the slower client would have tuned the peer down.
"""

from __future__ import annotations

import collections
import threading
import time

import pika

from taproot.bench.report import Samples
from taproot.bench.runner import Shared, merge_consumers, merge_producers, payload_factory, push_latency_ms
from taproot.bench.scenarios import Scenario
from taproot.bench.taproot_driver import CONSUMER_WINDOW

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


def _connect(address: str, on_channel) -> pika.SelectConnection:
    """A connection whose I/O loop ends when it closes (or fails to open)."""
    def stop(connection, *_reason) -> None:
        connection.ioloop.stop()
    return pika.SelectConnection(_params(address), on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                 on_open_error_callback=stop, on_close_callback=stop)


def _in_threads(clients, target) -> list:
    outs: list = [None] * len(clients)
    errors: list[BaseException] = []

    def run(i, client):
        try:
            outs[i] = target(*client)
        except BaseException as exc:
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return outs


def run_producers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict:
    rate_each = scenario.rate / (scenario.queues * scenario.producers) if scenario.rate else 0.0
    mode = 1 if scenario.mode == "broadcast" else 2  # transient / persistent

    def producer(q: int, _n: int) -> tuple[int, dict]:
        exchange, queues = _names(scenario, q)
        routing_key = queues[0] if scenario.mode == "priority" else ""
        make = payload_factory(scenario.size)
        props = pika.BasicProperties(delivery_mode=mode)
        acks = Samples()
        failed: dict[str, int] = {}
        inflight: collections.deque = collections.deque()  # (delivery tag, sent ns)
        state = {"tag": 0, "posted": 0, "stop": 0.0, "began": 0.0, "pending": [0, 0], "report": 0.0}

        def settle(tag: int, multiple: bool, ok: bool) -> None:
            now_ns, now_s = time.perf_counter_ns(), time.time()
            while inflight and (inflight[0][0] <= tag if multiple else inflight[0][0] == tag):
                _, sent_ns = inflight.popleft()
                if ok:
                    acks.add(now_s, (now_ns - sent_ns) / 1e6)
                    state["pending"][0] += 1
                else:
                    failed["NACK"] = failed.get("NACK", 0) + 1
                    state["pending"][1] += 1
            if not multiple and inflight and inflight[0][0] < tag:  # out-of-order single ack: find it
                for i, (t, sent_ns) in enumerate(inflight):
                    if t == tag:
                        del inflight[i]
                        if ok:
                            acks.add(now_s, (now_ns - sent_ns) / 1e6)
                            state["pending"][0] += 1
                        break

        def on_confirm(frame) -> None:
            method = frame.method
            settle(method.delivery_tag, method.multiple, isinstance(method, pika.spec.Basic.Ack))
            pump()

        def pump() -> None:
            now = time.time()
            if time.monotonic() - state["report"] > 0.25:
                shared.add_progress(acked=state["pending"][0], failed=state["pending"][1])
                state["pending"] = [0, 0]
                state["report"] = time.monotonic()
            if now >= state["stop"]:
                if not inflight:
                    connection.close()
                return
            while len(inflight) < scenario.batch and time.time() < state["stop"]:
                if rate_each:
                    due = state["began"] + state["posted"] / rate_each
                    delay = due - time.perf_counter()
                    if delay > 0:
                        connection.ioloop.call_later(delay, pump)
                        return
                state["tag"] += 1
                inflight.append((state["tag"], time.perf_counter_ns()))
                channel.basic_publish(exchange, routing_key, make(), props)
                state["posted"] += 1
            if time.time() >= state["stop"] and not inflight:
                connection.close()
            elif time.time() >= state["stop"]:
                connection.ioloop.call_later(0.05, pump)

        def on_channel(ch) -> None:
            nonlocal channel
            channel = ch
            ch.confirm_delivery(on_confirm)
            threading.Thread(target=wait_start, daemon=True).start()

        def wait_start() -> None:
            while shared.start_at.value == 0:
                time.sleep(0.01)
            start = shared.start_at.value
            time.sleep(max(0.0, start - time.time()))
            state["stop"] = start + scenario.duration_s
            state["began"] = time.perf_counter()
            connection.ioloop.add_callback_threadsafe(pump)

        channel = None
        connection = _connect(address, on_channel)
        connection.ioloop.start()
        shared.add_progress(acked=state["pending"][0], failed=state["pending"][1])
        for _ in inflight:
            failed["NO_CONFIRM"] = failed.get("NO_CONFIRM", 0) + 1
        return q, {"acks": acks, "posted": state["posted"], "failed": failed}

    return merge_producers(_in_threads(clients, producer))


def run_consumers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict:
    def consumer(q: int, n: int) -> Samples:
        exchange, queues = _names(scenario, q)
        pushes = Samples()
        state = {"last": time.monotonic(), "unreported": 0, "report": time.monotonic()}

        def report() -> None:
            if state["unreported"]:
                shared.add_progress(received=state["unreported"])
                with shared.received.get_lock():
                    shared.received[q] += state["unreported"]
                state["unreported"] = 0
            state["report"] = time.monotonic()

        def on_message(ch, method, _props, body) -> None:
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

        def consume(ch, queue: str) -> None:
            ch.basic_consume(queue, on_message, auto_ack=False)
            with shared.ready.get_lock():
                shared.ready.value += 1
            connection.ioloop.call_later(0.1, check)

        def on_channel(ch) -> None:
            def qos_ok(_frame) -> None:
                if scenario.mode == "broadcast":
                    def declared(frame) -> None:
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

    return merge_consumers(_in_threads(clients, consumer))
