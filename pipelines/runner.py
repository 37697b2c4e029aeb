"""`taproot pipeline`: runs the dedup query of every partition in one Spark app."""

from __future__ import annotations

import dataclasses
import functools
import logging
import signal
import tempfile
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import grpc
import pyarrow as pa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

import conf
from pipelines.dedup import dedup_query_name, start_dedup_query
from pipelines.fanout import DomainsReloader
from pipelines.priority import LagGovernor, lag_governor, yield_cpu
from pipelines.retention import maintain
from pipelines.supervisor import STOP_FINISH_S, SupervisedQuery
from protocol import pb, pb_grpc
from protocol.auth import metadata as auth_metadata
from protocol.metrics import LATENCY_BUCKETS, HttpServer, WeightedHistogram, registry_for
from protocol.stream import write_ready_file
from protocol.tls import ClientTls
from protocol.tls import channel as tls_channel
from storage import deltars, tables
from storage import spark as spark_factory
from storage.leases import LeaseTable
from storage.property_kinds import PropertyKinds

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


log = logging.getLogger(__name__)


class DeliveryNotifier:
    """Tells a partition's primary that new delivery rows exist. The primary is
    whoever holds the partition's lease (its address is in the lease table);
    `fallback` is used while no lease names one. Best effort: the primary also
    tails the log, so a lost notice costs latency, never messages."""

    LEASE_REFRESH_S = 1.0

    def __init__(self, data_dir: str | None, fallback: str | None, tls: ClientTls | None = None,
                 token: str | None = None):
        self._data_dir = data_dir
        self._fallback = fallback
        self._tls = tls
        self._metadata = auth_metadata(token)   # the cluster token, with [auth] on
        self._stubs: dict[str, pb_grpc.BrokerStub] = {}
        self._leases: dict[int, tuple[float, str | None]] = {}
        self._lease_tables: dict[int, "LeaseTable"] = {}  # one handle each: a refresh reads only new commits

    def _address(self, partition: int) -> str | None:
        if self._data_dir is None:
            return self._fallback
        checked, address = self._leases.get(partition, (0.0, None))
        if time.monotonic() - checked > self.LEASE_REFRESH_S:
            table = self._lease_tables.get(partition)
            if table is None:
                table = self._lease_tables[partition] = LeaseTable(
                    tables.PartitionPaths(self._data_dir, partition).lease)
            try:
                view = table.read()
            except Exception:  # a lease being written: keep the last answer
                view = None
            address = view.address if view is not None and view.address and not view.released else address
            self._leases[partition] = (time.monotonic(), address)
        return address or self._fallback

    def __call__(self, partition: int, batch_id: int) -> None:
        address = self._address(partition)
        if address is None:
            return
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = pb_grpc.BrokerStub(tls_channel(address, self._tls))
        try:
            stub.NotifyDelivery(pb.DeliveryNotice(partition=partition), timeout=1.0, metadata=self._metadata)
        except grpc.RpcError as exc:
            self._leases.pop(partition, None)  # perhaps a failover: look the primary up again
            log.debug("delivery notice for partition %d not delivered: %s", partition, exc.code())


def wait_for_table(path: str, stop: threading.Event, say_every_s: float = 30) -> bool:
    """Wait for the table at `path` (a primary creates its partition's PUT log
    when it first takes the lease) for as long as it takes, so the pipeline may
    start before any node; False only if told to stop first."""
    started = said = time.monotonic()
    while not stop.is_set():
        if deltars.try_open(path) is not None:
            return True
        if time.monotonic() - said >= say_every_s:
            said = time.monotonic()
            log.warning("waiting %.0f s for %s: no primary has created it yet (is a node running?)",
                        said - started, path)
        stop.wait(0.2)
    return False


LOG_RETENTION = "delta.logRetentionDuration"
# Delta wants the log kept at least as long as this, and refuses to time
# travel further back: the same value for both.
FILE_RETENTION = "delta.deletedFileRetentionDuration"


