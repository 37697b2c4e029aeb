"""`taproot run`: start the embedded cluster, show it working, serve until Ctrl-C.

The order a newcomer sees: the nodes and proxies start (a few seconds) and
the cluster serves, with the commands to try printed then; the demo's
messages are delivered by the primaries' express lane (milliseconds after
each commit) while Spark starts; then the pipeline, the authority, decides
them again; then the demo queue is read as a Delta table with delta-rs (no
second JVM). Errors the roles log, and a role that exits, are printed on the
console as they happen.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, TypeVar

from taproot_ops import loadgen
from taproot_ops.console import Terminal, Waiting, say
from taproot_ops.embedded import ClusterStartError, EmbeddedCluster, Process, tail

DEMO_URI = "taproot://demo/orders"
FANOUT_URI = "taproot://events/orders"
T = TypeVar("T")
# How long the pipeline's Spark takes to start and warm up here (2 cores), for the live line.
PIPELINE_USUALLY_S = 30


class _Steps:
    """The numbered steps a run takes (four with demo traffic, two without)."""

    def __init__(self, demo: bool):
        self.total = 4 if demo else 2
        self.done = 0

    def __call__(self, text: str) -> None:
        self.done += 1
        say(f"\n[{self.done}/{self.total}] {text}")


# -- live errors ------------------------------------------------------------------------------------

_ERROR_LINE = re.compile(r"^\S+ \S+ (ERROR|CRITICAL) (.*)$")
ERROR_LINES_PER_TICK = 5


class RoleWatch(threading.Thread):
    """Prints, as they happen, the ERROR and CRITICAL lines of every role's
    log (a rejected domain reload, a failed commit) and a role that exits;
    `failed` is set by an exit."""

    def __init__(self, cluster: EmbeddedCluster, interval_s: float = 0.5):
        super().__init__(name="role-watch", daemon=True)
        self.cluster = cluster
        self.interval_s = interval_s
        self.failed = threading.Event()
        self._halt = threading.Event()
        # Only what is logged from now on: the logs are appended to run after run.
        self._offsets = {name: _size(process.log_file) for name, process in cluster.processes.items()}
        self._exited: set[str] = set()

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.check()

    def check(self) -> None:
        for name, process in list(self.cluster.processes.items()):
            self._new_errors(name, process)
            if name not in self._exited and process.popen.poll() is not None:
                self._exited.add(name)
                self.failed.set()
                say(f"   ! {name} exited with {process.popen.returncode}; the end of {process.log_file}:\n"
                    + "\n".join(f"     {line}" for line in tail(process.log_file, 12).splitlines()))

    def _new_errors(self, name: str, process: Process) -> None:
        offset = self._offsets.setdefault(name, 0)
        size = _size(process.log_file)
        if size <= offset:
            return
        with open(process.log_file, "rb") as fh:
            fh.seek(offset)
            text = fh.read(size - offset)
        end = text.rfind(b"\n") + 1        # whole lines only: the rest is read next time
        self._offsets[name] = offset + end
        errors = [m.group(1) + " " + m.group(2) for m in map(_ERROR_LINE.match, text[:end].decode(
            errors="replace").splitlines()) if m]
        for line in errors[:ERROR_LINES_PER_TICK]:
            say(f"   ! {name}: {line}")
        if len(errors) > ERROR_LINES_PER_TICK:
            say(f"   ! {name}: {len(errors) - ERROR_LINES_PER_TICK} more error line(s) in {process.log_file}")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# -- the demo's steps -------------------------------------------------------------------------------

def run_demo_traffic(address: str, count: int, serving_at: float | None = None) -> loadgen.ProduceResult:
    """`count` messages of 1 KiB to the demo queue, consumed and confirmed;
    only this run's count (messages left unconfirmed by an earlier client
    are confirmed and said apart)."""
    run_id = os.urandom(6).hex()
    say(f"   {count} messages of 1 KiB to {DEMO_URI} at 1,000/s through {address}, a consumer confirming each")
    ready = threading.Event()
    consumed: dict[str, loadgen.ConsumeResult] = {}
    consumer = threading.Thread(target=lambda: consumed.setdefault("result", loadgen.consume(
        address, DEMO_URI, count, idle_timeout_s=120, ready=ready,
        accept=lambda m: m.properties.get("run") == run_id)), daemon=True)
    consumer.start()
    ready.wait(30)
    with Waiting("posting and consuming", usually_s=count / 1000 + 1) as waiting:
        produced = loadgen.produce(address, DEMO_URI, count, size=1024, rate=1000,
                                   properties={"source": "demo", "region": "EU", "run": run_id})
        waiting.note(f"{produced.acked:,} ACKed")
        consumer.join(300)
    result = consumed.get("result", loadgen.ConsumeResult())
    if result.first_at is not None and serving_at is not None:
        first = result.push_latency_ms[0]
        say(f"   the first message was delivered {first:,.0f} ms after its PUT, "
            f"{result.first_at - serving_at:.1f} s after the cluster began serving")
    say(f"   posted {produced.posted:,}, ACKed {produced.acked:,}, failed {produced.failed}; "
        f"received and confirmed {result.received:,} (redelivered {result.redelivered})")
    if result.others:
        say(f"   also received and confirmed {result.others} message(s) an earlier client left unconfirmed")
    for error in produced.errors[:3]:
        say(f"   ! a PUT failed: {error}")
    say(f"   PUT->ACK  {loadgen.summary_ms(produced.ack_latency_ms)}")
    say(f"   PUT->PUSH {loadgen.summary_ms(result.push_latency_ms)}")
    in_order = result.guids == produced.guids[: len(result.guids)]
    say(f"   pushed in PUT order: {'yes' if in_order else 'no'}")
    return produced


def run_fanout_demo(address: str) -> None:
    """Fanout in the `events` domain: apps billing, audit and eu (eu subscribes
    to region = 'EU'). Each app gets its messages and confirms on its own."""
    from taproot import Session

    say(f"   fanout: 6 messages (3 EU, 3 US) to {FANOUT_URI}, apps billing, audit, eu (region = 'EU')")
    run_id = os.urandom(6).hex()
    with Session([address]) as session:
        apps = {app: session.open_queue(f"{FANOUT_URI}?id={app}", read=True) for app in ("billing", "audit", "eu")}
        with session.open_queue(FANOUT_URI, write=True) as producer:
            for f in [producer.post(b"order %d" % i, properties={"region": "EU" if i % 2 else "US", "run": run_id})
                      for i in range(6)]:
                f.result(timeout=60)
        for app, queue in apps.items():
            want = 3 if app == "eu" else 6
            got: list[Any] = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                # Until this run's share arrived, then what else comes within 0.5 s (a wrong extra would show).
                message = queue.get(timeout_s=0.5)
                if message is None:
                    if len(got) >= want:
                        break
                    continue
                queue.confirm(message)   # an earlier run's leftovers too
                if message.properties.get("run") == run_id:
                    got.append(message)
            regions = ",".join(str(m.properties.get("region")) for m in got)
            say(f"     ?id={app:<8} received {len(got)}: {regions}")
            queue.close()


def wait_for_pipeline(cluster: EmbeddedCluster, pipeline: Process, stop: threading.Event,
                      timeout_s: float = 300) -> bool:
    """Wait for the pipeline started in the background (or for Ctrl-C)."""
    deadline = time.monotonic() + timeout_s
    with Waiting("Spark starting and warming up", usually_s=PIPELINE_USUALLY_S) as waiting:
        while not stop.is_set():
            try:
                cluster.pipeline_ready(pipeline, 0.5)
                return True
            except ClusterStartError as exc:
                if pipeline.popen.poll() is not None or time.monotonic() > deadline:
                    waiting.failed = True
                    if pipeline.popen.poll() is None:
                        say(f"   ! {exc}")   # an exit the role watch reports, with the end of its log
                    return False
    return False


def wait_for_decisions(data_dir: str, partitions: int, started: float, expected: int,
                       stop: threading.Event) -> None:
    """The pipeline's decisions on the demo's messages: how long after each
    commit, and whether it agreed with the express lane."""
    from taproot_ops.bench.authority import authority_lag

    with Waiting("the pipeline deciding the demo's messages", usually_s=10) as waiting:
        authority = authority_lag(data_dir, partitions, "demo", started, expected, timeout_s=180,
                                  progress=False, on_progress=lambda n: waiting.note(f"{n:,} of {expected:,}"),
                                  stop=stop)
    lag = authority["lag_ms"]
    say(f"   the pipeline wrote {authority['rows']:,} delivery rows"
        + (f", p50 {lag['p50'] / 1000:,.1f} s / p99 {lag['p99'] / 1000:,.1f} s after each PUT's commit"
           if lag["p50"] is not None else "")
        + f"; disagreements with the express lane: {authority['disagreements']}")
    if lag["p50"] is not None and lag["p50"] > 5000:
        say("   (most of that is the demo running while Spark started; a running pipeline decides in a few "
            "seconds, and consumers had each message from the express lane already)")


def show_table(data_dir: str, partitions: int, since_s: float) -> None:
    """The demo queue's rows of this run, read with delta-rs: the PUT log
    joined on seq with the delivery log (what the pipeline decided)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from storage import deltars
    from storage.tables import PartitionPaths

    since = datetime.fromtimestamp(since_s, timezone.utc)
    found: list[tuple[PartitionPaths, pa.Table]] = []
    for p in range(partitions):
        paths = PartitionPaths(data_dir, p)
        puts = deltars.try_open(paths.puts)
        if puts is None:
            continue
        rows = deltars.without_views(puts.to_pyarrow_table(
            columns=["guid", "seq", "properties", "payload", "put_time"],
            filters=[("domain", "=", "demo"), ("queue", "=", "orders"), ("put_time", ">=", since)]))
        # What is shown of the properties and the payload: one property, the size.
        rows = pa.table({"guid": rows["guid"], "seq": rows["seq"],
                         "region": pc.map_lookup(rows["properties"], "region", "first"),
                         "bytes": pc.binary_length(rows["payload"]), "put_time": rows["put_time"]})
        if rows.num_rows:
            found.append((paths, rows))
    if not found:
        say("   no rows of demo/orders from this run (the demo's PUTs failed?)")
        return
    for paths, rows in found:
        shown = rows.sort_by([("seq", "descending")]).slice(0, 5)
        decided: dict[int, dict[str, Any]] = {}
        delivery = deltars.try_open(paths.delivery)
        if delivery is not None:
            # The delivery log's rows of the rows shown (Acero joins no list column: a lookup instead).
            for row in deltars.without_views(delivery.to_pyarrow_table(
                    columns=["seq", "apps", "delivered_time"],
                    filters=[("domain", "=", "demo"), ("queue", "=", "orders"), ("put_time", ">=", since)])
                    ).filter(pc.field("seq").isin(shown["seq"].to_pylist())).to_pylist():
                decided[row["seq"]] = row
        say(f"   deltalake.DeltaTable('{_shown_path(paths.puts)}'): {rows.num_rows:,} rows of demo/orders "
            "from this run; the last 5, with what the delivery log says of them:")
        say(f"     {'guid':<32}  {'seq':>6}  {'region':<6}  {'bytes':>5}  {'put_time':<26}  "
            f"{'apps':<6}  delivered_time")
        for row in shown.to_pylist():
            d = decided.get(row["seq"], {})
            apps, delivered = d.get("apps"), d.get("delivered_time")
            say(f"     {row['guid'].hex().upper():<32}  {row['seq']:>6}  {row['region'] or '-':<6}  {row['bytes']:>5}  "
                f"{str(row['put_time'])[:26]:<26}  {','.join(apps or []) or '-':<6}  "
                f"{str(delivered)[:26] if delivered is not None else '(not yet decided)'}")
    say("   the same with Spark SQL (the pipeline's Spark Connect endpoint): .venv/bin/taproot sql "
        "\"SELECT guid_hex, seq, region, delivered_time "
        "FROM taproot_messages WHERE domain = 'demo' ORDER BY seq DESC LIMIT 5\"")


