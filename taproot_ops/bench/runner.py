"""Run a scenario: producers and consumers in separate worker processes.

Each producer and each consumer is its own client connection; they are spread
over at most `workers` processes per role (spawned, not forked: gRPC and
delta-rs do not survive fork). Every payload carries its send time in its
first 8 bytes (nanoseconds, one machine, one clock), so PUT->PUSH is measured
the same way for every system. PUT->ACK is the time from the post call to its
acknowledgement, in the producer.

Consumers attach first (broadcast only reaches consumers that are there).
Producers post for `duration_s`, then wait for their ACKs. Consumers stop once
they have what was ACKed for their queue, or after `drain_idle_s` without a
message once the producers are done.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from taproot_ops.bench.cpu import tree_cpu_seconds
from taproot_ops.bench.report import Samples, rss_by_minute, summarize
from taproot_ops.bench.scenarios import Scenario

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized, SynchronizedArray

    import pyarrow as pa

STAMP = struct.Struct(">Q")
SYSTEMS = {"taproot": "taproot_ops.bench.taproot_driver", "rabbitmq": "taproot_ops.bench.rabbitmq_driver",
           "nats": "taproot_ops.bench.nats_driver"}


# A paced producer sleeps only once it is this far ahead of its schedule
# and posts what is due in between, as Kafka's `ThroughputThrottler`
# (MIN_SLEEP_NS, 2 ms) does: a sleep a message (every 100 us at 10k msg/s)
# cost the load generator a timer, a wake-up and a context switch each, on
# the cores the servers share with it.
MIN_SLEEP_S = 0.001


def pacing_delay(began: float, posted: int, rate: float, now: float) -> float:
    """How long a producer paced at `rate` messages a second since `began`
    (perf_counter seconds), with `posted` sent, sleeps at `now`: 0 when it
    is behind or less than `MIN_SLEEP_S` ahead (it posts), else until its
    next message is due. The average rate is `rate` either way."""
    delay = began + posted / rate - now
    return delay if delay >= MIN_SLEEP_S else 0.0


def payload_factory(size: int) -> Callable[[], bytes]:
    filler = b"\x5a" * max(0, size - STAMP.size)

    def make() -> bytes:
        return STAMP.pack(time.time_ns()) + filler
    return make


def push_latency_ms(payload: bytes, now_ns: int) -> float:
    sent_ns: int = STAMP.unpack_from(payload)[0]
    return (now_ns - sent_ns) / 1e6


def push_latencies_ms(payloads: "pa.ChunkedArray | pa.Array", now_ns: int) -> np.ndarray:
    """`push_latency_ms` for a column of payloads at once: the stamps read
    straight from the column's buffers."""
    import pyarrow as pa

    if isinstance(payloads, pa.ChunkedArray):
        payloads = payloads.combine_chunks()
    n = len(payloads)
    if n == 0:
        return np.empty(0, np.float64)
    offsets = np.frombuffer(payloads.buffers()[1], np.int32, n, payloads.offset * 4)
    data = np.frombuffer(payloads.buffers()[2], np.uint8)
    stamps = data[offsets[:, None] + np.arange(STAMP.size)].copy().view(">u8").ravel()
    result: np.ndarray = (now_ns - stamps.astype(np.int64)) / 1e6
    return result


