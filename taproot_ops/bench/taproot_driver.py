"""Taproot clients for `taproot bench`: one Session per producer or consumer."""

from __future__ import annotations

import queue as _queue
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

import pyarrow as pa

from taproot.batching import BatchPolicy
from taproot.session import Message, Session
from taproot_ops.bench.report import Samples
from taproot_ops.bench.runner import (
    Shared,
    in_threads,
    merge_consumers,
    merge_producers,
    pacing_delay,
    payload_factory,
    push_latencies_ms,
    push_latency_ms,
)
from taproot_ops.bench.scenarios import APP_RULES, N_VALUES, Scenario, app_matches

CONSUMER_WINDOW = 10_000  # max unconfirmed messages per consumer
PRODUCERS_SIGNAL_READY = True  # the runner starts the clock once every producer's queues are open
PRODUCERS_SIGNAL_ANSWERED = True  # and stops the servers' CPU clock before the producers close them


def domain_name(scenario: Scenario) -> str:
    if scenario.mode == "fanout":
        return f"bench-fan{scenario.consumers}" + ("-subs" if scenario.app_subscriptions else "")
    return "bench-bcast" if scenario.mode == "broadcast" else "bench"


def domain_file(scenario: Scenario) -> str:
    """The domain the scenario needs (the embedded bench cluster writes it)."""
    lines = [f'# taproot bench: {scenario.mode}', f'mode = "{scenario.mode}"']
    if scenario.mode == "fanout":
        lines.append("app_ids = [" + ", ".join(f'"app{i}"' for i in range(scenario.consumers)) + "]")
        if scenario.app_subscriptions:
            lines.append("[subscriptions]")
            lines += [f'app{app} = "{text}"' for app, (text, _) in sorted(APP_RULES.items())
                      if app < scenario.consumers]
    return "\n".join(lines) + "\n"


def uri(scenario: Scenario, queue: int, consumer: int | None = None) -> str:
    base = f"taproot://{domain_name(scenario)}/{scenario.name}-q{queue}"
    return f"{base}?id=app{consumer}" if consumer is not None and scenario.mode == "fanout" else base


def prepare(address: str, scenario: Scenario) -> None:
    """Queues are created on first open."""


def sessions_of(scenario: Scenario, clients: list[tuple[int, int]]) -> list[tuple[tuple[int, ...], int]]:
    """This worker's (queue, n) clients as sessions: with `queues_per_client`
    K, each session serves K of the queues that client n has here."""
    by_n: dict[int, list[int]] = {}
    for queue_index, n in clients:
        by_n.setdefault(n, []).append(queue_index)
    k = scenario.queues_per_client
    return [(tuple(queues[i:i + k]), n) for n, queues in by_n.items() for i in range(0, len(queues), k)]