def create_delivery_table(spark: "SparkSession", path: str, log_retention_minutes: int | None = None) -> None:
    """Create the delivery log (Spark owns it) with its documented schema and
    properties; add the columns a table made by an older Taproot lacks.

    `log_retention_minutes` (`maintenance.delivery_log_retention_minutes`):
    how long its commit files are kept, so how far back time travel reaches.
    The log gets a commit per micro-batch, and on a local disk every refresh
    by a reader (the primary's tail) lists all of `_delta_log/`. Spark's own
    cleanup keeps everything since the midnight before the retention began
    (a day or two of micro-batches: 70,000-140,000 files at one every 2.4 s),
    so the partition's primary trims the log to the retention itself
    (`Partition._trim_delivery_log`). The deleted-file retention gets the
    same value (Delta requires it to be no longer than the log's, and will
    not time travel past it); VACUUM is given its retention explicitly
    (`pipelines/retention.py`), so this does not shorten it. Set on a table
    that exists too, once."""
    retention = ({} if log_retention_minutes is None else
                 {key: f"interval {log_retention_minutes} minutes" for key in (LOG_RETENTION, FILE_RETENTION)})
    properties = ", ".join(f"'{k}' = '{v}'" for k, v in {**tables.TABLE_PROPERTIES, **retention}.items())
    spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({tables.spark_ddl(tables.DELIVERY_SCHEMA)}) "
              f"USING DELTA TBLPROPERTIES ({properties})")
    if retention:
        current = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}
        if any(current.get(k) != v for k, v in retention.items()):
            changes = ", ".join(f"'{k}' = '{v}'" for k, v in retention.items())
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({changes})")
    existing = set(spark.read.format("delta").load(path).columns)
    missing = [f for f in tables.DELIVERY_SCHEMA if f.name not in existing]
    if missing:
        ddl = tables.spark_ddl(pa.schema([f.with_nullable(True) for f in missing]))
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({ddl})")