@dataclass
class Shared:
    """What the main process and the workers share."""
    ready: "Synchronized[Any]"        # consumers attached
    start_at: "Synchronized[Any]"     # epoch s producers start; 0 until set
    producers_done: "mp.synchronize.Event"
    expected: "SynchronizedArray[Any]"  # per queue: ACKed messages (set when producers are done)
    progress: "SynchronizedArray[Any]"  # [acked, received, failed]
    received: "SynchronizedArray[Any]"  # per queue: received by all its consumers
    drain_idle_s: float
    producers_ready: "Synchronized[Any]"  # (queue, producer) pairs with their queues open
    expected_by_n: "SynchronizedArray[Any]"  # per queue and property n: ACKed (app subscriptions)
    producers_answered: "Synchronized[Any]"  # (queue, producer) pairs with every PUT answered, before their closes

    def mark_producers_ready(self, count: int) -> None:
        with self.producers_ready.get_lock():
            self.producers_ready.value += count

    def mark_producers_answered(self, count: int) -> None:
        """These producers' PUTs are all answered, and their ACKs counted in
        `progress`: what they do next (close their queues) is not the run's."""
        with self.producers_answered.get_lock():
            self.producers_answered.value += count

    def add_received(self, queue: int, count: int) -> None:
        """A consumer's receipts: the progress line and its queue's total."""
        self.add_received_many({queue: count})

    def add_received_many(self, counts: Mapping[int, int]) -> None:
        """`add_received` for many queues at once: each lock taken once, the
        totals written to the shared array's memory under it (a consumer of
        5,000 queues reported queue by queue took 2 locks a queue, 4 times a
        second: a tenth of its process's CPU)."""
        if not counts:
            return
        self.add_progress(received=sum(counts.values()))
        with self.received.get_lock():
            totals: Any = self.received.get_obj()   # a ctypes array of int64
            for queue, count in counts.items():
                totals[queue] += count

    def consumer_done(self, queue: int, own: int, copies: int, idle_s: float, app: int | None = None) -> bool:
        """Whether a consumer can stop: the producers are done and it has what
        was ACKed (each copy in fanout/broadcast; its queue's share in
        priority; with app subscriptions, what its app's rule matches), or
        nothing came for `drain_idle_s`."""
        if not self.producers_done.is_set():
            return False
        have = own if copies > 1 else self.received[queue]
        return have >= self.expected_for(queue, app) or idle_s >= self.drain_idle_s

    def expected_for(self, queue: int, app: int | None) -> int:
        if app is None:
            return int(self.expected[queue])
        from taproot_ops.bench.scenarios import N_VALUES, app_matches
        return sum(self.expected_by_n[queue * N_VALUES + n] for n in range(N_VALUES) if app_matches(app, n))

    def add_progress(self, acked: int = 0, received: int = 0, failed: int = 0) -> None:
        with self.progress.get_lock():
            totals: Any = self.progress.get_obj()   # under the lock: not each item's own acquire
            totals[0] += acked
            totals[1] += received
            totals[2] += failed


def _all_delivered(shared: Shared, acked_per_queue: list[int], producers: int, copies: int,
                   answers_signalled: bool) -> bool:
    """Whether the run's work is over: every producer's PUTs answered and
    every ACKed message received (each copy). A driver that signals its
    producers' answers (`PRODUCERS_SIGNAL_ANSWERED`) is done before its
    producers close their queues, which at 5,000 queues a session takes
    longer than the run's own last seconds; otherwise when the producers'
    results are in."""
    if shared.producers_done.is_set():
        acked = sum(acked_per_queue)
    elif answers_signalled and shared.producers_answered.value >= producers:
        acked = shared.progress[0]
    else:
        return False
    return bool(shared.progress[1] >= acked * copies)


def in_threads(clients: list[Any], target: Callable[..., Any]) -> list[Any]:
    """`target(*client)` for every client, each in its own thread; the results in order."""
    outs: list[Any] = [None] * len(clients)
    errors: list[BaseException] = []

    def run(i: int, client: Any) -> None:
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