def _open_all(session: Session, requests: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Open many queues at once: each open is a round trip, so 5,000 in turn
    would take seconds before the run starts."""
    if len(requests) == 1:
        return [session.open_queue(requests[0][0], **requests[0][1])]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda r: session.open_queue(r[0], **r[1]), requests))


def _close_all(queues: list[Any]) -> None:
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(16, len(queues))) as pool:
        list(pool.map(lambda q: q.close(), queues))


def run_producers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict[str, Any]:
    rate_each = scenario.rate / (scenario.queues * scenario.producers) if scenario.rate else 0.0
    make = payload_factory(scenario.size)

    def producer(queue_indexes: tuple[int, ...], _n: int) -> tuple[None, dict[str, Any]]:
        acks = Samples()
        failed: dict[str, int] = {}
        acked_per_queue = dict.fromkeys(queue_indexes, 0)
        acked_by_n = {q: [0] * N_VALUES for q in queue_indexes}   # fanout-5c-subs: ACKed per property n
        lock = threading.Lock()
        pending = [0, 0]  # acked, failed since the last progress report
        # PUTs (or bulk frames) answered, and how many must be before the
        # producer stops (known once it has posted the last): a counter
        # under the lock the callback holds anyway, not a Semaphore (whose
        # release, a Condition of its own, cost 0.8 us an ACK).
        answered, expected = [0], [sys.maxsize]
        all_answered = threading.Condition(lock)

        def on_ack(queue_index: int, sent_ns: int, n: int, rows: int = 1) -> Callable[[Future[Any]], None]:
            """A PUT's ACK, or a bulk frame's (`rows` messages, property n unset)."""
            def done(future: Future[Any]) -> None:
                now_ns = time.perf_counter_ns()
                with lock:
                    exc = future.exception()
                    if exc is None:
                        acks.add_many(time.time(), (now_ns - sent_ns) / 1e6, rows)
                        acked_per_queue[queue_index] += rows
                        acked_by_n[queue_index][n] += rows
                        pending[0] += rows
                    else:
                        code = getattr(getattr(exc, "code", None), "name", type(exc).__name__)
                        failed[code] = failed.get(code, 0) + rows
                        pending[1] += rows
                    answered[0] += 1
                    if answered[0] >= expected[0]:
                        all_answered.notify_all()
            return done

        posted = 0
        rate = rate_each * len(queue_indexes)
        with Session([address], batch=BatchPolicy(max_messages=scenario.batch),
                     max_pending_puts=scenario.window) as session:
            queues = _open_all(session, [(uri(scenario, q), {"write": True}) for q in queue_indexes])
            targets = list(zip(queue_indexes, queues))
            shared.mark_producers_ready(len(queues))
            while shared.start_at.value == 0:
                time.sleep(0.01)
            start = shared.start_at.value
            time.sleep(max(0.0, start - time.time()))
            stop = start + scenario.duration_s
            began = time.perf_counter()
            last_report = time.monotonic()
            frames = 0
            while True:
                now = time.time()
                if now >= stop:
                    break
                if rate:
                    delay = pacing_delay(began, posted, rate, time.perf_counter())
                    if delay:
                        time.sleep(delay)
                if scenario.bulk:  # one columnar frame of `batch` rows, stamped once
                    queue_index, queue = targets[frames % len(targets)]
                    rows = scenario.batch
                    sent_ns = time.perf_counter_ns()
                    future = queue.post_columns(pa.table({"payload": pa.array([make()] * rows, pa.binary())}))
                    future.add_done_callback(on_ack(queue_index, sent_ns, 0, rows))
                    posted += rows
                    frames += 1
                else:
                    queue_index, queue = targets[posted % len(targets)]  # round-robin over its queues
                    n = posted % N_VALUES
                    queue.post(make(), properties={"n": n} if scenario.app_subscriptions else None,
                               on_ack=on_ack(queue_index, time.perf_counter_ns(), n))
                    posted += 1
                    frames += 1
                if time.monotonic() - last_report > 0.25:
                    with lock:
                        shared.add_progress(acked=pending[0], failed=pending[1])
                        pending[0] = pending[1] = 0
                    last_report = time.monotonic()
            queues[0].flush()
            with lock:   # every PUT (or bulk frame) gets an ACK (or a failure)
                expected[0] = frames
                if not all_answered.wait_for(lambda: answered[0] >= frames, timeout=300):
                    failed["NO_ACK_IN_300_S"] = failed.get("NO_ACK_IN_300_S", 0) + frames - answered[0]
            # Reported before the closes: 5,000 queues take seconds to close,
            # and the progress line would show ACKs that came as missing.
            with lock:
                shared.add_progress(acked=pending[0], failed=pending[1])
                pending[0] = pending[1] = 0
            shared.mark_producers_answered(len(queues))
            _close_all(queues)
        with lock:   # whatever the session's end answered after that
            shared.add_progress(acked=pending[0], failed=pending[1])
        return None, {"acks": acks, "posted": posted, "failed": failed, "acked_per_queue": acked_per_queue,
                      "acked_by_n": acked_by_n}

    return merge_producers(in_threads(sessions_of(scenario, clients), producer))


def run_consumers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict[str, Any]:
    def consumer(queue_indexes: tuple[int, ...], n: int) -> Samples:
        pushes = Samples()
        wrong = [0]   # fanout-5c-subs: messages this app's subscription does not match
        seen: set[bytes] = set()   # and GUIDs it got twice
        duplicates = [0]
        inbox: "_queue.SimpleQueue[tuple[int, Message]]" = _queue.SimpleQueue()
        own = dict.fromkeys(queue_indexes, 0)
        unreported: dict[int, int] = {}   # the queues with receipts since the last report
        with Session([address]) as session:
            if scenario.batch_consumer:
                return _batch_consumer(session, scenario, queue_indexes, n, shared)
            # One queue: per-message iteration (`Queue.get`), as a consumer
            # of one queue would read it. Several: a callback per queue into
            # one inbox, since `get` waits on one queue.
            single = len(queue_indexes) == 1
            queues = _open_all(session, [
                (uri(scenario, q, n), {"read": True, "max_unconfirmed_messages": CONSUMER_WINDOW,
                                       "on_message": None if single else (lambda m, q=q: inbox.put((q, m)))})
                for q in queue_indexes])
            with shared.ready.get_lock():
                shared.ready.value += len(queue_indexes)
            last_message, last_report = time.monotonic(), time.monotonic()
            while True:
                if single:
                    message = queues[0].get(timeout_s=0.2)
                    queue_index = queue_indexes[0] if message is not None else -1
                else:
                    try:
                        queue_index, message = inbox.get(timeout=0.2)
                    except _queue.Empty:
                        queue_index, message = -1, None
                now = time.monotonic()
                if message is not None:
                    pushes.add(time.time(), push_latency_ms(message.payload, time.time_ns()))
                    if scenario.app_subscriptions:
                        if not app_matches(n, int(message.properties.get("n", -1))):
                            wrong[0] += 1
                        if message.guid in seen:
                            duplicates[0] += 1
                        seen.add(message.guid)
                    message.confirm()
                    last_message = now
                    own[queue_index] += 1
                    unreported[queue_index] = unreported.get(queue_index, 0) + 1
                if message is None or now - last_report > 0.25:
                    shared.add_received_many(unreported)
                    unreported.clear()
                    last_report = now
                if message is None and all(shared.consumer_done(q, own[q], scenario.copies, now - last_message,
                                                                app=n if scenario.app_subscriptions else None)
                                           for q in queue_indexes):
                    break
            _close_all(queues)  # sends the last CONFIRMs first
        if scenario.app_subscriptions:
            pushes.apps[n] = {"received": len(pushes), "wrong": wrong[0], "duplicates": duplicates[0]}
        return pushes

    return merge_consumers(in_threads(sessions_of(scenario, clients), consumer))


def _batch_consumer(session: Session, scenario: Scenario, queue_indexes: tuple[int, ...], n: int,
                    shared: Shared) -> Samples:
    """One queue read with `get_columns` (Arrow batches): each batch's PUSH
    latencies, read from its payload column, then one CONFIRM for the batch."""
    if len(queue_indexes) != 1:
        raise ValueError("batch consumers read one queue per session (queues_per_client = 1)")
    queue_index = queue_indexes[0]
    pushes = Samples()
    queue = session.open_queue(uri(scenario, queue_index, n), read=True, max_unconfirmed_messages=CONSUMER_WINDOW)
    with shared.ready.get_lock():
        shared.ready.value += 1
    own = unreported = 0
    last_message = last_report = time.monotonic()
    while True:
        batch = queue.get_columns(scenario.batch, timeout_s=0.2)
        now = time.monotonic()
        if batch:
            pushes.add_array(time.time(), push_latencies_ms(batch.table["payload"], time.time_ns()))
            batch.confirm()
            own += len(batch)
            unreported += len(batch)
            last_message = now
        if (not batch or now - last_report > 0.25) and unreported:
            shared.add_received(queue_index, unreported)
            unreported = 0
            last_report = now
        if not batch and shared.consumer_done(queue_index, own, scenario.copies, now - last_message):
            break
    queue.close()  # sends the last CONFIRMs first
    return pushes
