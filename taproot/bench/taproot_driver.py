"""Taproot clients for `taproot bench`: one Session per producer or consumer."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from taproot.batching import BatchPolicy
from taproot.bench.report import Samples
from taproot.bench.runner import Shared, in_threads, merge_consumers, merge_producers, payload_factory, push_latency_ms
from taproot.bench.scenarios import Scenario
from taproot.session import Session

CONSUMER_WINDOW = 10_000  # max unconfirmed messages per consumer


def domain_name(scenario: Scenario) -> str:
    if scenario.mode == "fanout":
        return f"bench-fan{scenario.consumers}"
    return "bench-bcast" if scenario.mode == "broadcast" else "bench"


def domain_file(scenario: Scenario) -> str:
    """The domain the scenario needs (the embedded bench cluster writes it)."""
    lines = [f'# taproot bench: {scenario.mode}', f'mode = "{scenario.mode}"']
    if scenario.mode == "fanout":
        lines.append("app_ids = [" + ", ".join(f'"app{i}"' for i in range(scenario.consumers)) + "]")
    return "\n".join(lines) + "\n"


def uri(scenario: Scenario, queue: int, consumer: int | None = None) -> str:
    base = f"taproot://{domain_name(scenario)}/{scenario.name}-q{queue}"
    return f"{base}?id=app{consumer}" if consumer is not None and scenario.mode == "fanout" else base


def prepare(address: str, scenario: Scenario) -> None:
    """Queues are created on first open."""


def run_producers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict:
    rate_each = scenario.rate / (scenario.queues * scenario.producers) if scenario.rate else 0.0
    make = payload_factory(scenario.size)

    def producer(queue_index: int, _n: int) -> tuple[int, dict]:
        acks = Samples()
        failed: dict[str, int] = {}
        lock = threading.Lock()
        pending = [0, 0]  # acked, failed since the last progress report
        outstanding = threading.Semaphore(0)

        def on_ack(sent_ns: int):
            def done(future: Future) -> None:
                now_ns = time.perf_counter_ns()
                with lock:
                    exc = future.exception()
                    if exc is None:
                        acks.add(time.time(), (now_ns - sent_ns) / 1e6)
                        pending[0] += 1
                    else:
                        code = getattr(getattr(exc, "code", None), "name", type(exc).__name__)
                        failed[code] = failed.get(code, 0) + 1
                        pending[1] += 1
                outstanding.release()
            return done

        posted = 0
        with Session([address], batch=BatchPolicy(max_messages=scenario.batch),
                     max_pending_puts=scenario.window) as session:
            with session.open_queue(uri(scenario, queue_index), write=True) as queue:
                while shared.start_at.value == 0:
                    time.sleep(0.01)
                start = shared.start_at.value
                time.sleep(max(0.0, start - time.time()))
                stop = start + scenario.duration_s
                began = time.perf_counter()
                last_report = time.monotonic()
                while True:
                    now = time.time()
                    if now >= stop:
                        break
                    if rate_each:
                        delay = began + posted / rate_each - time.perf_counter()
                        if delay > 0:
                            time.sleep(delay)
                    queue.post(make(), on_ack=on_ack(time.perf_counter_ns()))
                    posted += 1
                    if time.monotonic() - last_report > 0.25:
                        with lock:
                            shared.add_progress(acked=pending[0], failed=pending[1])
                            pending[0] = pending[1] = 0
                        last_report = time.monotonic()
                queue.flush()
                for _ in range(posted):  # every PUT gets an ACK (or a failure)
                    if not outstanding.acquire(timeout=300):
                        failed["NO_ACK_IN_300_S"] = failed.get("NO_ACK_IN_300_S", 0) + 1
                        break
        with lock:
            shared.add_progress(acked=pending[0], failed=pending[1])
        return queue_index, {"acks": acks, "posted": posted, "failed": failed}

    return merge_producers(in_threads(clients, producer))


def run_consumers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict:
    def consumer(queue_index: int, n: int) -> Samples:
        pushes = Samples()
        with Session([address]) as session:
            with session.open_queue(uri(scenario, queue_index, n), read=True,
                                    max_unconfirmed_messages=CONSUMER_WINDOW) as queue:
                with shared.ready.get_lock():
                    shared.ready.value += 1
                last_message, unreported, last_report = time.monotonic(), 0, time.monotonic()
                while True:
                    message = queue.get(0.2)
                    now = time.monotonic()
                    if message is not None:
                        pushes.add(time.time(), push_latency_ms(message.payload, time.time_ns()))
                        queue.confirm(message)
                        last_message = now
                        unreported += 1
                    if unreported and (message is None or now - last_report > 0.25):
                        shared.add_received(queue_index, unreported)
                        unreported, last_report = 0, now
                    if message is None and shared.consumer_done(queue_index, len(pushes), scenario.copies,
                                                                now - last_message):
                        break
                queue.flush()
        return pushes

    return merge_consumers(in_threads(clients, consumer))
