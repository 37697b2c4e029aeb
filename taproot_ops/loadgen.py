"""Traffic for the demo and the benchmark: a producer and a consumer that
measure PUT->ACK and PUT->PUSH latency (producer and consumer on one clock)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from protocol.clock import wall_time_us
from taproot.batching import BatchPolicy
from taproot.futures import PutFuture
from taproot.message import Message
from taproot.session import Session


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    return " ".join(f"p{q}={percentile(values, q):.1f}" for q in (50, 90, 99)) + f" max={max(values):.1f} ms"


@dataclass
class ProduceResult:
    posted: int = 0
    acked: int = 0
    failed: int = 0
    ack_latency_ms: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    guids: list[bytes] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class ConsumeResult:
    received: int = 0
    redelivered: int = 0
    push_latency_ms: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    guids: list[bytes] = field(default_factory=list)
    # Messages `accept` turned down (confirmed, not counted): left over from an earlier run.
    others: int = 0
    # time.monotonic() when the first counted message arrived.
    first_at: float | None = None


def produce(address: str, uri: str, count: int, size: int = 1024, rate: float = 0.0,
            batch: BatchPolicy | None = None, properties: dict[str, Any] | None = None) -> ProduceResult:
    """Post `count` messages of `size` bytes (at `rate` msg/s, 0 = as fast as
    possible) and wait for every ACK."""
    result = ProduceResult()
    lock = threading.Lock()
    done = threading.Event()
    payload = os.urandom(size)

    def on_ack(started_ns: int) -> Callable[[PutFuture], None]:
        def callback(future: PutFuture) -> None:
            latency = (time.perf_counter_ns() - started_ns) / 1e6
            with lock:
                if future.exception() is None:
                    result.acked += 1
                    result.ack_latency_ms.append(latency)
                else:
                    result.failed += 1
                    if len(result.errors) < 10:
                        result.errors.append(str(future.exception()))
                if result.acked + result.failed == count:
                    done.set()
        return callback

    with Session([address], batch=batch) as session:
        with session.open_queue(uri, write=True) as queue:
            started = time.perf_counter()
            for i in range(count):
                if rate > 0:
                    due = started + i / rate
                    delay = due - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                future = queue.post(payload, properties=properties, on_ack=on_ack(time.perf_counter_ns()))
                result.guids.append(future.guid)
                result.posted += 1
            queue.flush()
            done.wait(timeout=max(60.0, count / 1000))
            result.elapsed_s = time.perf_counter() - started
    return result


def consume(address: str, uri: str, count: int, idle_timeout_s: float = 60.0,
            ready: threading.Event | None = None, max_unconfirmed_messages: int = 1000,
            accept: Callable[[Message], bool] | None = None) -> ConsumeResult:
    """Receive and confirm until `count` messages arrived or none for
    `idle_timeout_s`. With `accept`, only the messages it accepts count; the
    others are confirmed too (`others`)."""
    result = ConsumeResult()
    with Session([address]) as session:
        with session.open_queue(uri, read=True, max_unconfirmed_messages=max_unconfirmed_messages) as queue:
            if ready is not None:
                ready.set()
            started = None
            while result.received < count:
                message = queue.get(idle_timeout_s)
                if message is None:
                    break
                if accept is not None and not accept(message):
                    result.others += 1
                    queue.confirm(message)
                    continue
                if started is None:
                    result.first_at = time.monotonic()
                    started = time.perf_counter()
                result.push_latency_ms.append((wall_time_us() - message.put_time_us) / 1000)
                result.received += 1
                result.redelivered += message.redelivered
                result.guids.append(message.guid)
                queue.confirm(message)
            queue.flush()
            result.elapsed_s = time.perf_counter() - started if started else 0.0
    return result