def merge_producers(outs: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    total, posted = Samples(), 0
    failed: dict[str, int] = {}
    per_queue: dict[int, int] = {}
    by_n: dict[int, list[int]] = {}
    for queue, out in outs:
        for q, counts in out.get("acked_by_n", {}).items():
            by_n[q] = [a + b for a, b in zip(by_n.get(q, [0] * len(counts)), counts)]
        total.extend(out["acks"])
        posted += out["posted"]
        # A client of one queue, or one of several queues with its own counts.
        for q, n in (out.get("acked_per_queue") or {queue: len(out["acks"])}).items():
            per_queue[q] = per_queue.get(q, 0) + n
        for code, n in out["failed"].items():
            failed[code] = failed.get(code, 0) + n
    return {"acks": total, "posted": posted, "failed": failed, "acked_per_queue": per_queue, "acked_by_n": by_n}


def merge_consumers(pushes: list[Samples]) -> dict[str, Any]:
    total = Samples()
    for p in pushes:
        total.extend(p)
    return {"pushes": total}


CLIENT_GC = ("tuned", "default")


def _worker(system: str, role: str, address: str, scenario: Scenario, clients: list[tuple[int, int]],
            shared: Shared, results: "mp.Queue[Any]", client_gc: str = "tuned", release: Any = None) -> None:
    """`release`: an Event the worker waits for (30 s at most) after it has
    reported, so the main process can read its CPU time before it exits."""
    try:
        driver = importlib.import_module(SYSTEMS[system])
        if client_gc == "tuned":
            # As an application moving this many messages would (`taproot.tune_gc`):
            # with the interpreter's defaults a per-message producer spent
            # about half its CPU in full collections. Every system's clients alike.
            from protocol import gc_tuning
            gc_tuning.settle_for_serving()
        # And its C allocator, as `taproot.tune_malloc` does, unless `--malloc
        # default` set TAPROOT_MALLOC_TUNING=off for every process of the run
        # (`malloc_tuning`): frames of a megabyte were faulted in afresh each.
        from protocol import malloc_tuning
        malloc_tuning.tune()
        if role == "producer":
            out = driver.run_producers(address, scenario, clients, shared)
        else:
            out = driver.run_consumers(address, scenario, clients, shared)
        results.put((role, out))
        if release is not None:
            release.wait(30)
    except BaseException as exc:  # reported by the main process, which then fails the run
        import traceback
        results.put((role, RuntimeError(f"{system} {role}: {exc}\n{traceback.format_exc()}")))


def _spread(items: list[Any], parts: int) -> list[list[Any]]:
    parts = max(1, min(parts, len(items)))
    return [items[i::parts] for i in range(parts)]


def run(system: str, address: str, scenario: Scenario, *, workers: int = 2, drain_idle_s: float = 30.0,
        progress: bool = True, cpu_probe: Callable[[], dict[str, float]] | None = None,
        memory_probe: Callable[[], dict[str, float]] | None = None,
        consumer_address: str | None = None,
        phase_probe: "Callable[[], dict[str, tuple[float, float]]] | None" = None,
        client_gc: str = "tuned") -> dict[str, Any]:
    """One scenario. `cpu_probe` gives the server processes' CPU seconds so
    far (by name); with it the result has each one's CPU time over the run
    and the CPU cost per message. `memory_probe` gives their resident MiB,
    sampled every second into `rss_mb`. `consumer_address`: where consumers
    connect, when not where producers do (a federation scenario).
    `phase_probe` gives the nodes' PUT->ACK phases so far
    (`taproot_ops.bench.phases`): their means over the run go to
    `put_ack_phases_ms`. `client_gc`: "tuned", the load generator's
    processes tune their garbage collector (`taproot.tune_gc`) before they
    connect; "default", the interpreter's settings."""
    if client_gc not in CLIENT_GC:
        raise ValueError(f"client_gc must be one of {', '.join(CLIENT_GC)}, not {client_gc!r}")
    driver = importlib.import_module(SYSTEMS[system])
    driver.prepare(address, scenario)
    ctx = mp.get_context("spawn")
    from taproot_ops.bench.scenarios import N_VALUES, app_matches
    shared = Shared(ctx.Value("i", 0), ctx.Value("d", 0.0), ctx.Event(), ctx.Array("q", scenario.queues),
                    ctx.Array("q", 3), ctx.Array("q", scenario.queues), drain_idle_s, ctx.Value("i", 0),
                    ctx.Array("q", scenario.queues * N_VALUES), ctx.Value("i", 0))
    results = ctx.Queue()
    release = ctx.Event()   # the workers exit once their CPU time is read
    consumers = [(q, c) for q in range(scenario.queues) for c in range(scenario.consumers)]
    producers = [(q, p) for q in range(scenario.queues) for p in range(scenario.producers)]
    procs = [ctx.Process(target=_worker, args=(system, "consumer", consumer_address or address, scenario, group,
                                               shared, results, client_gc, release), daemon=True)
             for group in _spread(consumers, workers)]
    procs += [ctx.Process(target=_worker, args=(system, "producer", address, scenario, group, shared, results,
                                                client_gc, release), daemon=True)
              for group in _spread(producers, workers)]
    for p in procs:
        p.start()
    n_consumer_procs = len(_spread(consumers, workers))
    try:
        deadline = time.monotonic() + 120
        while shared.ready.value < len(consumers):
            _check_alive(procs, results)
            _raise_reported(results)
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {shared.ready.value} of {len(consumers)} consumers attached in 120 s")
            time.sleep(0.05)
        answers_signalled = getattr(driver, "PRODUCERS_SIGNAL_ANSWERED", False)
        if getattr(driver, "PRODUCERS_SIGNAL_READY", False):
            # Opening thousands of queues takes seconds: keep it out of the run.
            while shared.producers_ready.value < len(producers):
                _check_alive(procs, results)
                _raise_reported(results)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"producers opened only {shared.producers_ready.value} of "
                                       f"{len(producers)} queues in 120 s")
                time.sleep(0.05)
        start = time.time() + 1.0  # producers connect meanwhile
        cpu_before = cpu_probe() if cpu_probe else {}
        cpu_after: dict[str, float] = {}
        # The load generator's own CPU, over the same window as the servers':
        # it runs on the same cores, so what it spends is not the servers'.
        client_roots = {f"{'consumer' if i < n_consumer_procs else 'producer'} {p.pid}": int(p.pid or 0)
                        for i, p in enumerate(procs)}   # (started: each has its pid)
        clients_before = tree_cpu_seconds(client_roots)
        clients_after: dict[str, float] = {}
        phases_before = phase_probe() if phase_probe else {}
        phases_after: dict[str, tuple[float, float]] = {}
        shared.start_at.value = start
        acks, pushes, posted = Samples(), Samples(), 0
        failed: dict[str, int] = {}
        producer_results = consumer_results = 0
        last_print = 0.0
        per_queue = [0] * scenario.queues
        by_n = [0] * (scenario.queues * N_VALUES)
        apps: dict[int, dict[str, Any]] = {}
        rss: dict[str, list[tuple[float, float]]] = {}
        last_sample = 0.0
        while producer_results + consumer_results < len(procs):
            if memory_probe and time.monotonic() - last_sample >= 1.0:
                last_sample = time.monotonic()
                for name, mb in memory_probe().items():
                    rss.setdefault(name, []).append((round(time.time() - start, 1), round(mb, 1)))
            if not clients_after and _all_delivered(shared, per_queue, len(producers), scenario.copies,
                                                    answers_signalled):
                # Everything delivered: before the clients close their queues.
                clients_after = tree_cpu_seconds(client_roots)
                if cpu_probe:
                    cpu_after = cpu_probe()
                    phases_after = phase_probe() if phase_probe else {}
            if progress and time.monotonic() - last_print >= 1.0:
                _print_progress(scenario, start, shared)
                last_print = time.monotonic()
            try:
                role, out = results.get(timeout=0.2)
            except Exception:
                _check_alive(procs, results)
                continue
            if isinstance(out, BaseException):
                raise out
            if role == "producer":
                producer_results += 1
                acks.extend(out["acks"])
                posted += out["posted"]
                for code, n in out["failed"].items():
                    failed[code] = failed.get(code, 0) + n
                for q, n in out["acked_per_queue"].items():
                    per_queue[q] += n
                for q, counts in out.get("acked_by_n", {}).items():
                    for value, n in enumerate(counts):
                        by_n[q * N_VALUES + value] += n
                if producer_results == len(procs) - n_consumer_procs:
                    for i, n in enumerate(by_n):
                        shared.expected_by_n[i] = n
                    for q, n in enumerate(per_queue):
                        shared.expected[q] = n
                    shared.producers_done.set()
            else:
                consumer_results += 1
                pushes.extend(out["pushes"])
                for app, seen in out["pushes"].apps.items():
                    entry = apps.setdefault(app, {"received": 0, "wrong": 0, "duplicates": 0})
                    for key in entry:
                        entry[key] += seen[key]
        if not clients_after:
            clients_after = tree_cpu_seconds(client_roots)   # every worker waits for `release`
        release.set()
        if cpu_probe and not cpu_after:
            cpu_after = cpu_probe()
        if phase_probe and not phases_after:
            phases_after = phase_probe()
        if progress:
            _print_progress(scenario, start, shared)
            sys.stderr.write("\n")
    except BaseException:
        for p in procs:   # the run is abandoned (an error, Ctrl-C, SIGTERM): its clients go now
            p.terminate()
        raise
    finally:
        shared.producers_done.set()
        release.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    cpu_closed = cpu_probe() if cpu_probe and cpu_after else {}   # the clients have closed their queues
    result = summarize(acks, pushes, posted, failed, start)
    result["expected_received"] = sum(per_queue) * scenario.copies
    if scenario.app_subscriptions:
        for app, entry in apps.items():
            entry["expected"] = sum(by_n[q * N_VALUES + n] for q in range(scenario.queues) for n in range(N_VALUES)
                                    if app_matches(app, n))
        result["apps"] = {f"app{a}": apps[a] for a in sorted(apps)}
        result["expected_received"] = sum(e["expected"] for e in apps.values())
    result["start_s"] = start
    result["client_gc"] = client_gc
    clients = client_cpu(clients_before, clients_after)
    if clients is not None:
        result["client_cpu_s"] = clients
    from protocol import malloc_tuning
    result["malloc"] = "default" if malloc_tuning.switched_off() else "tuned"
    if phase_probe:
        from taproot_ops.bench.phases import frames_a_message, fsyncs, group_commits, means_ms, slow_shares
        result["put_ack_phases_ms"] = means_ms(phases_before, phases_after)
        result["put_ack_phases_slow"] = slow_shares(phases_before, phases_after)
        result["node_frames_a_message"] = frames_a_message(phases_before, phases_after)
        result["node_fsyncs"] = fsyncs(phases_before, phases_after)
        result["node_group_commits"] = group_commits(phases_before, phases_after)
    if memory_probe:
        result["rss_mb"] = rss
        result["rss_minutes_mb"] = rss_by_minute(rss)
    if cpu_probe:
        from taproot_ops.bench.cpu import delta
        cpu_s = delta(cpu_before, cpu_after)
        result["cpu_s"] = cpu_s
        # From the first PUT until every ACKed message was received (queue
        # opens and closes are outside), so it includes the wait for the last
        # delivery, when an idle pipeline polls (about a tenth of a core).
        result["cpu_us_per_msg"] = sum(cpu_s.values()) * 1e6 / max(1, len(acks))
        result["cpu_before"] = cpu_before   # for a later window (the authority catching up)
        # What the servers spent while the clients closed their queues and
        # left: outside `cpu_s`, inside any later window from `cpu_before`.
        result["cpu_closes_s"] = delta(cpu_after, cpu_closed)
    result.update(system=system, scenario=scenario.name, label=scenario.label, size=scenario.size,
                  rate=scenario.rate, duration_s=scenario.duration_s, batch=scenario.batch, window=scenario.window)
    return result


