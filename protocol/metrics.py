"""Prometheus metrics for every role, over HTTP (`prometheus_client`).

Each serving process (node, proxy, pipeline) has a registry of its own with
a collector that reads the role's state when scraped: queue depths, counts
kept as plain integers where the work happens (under the locks it already
holds, per frame, not per message), buffers. Nothing is computed on the data
path for a scrape nobody makes. Names and units follow Prometheus's
conventions: `taproot_` prefix, `_total` counters, `_seconds` and `_bytes`
units, base units only (`docs/operations.md` lists every metric).

`serve_http` serves `/metrics` (the text format), and whatever else a role
adds (`routes`): the status page and its JSON.
"""

from __future__ import annotations

import bisect
import http.server
import logging
import threading
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol import bundles, pb
from protocol.auth import Authenticator
from protocol.codes import ResultCode

log = logging.getLogger(__name__)

# Latency buckets (seconds): the express lane's milliseconds up to a Spark
# micro-batch's tens of seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SIZE_BUCKETS = (1, 10, 100, 500, 1000, 2000, 5000, 10000, 20000, 50000)
OTHER_QUEUES = "_other"   # the queue label of every queue past the series cap


def code_name(code: int) -> str:
    try:
        return ResultCode(code).name
    except ValueError:
        return str(code)


class WeightedHistogram:
    """A histogram whose observations carry a count: a frame's messages share
    one latency, observed once with the frame's size (prometheus_client's
    Histogram takes one observation at a time). Thread-safe."""

    def __init__(self, buckets: Sequence[float]):
        self.bounds = tuple(buckets)
        self._counts = [0] * (len(self.bounds) + 1)   # the last: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float, count: int = 1) -> None:
        if count <= 0:
            return
        i = bisect.bisect_left(self.bounds, value)
        with self._lock:
            self._counts[i] += count
            self._sum += value * count

    def observe_many(self, observations: Iterable[tuple[float, int]]) -> None:
        """(value, count) pairs, under one hold of the lock."""
        found: dict[int, int] = {}
        total = 0.0
        for value, count in observations:
            i = bisect.bisect_left(self.bounds, value)
            found[i] = found.get(i, 0) + count
            total += value * count
        if found:
            with self._lock:
                for i, count in found.items():
                    self._counts[i] += count
                self._sum += total

    def observe_values(self, values: "np.ndarray") -> None:
        """One observation of each value (count 1), bucketed by numpy: a
        frame spanning queues has a latency a row."""
        if not len(values):
            return
        found = np.bincount(np.searchsorted(np.asarray(self.bounds, np.float64), values, side="left"),
                            minlength=len(self._counts))
        total = float(values.sum())
        with self._lock:
            for i in np.flatnonzero(found).tolist():
                self._counts[i] += int(found[i])
            self._sum += total

    @property
    def count(self) -> int:
        return sum(self._counts)

    @property
    def sum(self) -> float:
        """The observations' total (each value times its count)."""
        return self._sum

    def add_to(self, family: HistogramMetricFamily, labels: Sequence[str] = ()) -> None:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, n in zip((*(str(float(b)) for b in self.bounds), "+Inf"), counts):
            cumulative += n
            buckets.append((bound, cumulative))
        family.add_metric(list(labels), buckets, total)


class FrameCounts:
    """The data frames a role sends its downstream peers (clients, proxies,
    relays), by kind, in messages, and the ACKs among them by result code:
    counted where every frame passes (`Link.observer`); and the PUTs and
    CONFIRMs it receives from them (`received`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acks: dict[str, int] = {}
        self.pushes = 0
        self.frames: dict[str, int] = {}
        self.puts = 0
        self.confirms = 0

    def received(self, frame: pb.Frame) -> None:
        kind = frame.WhichOneof("body")
        if kind == "put":
            puts, confirms = len(frame.put.messages), 0
        elif kind == "put_columns":
            puts, confirms = len(frame.put_columns.guids) // 16, 0
        elif kind == "confirm":
            puts, confirms = 0, len(frame.confirm.messages)
        elif kind == "confirm_columns":
            puts, confirms = 0, sum(frame.confirm_columns.counts)
        else:
            return
        with self._lock:
            self.puts += puts
            self.confirms += confirms

    def observe(self, frame: pb.Frame) -> None:
        kind = frame.WhichOneof("body")
        if kind is None:
            return
        acks: dict[str, int] = {}
        pushes = 0
        if kind == "ack":
            for m in frame.ack.messages:
                name = code_name(m.code)
                acks[name] = acks.get(name, 0) + 1
        elif kind == "ack_columns":
            a = frame.ack_columns
            rows = len(a.guids) // 16
            for code in a.refused_codes:
                name = code_name(code)
                acks[name] = acks.get(name, 0) + 1
            if rows > len(a.refused_codes):
                name = code_name(a.code)
                acks[name] = acks.get(name, 0) + rows - len(a.refused_codes)
        elif kind == "push":
            pushes = sum(max(1, len(m.queue_ids)) for m in frame.push.messages)
        elif kind == "push_columns":
            pushes = _push_columns_rows(frame.push_columns)
        with self._lock:
            self.frames[kind] = self.frames.get(kind, 0) + 1
            for name, n in acks.items():
                self.acks[name] = self.acks.get(name, 0) + n
            self.pushes += pushes

    def families(self, prefix: str = "taproot") -> Iterator[Metric]:
        with self._lock:
            acks, frames, pushes = dict(self.acks), dict(self.frames), self.pushes
            puts, confirms = self.puts, self.confirms
        yield CounterMetricFamily(f"{prefix}_puts_received", "PUTs received from downstream (clients or "
                                  "relays), before any check", value=puts)
        yield CounterMetricFamily(f"{prefix}_confirms_received", "CONFIRMs received from downstream (seqs "
                                  "named; a repeated one counts again)", value=confirms)
        sent = CounterMetricFamily(f"{prefix}_acks_sent", "ACKs sent downstream (to clients or relays), by code",
                                   labels=["code"])
        for name, n in sorted(acks.items()):
            sent.add_metric([name], n)
        yield sent
        yield CounterMetricFamily(f"{prefix}_pushes_sent", "messages pushed downstream (a copy per queue of "
                                  "a session: fanout apps and broadcast consumers below a relay count each)",
                                  value=pushes)
        out = CounterMetricFamily(f"{prefix}_frames_sent", "frames sent downstream, by kind", labels=["kind"])
        for name, n in sorted(frames.items()):
            out.add_metric([name], n)
        yield out


def _push_columns_rows(frame: pb.PushColumns) -> int:
    """Messages a PushColumns frame carries, counted per queue it goes to,
    from its header (the body is not decoded)."""
    return frame.count * max(1, len(frame.queue_ids))


class QueueLabels:
    """Bounded queue labels: the first `max_series` queues a role reports keep
    their own; every later one is reported as queue="_other" (summed), so a
    domain with a million queues does not make a million series."""

    def __init__(self, max_series: int):
        self.max_series = max_series
        self._named: set[tuple[str, str]] = set()

    def label(self, domain: str, queue: str) -> str:
        key = (domain, queue)
        if key in self._named:
            return queue
        if len(self._named) < self.max_series:
            self._named.add(key)
            return queue
        return OTHER_QUEUES


class Summed:
    """Per-label-set sums for one metric family, made at scrape time."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, ...], float] = {}

    def add(self, labels: tuple[str, ...], value: float) -> None:
        self.values[labels] = self.values.get(labels, 0) + value

    def counter(self, name: str, doc: str, labels: Sequence[str]) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=list(labels))
        for key, value in sorted(self.values.items()):
            family.add_metric(list(key), value)
        return family

    def gauge(self, name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=list(labels))
        for key, value in sorted(self.values.items()):
            family.add_metric(list(key), value)
        return family