# -- taproot run ------------------------------------------------------------------------------------

def _shown_path(path: str) -> str:
    """Relative to the working directory when under it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _metrics(cluster: EmbeddedCluster, name: str) -> str:
    port = cluster.http_ports.get(name)
    return f", metrics http://127.0.0.1:{port}/metrics" if port else ""


def _hints(cluster: EmbeddedCluster, data_dir: str, config_file: str | None) -> list[str]:
    where = "" if os.path.abspath(cluster.config.data_dir) == cluster.data_dir else f" --data-dir {data_dir}"
    if config_file:
        where += f" --config {config_file}"
    hosts = f" --hosts {cluster.client_address}"
    return [
        f".venv/bin/taproot produce{hosts}{where} --uri {DEMO_URI} -n 5 -p region=US -v",
        f".venv/bin/taproot consume{hosts}{where} --uri {DEMO_URI} --timeout 10",
        f".venv/bin/taproot admin{where} queues       (depth, unconfirmed, consumers and rates; no Spark)",
        f".venv/bin/taproot sql{where} \"SELECT * FROM taproot_backlog\"   (Spark SQL over the tables; about a "
        "second once the pipeline serves them)",
    ]


def _start_serving(cluster: EmbeddedCluster) -> None:
    with Waiting("starting " + ", ".join([n.name for n in cluster.config.nodes] + cluster.proxy_names),
                 usually_s=3):
        cluster.start_nodes()
        for name in cluster.proxy_names:
            cluster.start_proxy(name=name)
    for name, address in cluster.node_addresses.items():
        say(f"   {name:<10} {address}  node ({cluster.config.partitions} partition(s)){_metrics(cluster, name)}")
    for name in cluster.proxy_names:
        say(f"   {name:<10} {cluster.proxy_addresses[name]}  proxy: clients connect here{_metrics(cluster, name)}")


def run_embedded(config_file: str | None, data_dir: str, demo_messages: int = 2000) -> int:
    terminal = Terminal()
    terminal.take()   # Ctrl-C stops this launcher (cleanly), not `make` around it
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: stop.set())   # the terminal closed: stop the roles all the same
    try:
        return _run(config_file, data_dir, demo_messages, stop)
    except KeyboardInterrupt:
        return 0
    finally:
        terminal.restore()


def _guarded(step: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """A demo step that fails says so and the cluster serves on."""
    try:
        return step(*args, **kwargs)
    except Exception as exc:
        say(f"   ! this step failed: {type(exc).__name__}: {exc}")
        return None


def _run(config_file: str | None, data_dir: str, demo_messages: int, stop: threading.Event) -> int:
    cluster = EmbeddedCluster(config_file, data_dir)
    say(f"Taproot embedded cluster: tables in {cluster.data_dir}, role logs in {cluster.state_dir}/logs")
    watch: RoleWatch | None = None
    try:
        step = _Steps(demo_messages > 0)
        step("nodes and proxies")
        try:
            _start_serving(cluster)
            pipeline = cluster.start_pipeline(wait=False)   # Spark starts while the cluster serves
        except ClusterStartError as exc:
            say(f"error: {exc}")
            return 1
        serving_at = time.monotonic()
        os.environ.update(cluster.client_env())   # the demo's sessions find the cluster's CA and token here
        say(f"\n== serving on {cluster.client_address}; from another terminal:")
        for hint in _hints(cluster, data_dir, config_file):
            say(f"   {hint}")
        if cluster.config.tls.enabled:
            say(f"   TLS on every link (the CA: {os.environ.get('TAPROOT_TLS_CA_FILE')})")
        if cluster.config.auth.enabled:
            say(f"   token auth on (this machine's token, every right: {os.environ.get('TAPROOT_TOKEN_FILE')}; "
                "`taproot auth add NAME --produce D` makes narrower ones)")
        exports = " ".join(f"{k}={_shown_path(v)}" for k, v in sorted(cluster.client_env().items()))
        if exports:
            say(f"   for the SDK (the README's snippets), in that terminal: export {exports}")
        watch = RoleWatch(cluster)
        watch.start()
        produced: loadgen.ProduceResult | None = None
        if demo_messages > 0 and not stop.is_set():
            step("demo traffic, delivered by the primary right after each commit (the pipeline is "
                     "still starting)")
            started = time.time()
            produced = _guarded(run_demo_traffic, cluster.client_address, demo_messages, serving_at=serving_at)
            if not stop.is_set():
                _guarded(run_fanout_demo, cluster.client_address)
        if not stop.is_set():
            step("the pipeline: Spark Structured Streaming, the authority on dedup and fanout")
            if not wait_for_pipeline(cluster, pipeline, stop):
                watch.check()
                return 0 if stop.is_set() else 1
            say(f"   pipeline   running{_metrics(cluster, 'pipeline')}")
            if produced is not None and not stop.is_set():
                _guarded(wait_for_decisions, cluster.data_dir, cluster.config.partitions, started, produced.acked,
                         stop)
                if not stop.is_set():
                    step("the demo queue as a Delta table, read with delta-rs (no JVM)")
                    _guarded(show_table, cluster.data_dir, cluster.config.partitions, started)
        if not stop.is_set():
            say(f"\n== serving on {cluster.client_address}, every role up (logs in {cluster.state_dir}/logs; "
                "errors show here too). Ctrl-C stops the cluster.")
        while not stop.is_set():
            if watch.failed.is_set():
                return 1
            stop.wait(0.5)
        return 0
    finally:
        # Stop the roles before anything else can fail: they run in sessions of
        # their own and would outlive the launcher.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if watch is not None:
            watch.stop()
        if cluster.processes:
            say()
            with Waiting("stopping the cluster (proxies, pipeline, nodes)", usually_s=5, indent=""):
                cluster.stop()
