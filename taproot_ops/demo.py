"""`taproot run`: start the embedded cluster, show it working, serve until Ctrl-C."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from taproot_ops import loadgen
from taproot_ops.embedded import ClusterStartError, EmbeddedCluster

DEMO_URI = "taproot://demo/orders"


def _say(text: str) -> None:
    try:
        print(text, flush=True)
    except (BrokenPipeError, OSError):
        pass  # the terminal or pipe went away (Ctrl-C on `make run | tee`): keep shutting down


def run_demo_traffic(address: str, count: int, data_dir: str | None = None,
                     partitions: int = 1) -> loadgen.ProduceResult:
    _say(f"\n== demo traffic: {count} messages of 1 KiB to {DEMO_URI} through {address}")
    ready = threading.Event()
    consumed: dict[str, loadgen.ConsumeResult] = {}
    consumer = threading.Thread(target=lambda: consumed.setdefault(
        "result", loadgen.consume(address, DEMO_URI, count, idle_timeout_s=120, ready=ready)), daemon=True)
    consumer.start()
    ready.wait(30)
    started = time.time()
    produced = loadgen.produce(address, DEMO_URI, count, size=1024, rate=1000,
                               properties={"source": "demo", "region": "EU"})
    consumer.join(300)
    result = consumed.get("result", loadgen.ConsumeResult())
    _say(f"   posted {produced.posted}, ACKed {produced.acked}, failed {produced.failed}")
    _say(f"   received {result.received} (redelivered {result.redelivered}), confirmed {result.received}")
    _say(f"   PUT->ACK  {loadgen.summary_ms(produced.ack_latency_ms)}")
    _say(f"   PUT->PUSH {loadgen.summary_ms(result.push_latency_ms)}")
    in_order = result.guids == produced.guids[: len(result.guids)]
    _say(f"   pushed in PUT order: {'yes' if in_order else 'no'}")
    if data_dir is not None:
        # Pushed by the primary's express lane; the pipeline decides again, as the authority.
        from taproot_ops.bench.authority import authority_lag
        _say("   waiting for the pipeline's decisions (the delivery log)...")
        authority = authority_lag(data_dir, partitions, "demo", started, produced.acked, timeout_s=180,
                                  progress=False)
        lag = authority["lag_ms"]
        _say(f"   the pipeline wrote {authority['rows']} delivery rows, "
             + (f"p50 {lag['p50']:,.0f} ms / p99 {lag['p99']:,.0f} ms after each PUT commit; "
                if lag["p50"] is not None else "")
             + f"disagreements with the express lane: {authority['disagreements']}")
    return produced


FANOUT_URI = "taproot://events/orders"


def run_fanout_demo(address: str) -> None:
    """Fanout in the `events` domain: apps billing, audit and eu (eu subscribes
    to region = 'EU'). Each app gets its messages and confirms on its own."""
    from taproot import Session

    _say(f"\n== fanout: 6 messages (3 EU, 3 US) to {FANOUT_URI}, apps billing, audit, eu (region = 'EU')")
    with Session([address]) as session:
        apps = {app: session.open_queue(f"{FANOUT_URI}?id={app}", read=True) for app in ("billing", "audit", "eu")}
        with session.open_queue(FANOUT_URI, write=True) as producer:
            for f in [producer.post(b"order %d" % i, properties={"region": "EU" if i % 2 else "US"})
                      for i in range(6)]:
                f.result(timeout=60)
        for app, queue in apps.items():
            want = 3 if app == "eu" else 6
            got: list[Any] = []
            deadline = time.monotonic() + 120
            while len(got) < want and time.monotonic() < deadline:
                message = queue.get(timeout_s=0.5)
                if message is not None:
                    got.append(message)
            queue.confirm(got)
            extra = list(queue.messages(timeout_s=0.5))
            regions = ",".join(str(m.properties.get("region")) for m in got + extra)
            _say(f"   ?id={app:<8} received {len(got) + len(extra)}: {regions}")
            queue.close()


def show_tables(data_dir: str) -> None:
    _say("\n== the queue as a Delta table, read by Spark")
    from pyspark.sql import functions as F

    from storage import spark as spark_factory
    from storage.tables import PartitionPaths

    spark = spark_factory.session("taproot-demo-reader")
    try:
        paths = PartitionPaths(data_dir, 0)
        puts = spark.read.format("delta").load(paths.puts)
        delivery = spark.read.format("delta").load(paths.delivery).select("seq", "apps", "delivered_time")
        _say(f"   spark.read.format('delta').load('{paths.puts}')  ->  {puts.count()} rows; joined on seq "
             f"with the delivery log (what the pipeline decided)")
        (puts.join(delivery, "seq", "left").orderBy(F.col("seq").desc())
         .select(F.upper(F.hex("guid")).alias("guid"), "seq", "domain", "queue",
                 F.col("properties")["region"].alias("region"), F.length("payload").alias("bytes"),
                 "apps", "put_time", "delivered_time")
         .show(5, truncate=False))
    finally:
        spark.stop()


def _metrics(cluster: EmbeddedCluster, name: str) -> str:
    port = cluster.http_ports.get(name)
    return f"\n{'':<14}metrics: http://127.0.0.1:{port}/metrics" if port else ""


def run_embedded(config_file: str | None, data_dir: str, demo_messages: int = 2000) -> int:
    cluster = EmbeddedCluster(config_file, data_dir)
    _say(f"Taproot embedded cluster, data in {cluster.data_dir} (logs in {cluster.data_dir}/logs)")
    started = time.monotonic()
    try:
        cluster.start_nodes()
        for name, address in cluster.node_addresses.items():
            _say(f"   {name:<10} {address}  (node; {cluster.config.partitions} partition(s) share the nodes' leases)"
                 f"{_metrics(cluster, name)}")
        for name in cluster.proxy_names:
            cluster.start_proxy(name=name)
            _say(f"   {name:<10} {cluster.proxy_addresses[name]}  (proxy: clients connect here)"
                 f"{_metrics(cluster, name)}")
        _say("   pipeline   starting Spark and warming it up (about 30 s on 2 cores)...")
        cluster.start_pipeline()
        _say(f"   pipeline   running  ({time.monotonic() - started:.0f} s to start everything)"
             f"{_metrics(cluster, 'pipeline')}")
    except ClusterStartError as exc:
        _say(f"error: {exc}")
        cluster.stop()
        return 1
    # This process's clients (the demo's sessions) find the cluster's CA and token here.
    env = cluster.client_env()
    os.environ.update(env)
    if cluster.config.tls.enabled:
        _say(f"   TLS on every link (CA {env.get('TAPROOT_TLS_CA_FILE')}"
             + (", mutual" if cluster.config.tls.client_certs else "") + ")")
    if cluster.config.auth.enabled:
        _say(f"   token auth on (this machine's token, every right: {env.get('TAPROOT_TOKEN_FILE')}; "
             "`taproot auth add NAME --produce D` makes narrower ones)")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if demo_messages > 0:
            run_demo_traffic(cluster.client_address, demo_messages, cluster.data_dir, cluster.config.partitions)
            run_fanout_demo(cluster.client_address)
            show_tables(cluster.data_dir)
        _say("\n== serving; from another terminal try:")
        where = "" if os.path.abspath(cluster.config.data_dir) == cluster.data_dir else f" --data-dir {data_dir}"
        if config_file:
            where += f" --config {config_file}"
        _say(f"   .venv/bin/taproot produce --hosts {cluster.client_address}{where} --uri {DEMO_URI} -n 5 "
             "-p region=US")
        _say(f"   .venv/bin/taproot consume --hosts {cluster.client_address}{where} --uri {DEMO_URI} --timeout 10")
        hosts = " ".join(f"--host {a}" for a in cluster.node_addresses.values())
        _say(f"   .venv/bin/taproot admin{where} {hosts} status   (and: queues, queue URI, domains, purge, stop)")
        _say("Ctrl-C stops the cluster.")
        while not stop.is_set():
            for role, process in cluster.processes.items():
                if process.popen.poll() is not None:
                    _say(f"error: {role} exited with {process.popen.returncode}; see {process.log_file}")
                    return 1
            stop.wait(1)
        return 0
    finally:
        # Stop the roles before anything else can fail: they run in sessions of
        # their own and would outlive the launcher.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _say("stopping...")
        cluster.stop()
        _say("stopped.")