def warm_up(spark: "SparkSession", history_window_ms: int) -> float:
    """Run the dedup path twice on scratch tables before taking real traffic.

    A cold JVM on 2 cores spends tens of seconds in class loading and code
    generation on its first Delta-to-Delta batches; paying that here keeps it
    out of the first messages' PUT->PUSH latency. Returns the seconds spent."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="taproot-warmup-") as scratch:
        paths = tables.PartitionPaths(scratch, 0)
        puts = deltars.Appender(paths.puts, tables.PUTS_SCHEMA)
        create_delivery_table(spark, paths.delivery)
        now = datetime.now(timezone.utc)
        for round_ in range(2):
            # Three GUIDs and a repeat of the first, so the dedup path runs too.
            guids = [bytes([round_, i]) * 8 for i in (0, 1, 2, 0)]
            puts.append(pa.Table.from_pylist([
                dict(domain="warmup", queue="q", guid=g, seq=round_ * 4 + i, payload=b"", properties=[],
                     property_types=[], producer_time=now, put_time=now, epoch=0, compression=None)
                for i, g in enumerate(guids)], schema=tables.PUTS_SCHEMA))
            query = start_dedup_query(spark, paths, history_window_ms, available_now=True)
            query.awaitTermination()
        spark.read.format("delta").load(paths.delivery).count()
    return time.monotonic() - started


def run_maintenance(spark: "SparkSession", config: conf.ClusterConfig) -> None:
    """Scheduled retention and maintenance; a failure is logged and retried next time
    (a conflict with the primary's own compaction is the usual one)."""
    try:
        log.info("maintenance:\n%s", maintain(spark, config).summary())
    except Exception:
        log.exception("maintenance failed; next attempt in %d s", config.maintenance.interval_s)


@dataclasses.dataclass(frozen=True)
class DedupState:
    """What a micro-batch did to the dedup operator's state, from its progress.

    Its state store does not count the GUIDs it holds
    (`trackTotalNumberOfRows` off, `storage.spark.session`: counting costs a
    RocksDB read before every write, about 4 µs of the pipeline's 22-30 a
    row): the GUIDs held are the sum, over the query's batches, of those it
    added less those it expired (`PipelineStats.batch`)."""
    added: int           # new GUIDs written to the state (a duplicate within the window writes none)
    removed: int         # GUIDs expired from it
    eviction_ms: int     # its tasks' time expiring GUIDs (a scan of every one of them)

    @classmethod
    def of(cls, progress: Mapping[str, Any]) -> "DedupState | None":
        operators = progress.get("stateOperators") or []
        if not operators:
            return None
        return cls(added=sum(int(o.get("numRowsUpdated", 0)) for o in operators),
                   removed=sum(int(o.get("numRowsRemoved", 0)) for o in operators),
                   eviction_ms=sum(int(o.get("allRemovalsTimeMs", 0)) for o in operators))

    def held_after(self, before: int) -> int:
        """GUIDs held after this batch, `before` it. After the query restarts,
        it expires GUIDs added before the restart, which its count did not
        see: a lower bound (never below 0) until one history window has
        passed, exact from then on."""
        return max(0, before + self.added - self.removed)


def _epoch_s(text: str) -> float:
    """A progress timestamp ("2026-11-29T19:02:03.456Z") as epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class AuthorityLag:
    """How far the dedup query runs behind the PUT log, from its progress: the
    age of the oldest PUT it has not judged yet, in seconds, as the bench's
    authority lag (PUT commit -> delivery row) measures it afterwards.

    `put_time` is the primary's commit time, so each batch's event times date
    its rows. A finished batch with rows judged its oldest row that late
    (its end minus its earliest `put_time`). While a batch with new data
    runs, its rows were committed after both the newest row judged before
    and the start of the last trigger, so the oldest of them is at most
    `now` minus the later of the two old: under load, batches run back to
    back and that is their lag as it grows. A trigger that found no rows
    (Spark reports one every 10 s while idle) leaves nothing waiting.
    Before its first report, a running batch is at least as old as the
    estimate (`since`, when the query started)."""

    def __init__(self, since: float | None = None) -> None:
        self.judged_s = 0.0           # the last batch's oldest row: its age when judged
        self._since = time.time() if since is None else since   # new rows are younger than this (epoch s)

    def batch(self, progress: Mapping[str, Any]) -> None:
        try:
            started = _epoch_s(progress["timestamp"])
            ended = started + progress.get("durationMs", {}).get("triggerExecution", 0) / 1000
            event = progress.get("eventTime") or {}
            if progress.get("numInputRows", 0) and "min" in event:
                self.judged_s = max(0.0, ended - _epoch_s(event["min"]))
                self._since = max(started, _epoch_s(event["max"]))
            else:
                self.judged_s, self._since = 0.0, started
        except (KeyError, TypeError, ValueError):
            pass   # a progress without the fields: the estimate stays as it was

    def now_s(self, running: bool, now: float) -> float:
        """The lag now; `running`: a trigger with new data is in progress."""
        if running:
            return max(0.0, now - self._since)
        return self.judged_s


class PipelineStats:
    """The micro-batches of each query, for the pipeline's metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batches: dict[str, int] = {}
        self.rows: dict[str, int] = {}
        self.seconds: dict[str, WeightedHistogram] = {}
        self.active: dict[str, bool] = {}
        self.state_rows: dict[str, int] = {}        # GUIDs in the dedup history after the last batch (DedupState)
        self.eviction_s: dict[str, float] = {}      # time its tasks spent expiring the history, all batches
        self.lag: dict[str, AuthorityLag] = {}
        self.lag_s: dict[str, float] = {}           # the last estimate, for /metrics
        self.governor: LagGovernor | None = None
        self.supervised: list[SupervisedQuery] = []   # each query's restarts

    def batch(self, query: str, rows: int, seconds: float, state: DedupState | None = None) -> None:
        with self._lock:
            self.batches[query] = self.batches.get(query, 0) + 1
            self.rows[query] = self.rows.get(query, 0) + rows
            self.seconds.setdefault(query, WeightedHistogram(LATENCY_BUCKETS)).observe(seconds)
            if state is not None:
                self.state_rows[query] = state.held_after(self.state_rows.get(query, 0))
                self.eviction_s[query] = self.eviction_s.get(query, 0.0) + state.eviction_ms / 1000

    def history(self, query: str) -> int:
        """GUIDs in `query`'s dedup history after its last batch (`DedupState`)."""
        with self._lock:
            return self.state_rows.get(query, 0)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            batches, rows, seconds, active = dict(self.batches), dict(self.rows), dict(self.seconds), \
                dict(self.active)
            state_rows, eviction_s, lag_s = dict(self.state_rows), dict(self.eviction_s), dict(self.lag_s)
        done = CounterMetricFamily("taproot_pipeline_batches", "micro-batches finished", labels=["query"])
        read = CounterMetricFamily("taproot_pipeline_input_rows", "PUT-log rows the micro-batches read",
                                   labels=["query"])
        took = HistogramMetricFamily("taproot_pipeline_batch_seconds", "one micro-batch, start to commit",
                                     labels=["query"])
        running = GaugeMetricFamily("taproot_pipeline_query_active", "1 while the query runs", labels=["query"])
        history = GaugeMetricFamily("taproot_pipeline_dedup_history_guids",
                                    "GUIDs the dedup state holds (the domain's history window): added less "
                                    "expired, counted since the query started (after a restart, a lower bound "
                                    "for one window)", labels=["query"])
        evicting = CounterMetricFamily("taproot_pipeline_dedup_eviction_seconds",
                                       "task time spent scanning the dedup state for expired GUIDs "
                                       "(Spark scans all of it every micro-batch)", labels=["query"])
        behind = GaugeMetricFamily("taproot_pipeline_authority_lag_seconds",
                                   "age of the oldest PUT the query has not judged (an estimate from its "
                                   "progress)", labels=["query"])
        for name in sorted(set(batches) | set(active)):
            done.add_metric([name], batches.get(name, 0))
            read.add_metric([name], rows.get(name, 0))
            if name in seconds:
                seconds[name].add_to(took, (name,))
            running.add_metric([name], int(active.get(name, False)))
            if name in state_rows:
                history.add_metric([name], state_rows[name])
                evicting.add_metric([name], eviction_s[name])
            if name in lag_s:
                behind.add_metric([name], lag_s[name])
        restarted = CounterMetricFamily("taproot_pipeline_query_restarts",
                                        "times the query was started again from its checkpoint after it "
                                        "stopped with an error", labels=["query"])
        for supervised in list(self.supervised):
            restarted.add_metric([supervised.name], supervised.restarts)
        yield from (done, read, took, running, history, evicting, behind, restarted)
        if self.governor is not None:
            yield GaugeMetricFamily("taproot_pipeline_cpu_full_share",
                                    "1 while the pipeline, behind by cpu_full_share_lag_s, takes an equal CPU "
                                    "share (autogroup nice 0) instead of yielding", value=int(self.governor.full_share))
            yield CounterMetricFamily("taproot_pipeline_cpu_full_share_changes",
                                      "times the pipeline went to an equal CPU share", value=self.governor.changes)

    def lag_of(self, query: str) -> AuthorityLag:
        """The query's lag estimate, made at its first report or observation."""
        return self.lag.setdefault(query, AuthorityLag())

    def observe(self, query: "StreamingQuery", now: float) -> float:
        """The query's authority lag now (`AuthorityLag`), recorded for /metrics."""
        status = query.status
        lag = self.lag_of(query.name).now_s(bool(status.get("isTriggerActive") and status.get("isDataAvailable")), now)
        with self._lock:
            self.lag_s[query.name] = lag
        return lag

    def govern(self, lag_s: float) -> None:
        """Give the pipeline its CPU share back while it is behind (`LagGovernor`)."""
        if self.governor is not None:
            said = self.governor.observe(lag_s)
            if said is not None:
                log.info("%s", said)


def log_progress(query: "StreamingQuery", logged: dict[str, tuple[str, int]],
                 stats: PipelineStats | None = None) -> None:
    """One log line per new micro-batch: its rows, its duration, and where the
    time went. While idle, Spark reports a trigger that found no data every
    10 s under the id the next batch will take: such a report is no batch
    (nothing ran, no `addBatch`) and only tells the lag that nothing waits.
    Reports are told apart by their start time, then their id."""
    for progress in query.recentProgress:
        key = (str(progress.get("timestamp", "")), int(progress["batchId"]))
        if key <= logged.get(query.name, ("", -1)):
            continue
        logged[query.name] = key
        if stats is not None:
            stats.lag_of(query.name).batch(progress)
        durations = progress.get("durationMs", {})
        if "addBatch" not in durations:
            continue
        state = DedupState.of(progress)
        if stats is not None:
            stats.batch(query.name, progress.get("numInputRows", 0), durations.get("triggerExecution", 0) / 1000,
                        state)
        log.info("%s batch %d: %d rows in %d ms (%s)%s", query.name, key[1], progress.get("numInputRows", 0),
                 durations.get("triggerExecution", 0),
                 ", ".join(f"{k} {v}" for k, v in sorted(durations.items()) if k != "triggerExecution"),
                 "" if state is None else
                 f"; dedup history {'' if stats is None else f'{stats.history(query.name)} GUIDs, '}"
                 f"+{state.added} -{state.removed}, expiring them {state.eviction_ms} ms")


def run(config: conf.ClusterConfig, *, node_address: str | None = None, ready_file: str | None = None,
        stop_event: threading.Event | None = None, cluster_file: str | None = None, warm: bool = True,
        http_port: int | None = None, connect_port: int | None = None) -> int:
    """`http_port`: metrics there (0: any free port, -1: none); None: `[pipeline] http_port`.
    `connect_port`: the Spark Connect endpoint there (the same choices); None: `[pipeline] connect_port`."""
    if connect_port is not None:
        config = dataclasses.replace(config, pipeline=dataclasses.replace(config.pipeline, connect_port=connect_port))
    stop = stop_event or threading.Event()
    if stop_event is None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    log.info("%s", yield_cpu(config.pipeline.cpu_nice))
    stats = PipelineStats()
    stats.governor = lag_governor(config.pipeline.cpu_nice, config.pipeline.cpu_full_share_lag_s)
    if stats.governor is not None:
        log.info("the pipeline takes a full CPU share while its authority lag is over %g s",
                 config.pipeline.cpu_full_share_lag_s)
    port = config.pipeline.http_port if http_port is None else http_port
    http = None if port < 0 else HttpServer("pipeline", config.pipeline.http_host, port,
                                            registry_for(stats.collect)).start()
    try:
        return _run(config, stop, stats, node_address, ready_file, cluster_file, warm,
                    http.port if http is not None else None)
    finally:
        if http is not None:
            http.stop()


CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
# The endpoint's views are registered again within 10 s when a table they
# read appears; within PROPERTIES_CHECK_S when the PUT logs hold a property
# name or type the views lack (a column of `taproot_messages`: only the data
# files written since the last check are read, `storage.property_kinds`);
# and every VIEWS_REFRESH_S (a table's columns, which a newer writer adds).
PROPERTIES_CHECK_S = 60.0
VIEWS_REFRESH_S = 600.0
# The views' warm-up runs while the authority lag is under this, and gives way
# (its jobs interrupted, tried again later) when the lag reaches it.
VIEWS_WARM_UP_LAG_S = 5.0
VIEWS_WARM_UP_TAG = "taproot-views-warm-up"


def connect_endpoint(config: conf.ClusterConfig) -> tuple[dict[str, str], int | None]:
    """The Spark settings that serve Spark Connect from the pipeline's Spark
    (`[pipeline] connect_port`; 0: a free port picked now), and its port;
    ({}, None) with the endpoint off, or when its port cannot be bound."""
    import socket

    port, host = config.pipeline.connect_port, config.pipeline.connect_host
    if port < 0:
        return {}, None
    # Spark fails to start at all when a plugin cannot bind its port: the
    # authority must not stop for want of its query endpoint, so a port in
    # use (another cluster's, a stale process's) leaves the endpoint off.
    try:
        with socket.socket() as probe:
            probe.bind((host, port))
            port = probe.getsockname()[1]
    except OSError as exc:
        log.error("Spark Connect not served: %s:%d cannot be bound (%s); the pipeline runs without it",
                  host, port, exc.strerror or exc)
        return {}, None
    settings = {"spark.plugins": CONNECT_PLUGIN, "spark.connect.grpc.binding.address": host,
                "spark.connect.grpc.binding.port": str(port)}
    # With [auth] on, every call must bear the endpoint's token (Spark's own
    # check; Spark redacts the value wherever it shows its configuration).
    try:
        token = conf.connect_token(config, serving=True)
    except conf.ConfigError as exc:
        log.error("Spark Connect not served: %s; the pipeline runs without it", exc)
        return {}, None
    if token is not None:
        settings["spark.connect.authenticate.token"] = token
    return settings, port


class SharedViews:
    """The Taproot views in the pipeline's session catalog, where every Spark
    Connect session sees them; registered again when a table they read
    appears (a partition's first dead letter, say), when messages bring a
    new property (it becomes a column) and every `VIEWS_REFRESH_S`."""

    def __init__(self, spark: "SparkSession", config: conf.ClusterConfig, warm: bool = False):
        self.spark, self.config = spark, config
        self.present: frozenset[str] = frozenset()
        self.next_refresh = self.next_check = self.next_properties = 0.0
        self.warm = warm                            # a warm-up is still to run
        self._warming: SparkSession | None = None   # the warm-up's session while it runs
        self._warming_lock = threading.Lock()
        self._give_way = threading.Event()          # set: the running warm-up stops at its next step
        self.properties = PropertyKinds()           # kept between registrations: new files are read only
        self.registered: dict[str, frozenset[str]] | None = None   # the properties the views have columns for

    def _paths(self) -> list[tables.PartitionPaths]:
        return [tables.PartitionPaths(self.config.data_dir, i) for i in range(self.config.partitions)]

    def _tables(self) -> frozenset[str]:
        every = (path for p in self._paths() for path in (p.puts, p.delivery, p.confirms, p.dead_letters,
                                                          p.disagreements))
        return frozenset(path for path in every if deltars.try_open(path) is not None)

    def _new_properties(self, now: float) -> bool:
        if now < self.next_properties:
            return False
        self.next_properties = now + PROPERTIES_CHECK_S
        try:
            return self.properties.read([p.puts for p in self._paths()]) != self.registered
        except Exception as exc:  # read again at the next check
            log.warning("message properties not read: %s", str(exc).splitlines()[0])
            return False

    def refresh(self, now: float, lag_s: float = 0.0) -> None:
        """Register the views again if they need it; start or interrupt their
        warm-up by the authority lag `lag_s`."""
        self._govern_warm_up(lag_s)
        if now < self.next_check:   # opening every table's log is not free: every 10 s at most
            return
        self.next_check = now + 10
        present = self._tables()
        if present == self.present and now < self.next_refresh and not self._new_properties(now):
            return
        from storage.views import register_views
        started = time.monotonic()
        try:
            register_views(self.spark, self.config.data_dir, list(range(self.config.partitions)), persistent=True,
                           properties=self.properties)
        except Exception as exc:  # a view that cannot be made now is tried again; the pipeline goes on
            log.warning("Spark Connect views not registered: %s", str(exc).splitlines()[0])
            self.next_refresh = now + 30
            return
        self.present, self.next_refresh = present, now + VIEWS_REFRESH_S
        self.registered, self.next_properties = self.properties.last, now + PROPERTIES_CHECK_S
        log.info("Spark Connect views registered over %d tables in %.1f s (%d message properties)", len(present),
                 time.monotonic() - started, len(self.registered))

    def _govern_warm_up(self, lag_s: float) -> None:
        """The warm-up (`_warm_up`) is for the first interactive queries'
        latency; the authority comes first. It starts while the authority lag
        is under `VIEWS_WARM_UP_LAG_S`, on a thread of its own (this loop goes
        on logging progress, governing the CPU share and watching the
        queries), and its jobs are interrupted when the lag reaches it: it
        runs again once the authority has caught up."""
        with self._warming_lock:
            if self._warming is not None:
                if lag_s >= VIEWS_WARM_UP_LAG_S and not self._give_way.is_set():
                    log.info("Spark Connect views' warm-up gives way to the authority (lag %.1f s); again once it "
                             "is under %.0f s", lag_s, VIEWS_WARM_UP_LAG_S)
                    self._give_way.set()
                    self._warming.interruptTag(VIEWS_WARM_UP_TAG)
                return
            if not self.warm or lag_s >= VIEWS_WARM_UP_LAG_S:
                return
            self.warm = False
            self._give_way.clear()
            self._warming = self.spark.newSession()
            self._warming.addTag(VIEWS_WARM_UP_TAG)
        threading.Thread(target=self._warm_up, args=(self._warming,), name=VIEWS_WARM_UP_TAG, daemon=True).start()

    def _warm_up(self, session: "SparkSession | None" = None) -> None:
        """Run the backlog view as `taproot sql` does (Delta's Kernel reads,
        `storage.spark.DELTA_CONNECTOR_MODE`) and as a notebook does (the classic
        ones), a few times, in a session of its own over scratch tables of a few
        rows: a new cluster's first queries then take about a second, not 3-5 s
        (JIT, Delta's classes), and the warm-up costs the same whatever the
        cluster's tables hold (over theirs, it took 45 s of a core at 1.4M
        messages, while the authority was catching up)."""
        started = time.monotonic()
        session = session or self.spark.newSession()
        try:
            from storage.views import register_views
            with tempfile.TemporaryDirectory(prefix="taproot-views-warmup-") as scratch:
                write_scratch_tables(scratch)
                register_views(session, scratch, [0])
                for mode in ("STRICT", "STRICT", "AUTO"):
                    if self._give_way.is_set():
                        raise InterruptedError("the authority is behind")
                    session.conf.set(spark_factory.DELTA_CONNECTOR_MODE, mode)
                    session.sql("SELECT * FROM taproot_backlog").collect()
        except Exception as exc:  # a warm-up that fails costs only the first queries' time
            interrupted = self._give_way.is_set()
            with self._warming_lock:
                self._warming = None
                self.warm = self.warm or interrupted     # given way to the authority: again later
            if not interrupted:
                log.warning("Spark Connect views not warmed up: %s", str(exc).splitlines()[0])
            return
        with self._warming_lock:
            self._warming = None
        log.info("Spark Connect views warmed up in %.1f s", time.monotonic() - started)


def write_scratch_tables(data_dir: str) -> None:
    """Partition 0 of a cluster's tables, with a few rows each: three messages
    delivered to two apps, one confirmed, one dead-lettered, one disagreement."""
    paths = tables.PartitionPaths(data_dir, 0)
    now = datetime.now(timezone.utc)
    guids = [bytes([i]) * 16 for i in range(3)]
    common = dict(domain="warmup", queue="q", producer_time=now)
    rows = {
        (paths.puts, tables.PUTS_SCHEMA): [
            dict(common, guid=g, seq=i, payload=b"x", properties=[("k", "v")], property_types=[("k", "string")],
                 put_time=now, epoch=0, compression=None) for i, g in enumerate(guids)],
        (paths.delivery, tables.DELIVERY_SCHEMA): [
            dict(common, partition=0, guid=g, seq=i, put_time=now, delivered_time=now, batch_id=0, apps=["a", "b"])
            for i, g in enumerate(guids)],
        (paths.confirms, tables.CONFIRMS_SCHEMA): [
            dict(domain="warmup", queue="q", app_id="a", guid=guids[0], seq=0, confirm_time=now)],
        (paths.dead_letters, tables.DEAD_LETTERS_SCHEMA): [
            dict(common, app_id="b", guid=guids[1], seq=1, payload=b"x", properties=[], property_types=[],
                 compression=None, delivery_count=5, reason="max_delivery_attempts", detail=None, dead_time=now)],
        (paths.disagreements, tables.DISAGREEMENTS_SCHEMA): [
            dict(domain="warmup", queue="q", guid=guids[2], seq=2, express_apps=["a"], pipeline_apps=["a", "b"],
                 late_apps=["b"], kind="apps", epoch=0, detected_time=now)],
    }
    for (path, schema), table_rows in rows.items():
        deltars.Appender(path, schema, durable=False).append(pa.Table.from_pylist(table_rows, schema=schema))


def _run(config: conf.ClusterConfig, stop: threading.Event, stats: PipelineStats, node_address: str | None,
         ready_file: str | None, cluster_file: str | None, warm: bool, http_port: int | None) -> int:
    options = conf.spark_options(config)
    endpoint, connect_port = connect_endpoint(config)
    options["extra_conf"] = {**options["extra_conf"], **endpoint}
    spark = spark_factory.session("taproot-pipeline", shuffle_partitions=config.pipeline.shuffle_partitions,
                                  **options)
    notifier = DeliveryNotifier(config.data_dir, node_address or config.nodes[0].address, conf.client_tls(config),
                                conf.cluster_token(config))
    window = config.history_window_ms
    domains = DomainsReloader(conf.domains_dir(cluster_file), config.domains)
    if warm:
        log.info("pipeline warmed up in %.1f s", warm_up(spark, window))
    queries: list[SupervisedQuery] = []
    for index in range(config.partitions):
        paths = tables.PartitionPaths(config.data_dir, index)
        if not wait_for_table(paths.puts, stop):
            log.info("stopped while waiting for partition %d's PUT log", index)
            return 0
        create_delivery_table(spark, paths.delivery, config.maintenance.delivery_log_retention_minutes)
        queries.append(SupervisedQuery(dedup_query_name(index), functools.partial(
            start_dedup_query, spark, paths, window, trigger_interval_ms=config.pipeline.trigger_interval_ms,
            max_files_per_trigger=config.pipeline.max_files_per_trigger, on_batch=notifier, domains=domains)))
    stats.supervised = queries
    log.info("pipeline running %d dedup quer%s (history window %d ms)", len(queries),
             "y" if len(queries) == 1 else "ies", window)
    # The endpoint's views are registered in the loop below, after the ready
    # file: reading every table's schema and the PUT logs' property names
    # takes seconds that the pipeline's start need not wait for.
    views = SharedViews(spark, config, warm=warm) if connect_port is not None else None
    if views is not None:
        log.info("Spark Connect: sc://%s:%d", config.pipeline.connect_host, connect_port)
    write_ready_file(ready_file, queries=[q.name for q in queries], http_port=http_port, connect_port=connect_port)
    logged: dict[str, tuple[str, int]] = {}
    interval_s = config.maintenance.interval_s
    next_maintenance = time.monotonic() + interval_s
    gave_up = None
    while not stop.is_set() and gave_up is None:
        stop.wait(0.5)
        lag_s = 0.0
        for supervised in queries:
            supervised.check()
            if supervised.gave_up:
                gave_up = supervised
            stats.active[supervised.name] = supervised.active
            q = supervised.query
            if q is not None:
                log_progress(q, logged, stats)
                lag_s = max(lag_s, stats.observe(q, time.time()))
        stats.govern(lag_s)
        if views is not None:
            views.refresh(time.monotonic(), lag_s)
        if interval_s and time.monotonic() >= next_maintenance:
            run_maintenance(spark, dataclasses.replace(config, domains=domains()))
            next_maintenance = time.monotonic() + interval_s
    # Each query stops between batches if its batch in flight ends in time.
    deadline = time.monotonic() + STOP_FINISH_S
    for supervised in queries:
        supervised.stop(deadline)
    if gave_up is not None:
        log.error("query %s could not be started again %d times in a row (last: %s); the pipeline exits for "
                  "whatever runs it to start it afresh", gave_up.name, gave_up.start_failures, gave_up.last_error)
    spark.stop()
    return 1 if gave_up is not None else 0