def client_cpu(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """The load generator's CPU seconds between two `tree_cpu_seconds` of its
    workers (named "<role> <pid>"), summed by role ("producers",
    "consumers"); None when a worker was not seen both times (gone before
    the second, or no /proc), as no figure beats a short one."""
    if not before or set(before) != set(after):
        return None
    out: dict[str, float] = {}
    for name, seconds in after.items():
        role = f"{name.split()[0]}s"
        out[role] = round(out.get(role, 0.0) + seconds - before[name], 2)
    return dict(sorted(out.items(), reverse=True))


def _raise_reported(results: "mp.Queue[Any]") -> None:
    """A worker that failed before the run started (a refused open, say)."""
    try:
        role, out = results.get_nowait()
    except Exception:
        return
    if isinstance(out, BaseException):
        raise out
    results.put((role, out))  # not expected before the start; keep it for the main loop


def _check_alive(procs: list[Any], results: "mp.Queue[Any]") -> None:
    for p in procs:
        if p.exitcode not in (None, 0):
            raise RuntimeError(f"a benchmark worker exited with code {p.exitcode}")


def _print_progress(scenario: Scenario, start: float, shared: Shared) -> None:
    acked, received, failed = shared.progress[:]
    elapsed = max(0.0, time.time() - start)
    sys.stderr.write(f"\r  {scenario.label}: {elapsed:5.1f} s  acked {acked:,}  failed {failed:,}  "
                     f"received {received:,}   ")
    sys.stderr.flush()