class FunctionCollector(Collector):
    """A collector from a function (the role's own `collect`)."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]):
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


def registry_for(collect: Callable[[], Iterable[Metric]], auth: Authenticator | None = None) -> CollectorRegistry:
    """A registry of the role's collector and the process's own metrics
    (CPU, memory, file descriptors: `process_*`); with `auth`, its refusals."""
    from prometheus_client.process_collector import ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    registry.register(FunctionCollector(collect))
    registry.register(FunctionCollector(_streams))
    if auth is not None:
        registry.register(FunctionCollector(lambda: [_refusals(auth)]))
    return registry


def _refusals(auth: Authenticator) -> Metric:
    family = CounterMetricFamily("taproot_auth_refusals", "opens, admin commands and sessions refused for their "
                                 "token (UNAUTHENTICATED: none, unknown, revoked, expired; NOT_AUTHORIZED: a right "
                                 "missing)", labels=["code"])
    for code in ("UNAUTHENTICATED", "NOT_AUTHORIZED"):
        family.add_metric([code], auth.refusals.get(code, 0))
    return family


def _streams() -> Iterator[Metric]:
    counts = bundles.STREAMS
    for name, what, into, out in (
            ("messages", "gRPC messages the process's Session streams read and wrote (a bundle of frames is one)",
             counts.messages_in, counts.messages_out),
            ("frames", "frames the process's Session streams read and wrote (each frame of a bundle counts)",
             counts.frames_in, counts.frames_out)):
        family = CounterMetricFamily(f"taproot_stream_{name}", what, labels=["direction"])
        family.add_metric(["in"], into)
        family.add_metric(["out"], out)
        yield family


Route = Callable[[], tuple[str, bytes]]   # -> (content type, body)


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: Mapping[str, Route] = {}
    server_version = "taproot"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        route = self.routes.get(path)
        if route is None:
            self._reply(404, "text/plain; charset=utf-8", f"no {path} here; try /metrics\n".encode())
            return
        try:
            content_type, body = route()
        except Exception as exc:   # a scrape must never take the server down
            log.exception("http %s failed", path)
            self._reply(500, "text/plain; charset=utf-8", f"{type(exc).__name__}: {exc}\n".encode())
            return
        self._reply(200, content_type, body)

    def _reply(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:   # noqa: A002 (http.server's signature)
        log.debug("http %s: " + format, self.address_string(), *args)


class HttpServer:
    """`/metrics` from `registry`, plus `routes`, on host:port (0: any free
    port; `port` is the bound one), on a daemon thread. A port that cannot
    be bound ends the role with a message that says which (SystemExit)."""

    def __init__(self, role: str, host: str, port: int, registry: CollectorRegistry,
                 routes: Mapping[str, Route] | None = None):
        def metrics() -> tuple[str, bytes]:
            return "text/plain; version=0.0.4; charset=utf-8", generate_latest(registry)

        handler = type("Handler", (_Handler,), {"routes": {"/metrics": metrics, **(routes or {})}})
        try:
            self._server = http.server.ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise SystemExit(f"{role}: cannot serve metrics on {host}:{port}: {exc.strerror or exc} "
                             f"(set its http_port in cluster.toml; -1 turns HTTP off)") from None
        self._server.daemon_threads = True
        self.host = host
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    def start(self) -> "HttpServer":
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
